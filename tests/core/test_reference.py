"""The reference interpreter on hand-built ASTs: it must be right before it can judge anything."""

from __future__ import annotations

import math

import pytest

from broker_filter.amqp import types as t
from broker_filter.filters import ast, reference
from broker_filter.amqp.message import Header, Message, Properties

T, F, U = True, False, None


def lit(value, kind=None):
    if kind is None:
        kind = {str: "string", bool: "boolean", float: "double"}.get(type(value), "int")
    return ast.Literal(value, kind)


def prop(name):
    return ast.Ident(name, "property", name)


def header(name):
    return ast.Ident(name, "header", name)


def cmp(op, left, right):
    return ast.Binary(op, left, right)


def run(expr, message=None, dialect="jms", convert=False):
    return reference.evaluate(ast.Selector(expr, dialect, convert), message or Message())


def props(**values):
    return Message(application_properties=values)


@pytest.mark.parametrize(
    "a,b,conj,disj",
    [(T, T, T, T), (T, F, F, T), (T, U, U, T), (F, F, F, F), (F, U, F, U), (U, U, U, U)],
)
def test_kleene_tables(a, b, conj, disj):
    assert reference.logical_and(a, b) is conj and reference.logical_and(b, a) is conj
    assert reference.logical_or(a, b) is disj and reference.logical_or(b, a) is disj


def test_not_table():
    assert [reference.logical_not(v) for v in (T, F, U)] == [F, T, U]


@pytest.mark.parametrize(
    "n,bits,wrapped",
    [(2**31, 32, -(2**31)), (-(2**31) - 1, 32, 2**31 - 1), (2**32 - 2, 32, -2), (2**63, 64, -(2**63)), (5, 32, 5), (-5, 64, -5)],
)
def test_wrap(n, bits, wrapped):
    assert reference.wrap(n, bits) == wrapped


@pytest.mark.parametrize(
    "text,pattern,escape,found",
    [
        ("abc", "abc", None, T), ("abc", "a%", None, T), ("abc", "%c", None, T), ("abc", "%", None, T),
        ("", "%", None, T), ("", "_", None, F), ("", "", None, T), ("a", "", None, F), ("abc", "a_c", None, T),
        ("abc", "a_", None, F), ("a%", "a!%", "!", T), ("ab", "a!%", "!", F), ("a_", "a!_", "!", T),
        ("a!", "a!!", "!", T), ("a\nb", "a%b", None, T), ("a.c", "a.c", None, T), ("abc", "a.c", None, F),
        ("xaybzc", "%a%b%c", None, T), ("xaybz", "%a%b%c", None, F), ("aaa", "a*", None, F),
        ("abcabc", "%abc", None, T), ("ab", "%_%_%", None, T), ("a", "%_%_%", None, F),
    ],
)
def test_like_match(text, pattern, escape, found):
    assert reference.like_match(text, pattern, escape) is found


def test_like_match_is_polynomial_on_many_wildcards():
    assert reference.like_match("a" * 400, "%a" * 40 + "%b", None) is False


@pytest.mark.parametrize("text,n", [("12", 12), ("-3", -3), ("+7", 7), ("1.5", None), ("", None), (" 1", None), ("1_0", None), ("9223372036854775808", None)])
def test_parse_integer(text, n):
    assert reference.parse_integer(text) == n


@pytest.mark.parametrize(
    "text,d",
    [("1.5", 1.5), ("-2", -2.0), (".5", 0.5), ("7.", 7.0), ("1e3", 1000.0), ("abc", None), ("inf", None),
     ("nan", None), ("1_0", None), (" 5.0\n", 5.0), ("5f", 5.0), ("2.5D", 2.5), ("-Infinity", -math.inf),
     ("1E400", math.inf), ("e5", None), ("1e", None), ("", None), (".", None), ("0x10", None)],
)
def test_parse_double(text, d):
    assert reference.parse_double(text) == d


def test_parse_double_nan():
    assert math.isnan(reference.parse_double("+NaN"))


def test_value_kinds_follow_the_jms_type_table():
    kinds = [
        (t.ubyte(1), "int"), (t.ushort(1), "int"), (t.byte(1), "int"), (t.short(1), "int"), (t.int32(1), "int"),
        (t.uint(1), "long"), (t.ulong(1), "long"), (1, "long"), (t.long(1), "long"), (t.timestamp(1), "long"),
        (t.float32(1.0), "double"), (1.0, "double"), (t.decimal64("1"), "double"), ("s", "string"),
        (t.symbol("s"), "string"), (True, "boolean"), (t.char("c"), "opaque"), (b"\x00", "opaque"),
    ]
    for v, kind in kinds:
        got = reference.value_of(reference.jms_value(v))
        assert got.kind == kind, (v, got)


def test_empty_selector_selects_everything():
    assert reference.evaluate(ast.Selector(None), Message()) is True


def test_comparisons_per_dialect():
    m = props(a=1, s="x")
    for op, expected in (("=", F), ("<>", F), ("<", F)):
        assert run(cmp(op, prop("s"), lit(1)), m) is expected
    assert run(cmp("<>", prop("s"), lit(1)), m, "artemis") is T
    assert run(cmp("<>", prop("s"), lit(1)), m, "rocketmq") is F  # error: not delivered
    assert run(cmp("=", prop("a"), lit("1")), m, "rocketmq") is T  # coercion
    assert run(cmp("=", prop("missing"), lit(1)), m) is U
    # Artemis: a NULL left operand alone is UNKNOWN, a NULL right operand alone FALSE, both TRUE
    assert run(cmp("=", prop("missing"), lit(1)), m, "artemis") is U
    assert run(cmp("<>", prop("missing"), lit(1)), m, "artemis") is U
    assert run(cmp("=", lit(1), prop("missing")), m, "artemis") is F
    assert run(cmp("<>", lit(1), prop("missing")), m, "artemis") is T
    assert run(cmp("=", prop("missing"), prop("other")), m, "artemis") is T
    assert run(cmp("<>", prop("missing"), prop("other")), m, "artemis") is F
    assert run(cmp("<", prop("missing"), lit(1)), m, "artemis") is U
    # RocketMQ: two strings order as doubles; a string left of a boolean is Boolean.valueOf
    m = props(x="20", y="10", z="abc", w="TRUE", v="yes")
    assert run(cmp(">", prop("x"), prop("y")), m, "rocketmq") is T
    assert run(cmp("<=", prop("x"), prop("y")), m, "rocketmq") is F
    assert run(cmp(">", prop("z"), prop("y")), m, "rocketmq") is F  # error: not delivered
    assert run(cmp("=", prop("w"), lit(True)), m, "rocketmq") is T
    assert run(cmp("=", prop("v"), lit(False)), m, "rocketmq") is T
    assert run(ast.Unary("NOT", cmp("=", lit(True), prop("w"))), m, "rocketmq") is F  # boolean left: error


def test_rocketmq_error_anywhere_is_not_delivered():
    m = props(a=1, b="x")
    bad = cmp(">", prop("b"), lit(1))
    good = cmp("=", prop("a"), lit(1))
    for expr in (ast.Binary("OR", good, bad), ast.Binary("OR", bad, good), ast.Unary("NOT", bad)):
        assert run(expr, m, "rocketmq") is F
    assert run(ast.Binary("OR", good, bad), m, "jms") is T


def test_arithmetic_widths_and_division():
    m = props(i=t.int32(2**31 - 1), l=2**63 - 1, five=5, neg=-7)
    assert run(cmp("<", ast.Binary("+", prop("i"), lit(1)), lit(0)), m) is T
    assert run(cmp(">", ast.Binary("+", prop("i"), lit(1, "long")), lit(0)), m) is T
    assert run(cmp("<", ast.Binary("+", prop("l"), lit(1)), lit(0)), m) is T
    for dialect in ("jms", "artemis"):  # `/` divides as doubles in every Java peer
        assert run(cmp("=", ast.Binary("/", prop("neg"), lit(2)), lit(-3.5)), m, dialect) is T
        assert run(cmp("=", ast.Binary("/", prop("five"), lit(2)), lit(2.5)), m, dialect) is T
        assert run(ast.IsNull(ast.Binary("/", prop("five"), lit(0))), m, dialect) is F
        assert run(cmp(">", ast.Binary("/", prop("five"), lit(0)), lit(1e308)), m, dialect) is T
    assert run(cmp(">", ast.Binary("/", prop("five"), lit(0.0)), lit(1e308)), m) is T


def test_float_divide_follows_ieee():
    assert reference.float_divide(1.0, 0.0) == math.inf
    assert reference.float_divide(-1.0, 0.0) == -math.inf
    assert reference.float_divide(1.0, -0.0) == -math.inf
    assert math.isnan(reference.float_divide(0.0, 0.0))
    assert math.isnan(reference.float_divide(math.nan, 0.0))


def test_between_in_like_per_dialect():
    m = props(n=5, s="abc")
    assert run(ast.Between(prop("n"), lit(1), lit(9)), m) is T
    assert run(ast.Between(prop("s"), lit(1), lit(9), negated=True), m) is F
    assert run(ast.Between(prop("s"), lit(1), lit(9), negated=True), m, "artemis") is T
    assert run(ast.In(prop("s"), (lit("abc"),)), m) is T
    assert run(ast.In(prop("n"), (lit("5"),), negated=True), m) is F
    assert run(ast.In(prop("n"), (lit("5"),), negated=True), m, "artemis") is T
    assert run(ast.In(prop("n"), (lit(4), lit(5)),), m, "rocketmq") is T
    assert run(ast.Like(prop("s"), "a%"), m) is T
    assert run(ast.Like(prop("n"), "5", negated=True), m) is F
    assert run(ast.Like(prop("n"), "5", negated=True), m, "artemis") is T
    assert run(ast.Like(prop("missing"), "5"), m) is U


def test_string_tests_and_tags():
    m = Message(properties=Properties(subject="TagA"), application_properties={"s": "abcd", "n": 1})
    assert run(ast.StringTest("CONTAINS", prop("s"), "bc"), m, "rocketmq") is T
    assert run(ast.StringTest("STARTSWITH", prop("s"), "bc", negated=True), m, "rocketmq") is T
    assert run(ast.StringTest("ENDSWITH", prop("s"), "cd"), m, "rocketmq") is T
    assert run(ast.StringTest("CONTAINS", prop("n"), "1"), m, "rocketmq") is F
    assert run(ast.StringTest("CONTAINS", prop("missing"), "1"), m, "rocketmq") is F
    assert run(ast.StringTest("CONTAINS", prop("missing"), "1", negated=True), m, "rocketmq") is F
    assert run(ast.StringTest("CONTAINS", prop("n"), "1", negated=True), m, "rocketmq") is F
    for op in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
        for negated in (False, True):
            assert run(ast.StringTest(op, prop("s"), "", negated), m, "rocketmq") is F
    assert run(ast.Tags(("TagB", "TagA")), m, "rocketmq") is T
    assert run(ast.Tags(("TagB",)), m, "rocketmq") is F
    assert run(ast.Tags(("TagB",)), Message(), "rocketmq") is F
    assert run(ast.Tags(None), Message(), "rocketmq") is T


def test_headers_and_annotations():
    m = Message(
        header=Header(durable=True, priority=t.ubyte(7), delivery_count=t.uint(1)),
        properties=Properties(subject="order", message_id=t.ulong(3)),
        message_annotations={t.symbol("route"): "eu"},
    )
    assert run(cmp("=", header("JMSPriority"), lit(7)), m) is T
    assert run(cmp("=", header("JMSDeliveryMode"), lit("PERSISTENT")), m) is T
    assert run(header("JMSRedelivered"), m) is T
    assert run(cmp("=", header("JMSMessageID"), lit("ID:AMQP_ULONG:3")), m) is T
    assert run(cmp("=", header("JMSType"), lit("order")), m) is T
    assert run(cmp("=", header("JMSPriority"), lit(4)), Message()) is T
    assert run(cmp("=", ast.Ident("route", "annotation", "route"), lit("eu")), m, "artemis") is T


def test_convert_strings():
    m = props(age="21", flag="true", word="x")
    assert run(cmp(">", prop("age"), lit(18)), m, "artemis") is F
    assert run(cmp(">", prop("age"), lit(18)), m, "artemis", convert=True) is T
    assert run(cmp("=", ast.Binary("+", lit(1), prop("age")), lit(22)), m, "artemis", convert=True) is T
    # a string on the left of `+` concatenates, converted or not (createPlus tests for a String first)
    assert run(cmp("=", ast.Binary("+", prop("age"), lit(1)), lit(211)), m, "artemis", convert=True) is T
    assert run(cmp("=", prop("flag"), lit(True)), m, "artemis", convert=True) is T
    assert run(cmp("=", prop("word"), lit(1)), m, "artemis", convert=True) is F


@pytest.mark.parametrize(
    "value,text",
    [
        ("b", "b"), (True, "true"), (t.int32(-5), "-5"), (2**63 - 1, "9223372036854775807"),
        (t.ulong(2**64 - 1), "-1"), (1.0, "1.0"), (1e7, "1.0E7"), (9999999.0, "9999999.0"), (0.001, "0.001"),
        (0.0001, "1.0E-4"), (-1.5e-5, "-1.5E-5"), (123.456, "123.456"), (math.nan, "NaN"), (-math.inf, "-Infinity"),
        (-0.0, "-0.0"), (t.float32(0.1), "0.1"), (t.float32(16777216.0), "1.6777216E7"), (t.decimal64("1.5"), "1.5"),
    ],
)
def test_plus_with_a_string_on_the_left_concatenates_java_text(value, text):
    m = props(s="x", v=value)
    assert run(cmp("=", ast.Binary("+", prop("s"), prop("v")), lit("x" + text)), m) is T
    assert run(cmp("=", ast.Binary("+", lit("x"), prop("v")), lit("x" + text)), m, "artemis") is T


def test_plus_concatenation_nulls_and_numbers_on_the_left():
    m = props(s="x", n=1, c=t.char("c"))
    assert run(ast.IsNull(ast.Binary("+", prop("s"), prop("missing"))), m) is T
    assert run(ast.IsNull(ast.Binary("+", prop("missing"), prop("s"))), m) is T
    assert run(ast.IsNull(ast.Binary("+", prop("s"), prop("c"))), m) is T  # char has no JMS type
    assert run(ast.IsNull(ast.Binary("+", prop("n"), prop("s"))), m) is T  # a number left: UNKNOWN
    assert run(cmp("=", ast.Binary("+", ast.Binary("+", prop("s"), prop("n")), prop("s")), lit("x1x")), m) is T


def test_bare_values_as_conditions():
    m = props(b=True, s="x", n=1)
    assert run(prop("b"), m) is T
    assert run(prop("s"), m) is F
    assert run(prop("n"), m) is F
    assert run(prop("missing"), m) is U
    assert run(ast.Unary("NOT", prop("s")), m) is T


def test_numbers_compare_as_java_does():
    nan = math.nan
    assert reference.numeric_compare("=", nan, nan) is T
    assert reference.numeric_compare("<>", nan, nan) is F
    assert reference.numeric_compare(">", nan, math.inf) is T
    assert reference.numeric_compare("<", 5, nan) is T
    assert reference.numeric_compare("=", -0.0, 0.0) is T
    assert reference.numeric_compare("=", 2**63 - 1, 2.0**63) is T  # the long is widened to double
    assert reference.numeric_compare("=", 2**53 + 1, 2.0**53) is T
    assert reference.numeric_compare("=", 2**53 + 1, 2**53) is F
    assert reference.numeric_compare("<", 2**53, 2**53 + 1) is T
