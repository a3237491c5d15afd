"""Hypothesis strategies for selectors (as text, per dialect) and typed messages.

Selectors are generated from the grammar in docs/selectors.md, mostly well typed (so that most of
them compile) but with identifiers whose run-time type is anything, literals of every form
(hex, octal, L suffix, exponent, `7.`, `.5`, doubled quotes) and some deliberately mistyped
expressions.  Messages carry the same identifiers with values of every AMQP type, including NULL,
NaN, infinities, -0.0, the 32- and 64-bit boundaries and strings that parse as numbers or booleans.
"""

from __future__ import annotations

import math
import uuid

from hypothesis import strategies as st

from broker_filter.amqp import types as t
from broker_filter.amqp.message import Header, Message, Properties

DIALECTS = ("jms", "artemis", "rocketmq")
PROPERTY_NAMES = ("a", "b", "n", "s", "x", "JMSFoo")
HEADER_NAMES = {
    "jms": ("JMSPriority", "JMSType", "JMSDeliveryMode", "JMSRedelivered", "JMSTimestamp", "JMSExpiration",
            "JMSMessageID", "JMSXDeliveryCount", "JMSXGroupSeq"),
    "artemis": ("JMSPriority", "JMSType", "AMQPriority", "AMQDurable", "AMQExpiration", "AMQTimestamp",
                "AMQSize", "AMQGroupID", "AMQUserID"),
    "rocketmq": ("TAGS",),
}
ANNOTATION_NAMES = ("a", "route")

# ---------------------------------------------------------------------------------------- values
INT32_EDGES = (-(2**31), -(2**31) + 1, -1, 0, 1, 2**31 - 2, 2**31 - 1)
LONG_EDGES = (-(2**63), -(2**63) + 1, -(2**31) - 1, 2**31, 2**63 - 2, 2**63 - 1)
NUMERIC_TEXT = ("5", "-3", "0", "12", "1.5", "-0.5", "2147483648", "1e3", ".5", "7.")
OTHER_TEXT = ("", "abc", "x", "true", "false", "a%", "a_b", "TagA", "TagB", "it's", "é")


def small_ints() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-20, 20), st.sampled_from(INT32_EDGES))


def texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NUMERIC_TEXT + OTHER_TEXT),
        st.text(alphabet="abx%_!'5.-", max_size=6),
    )


def doubles() -> st.SearchStrategy[float]:
    return st.one_of(
        st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 2)),
        st.sampled_from((0.0, -0.0, 0.5, 2.5, 5.0, math.nan, math.inf, -math.inf, 1e308, 2.0**63)),
    )


def amqp_values() -> st.SearchStrategy:
    """A value of any AMQP type that may sit in application properties (None included)."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(0, 255).map(t.ubyte),
        st.integers(0, 65535).map(t.ushort),
        st.one_of(st.integers(0, 10), st.just(2**32 - 1)).map(t.uint),
        st.one_of(st.integers(0, 10), st.sampled_from((2**63 - 1, 2**63, 2**64 - 1))).map(t.ulong),
        st.integers(-128, 127).map(t.byte),
        st.integers(-(2**15), 2**15 - 1).map(t.short),
        small_ints().map(t.int32),
        st.one_of(small_ints(), st.sampled_from(LONG_EDGES)),
        st.integers(0, 10**13).map(t.timestamp),
        st.one_of(st.sampled_from((0.5, 1.5, 5.0, 0.1, math.nan, math.inf)), st.integers(-20, 20).map(float)).map(t.float32),
        doubles(),
        st.sampled_from(("5", "2.5", "-1", "1E+2")).map(t.decimal64),
        st.just(t.decimal32("5")),
        st.just(t.decimal128("0.1")),
        texts(),
        texts().map(lambda s: t.symbol(s) if s.isascii() else t.symbol("y")),
        st.sampled_from("5ax").map(t.char),
        st.binary(max_size=3),
        st.just(uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")),
        st.just(t.Described(t.symbol("x:y"), "5")),
    )


@st.composite
def messages(draw, odd: bool = False) -> Message:
    """A typed message; with `odd`, also values the JSON form would refuse (lists, maps, bad keys)."""
    values = amqp_values()
    if odd:
        values = st.one_of(values, st.lists(values, max_size=2), st.dictionaries(st.text(max_size=2), values, max_size=2))
    app = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(PROPERTY_NAMES + ("foo-bar",)), values, max_size=6)))
    header = draw(
        st.one_of(
            st.none(),
            st.builds(
                Header,
                durable=st.one_of(st.none(), st.booleans()),
                priority=st.one_of(st.none(), st.integers(0, 9).map(t.ubyte)),
                delivery_count=st.one_of(st.none(), st.sampled_from((0, 1, 5)).map(t.uint)),
            ),
        )
    )
    subject = st.one_of(st.none(), st.sampled_from(("TagA", "TagB", "order", "", "5")))
    props = draw(
        st.one_of(
            st.none(),
            st.builds(
                Properties,
                subject=subject,
                message_id=st.one_of(st.none(), st.just("ID:1"), st.integers(0, 9).map(t.ulong),
                                     st.just(uuid.UUID(int=7)), st.just(b"\x0a\xff")),
                creation_time=st.one_of(st.none(), st.integers(0, 10**13).map(t.timestamp)),
                absolute_expiry_time=st.one_of(st.none(), st.integers(0, 10).map(t.timestamp)),
                group_id=st.one_of(st.none(), st.just("g")),
                group_sequence=st.one_of(st.none(), st.integers(0, 3).map(t.uint)),
                user_id=st.one_of(st.none(), st.just(b"bob"), st.just(b"\xff")),
            ),
        )
    )
    annotation_keys = st.sampled_from(ANNOTATION_NAMES + ("x-opt-jms-type",)).map(t.symbol)
    if odd:
        annotation_keys = st.one_of(annotation_keys, st.integers(0, 3).map(t.ulong))
    annotations = draw(st.one_of(st.none(), st.dictionaries(annotation_keys, values, max_size=3)))
    m = Message(header=header, message_annotations=annotations, properties=props, application_properties=app)
    m.encoded_size = draw(st.one_of(st.none(), st.integers(0, 5000)))
    return m


# ---------------------------------------------------------------------------------------- selectors
def _string_literal(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def string_literals() -> st.SearchStrategy[str]:
    return texts().map(_string_literal)


def exact_literals() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(0, 20).map(str),
        st.sampled_from(("2147483647", "2147483648", "9223372036854775807", "0x1F", "0X10", "017", "0", "5L", "7l", "0x7FFFFFFFL")),
    )


def approximate_literals() -> st.SearchStrategy[str]:
    return st.sampled_from(("7E3", "7e-1", "7.", ".5", "2.5", "1.5e-3", "0.0", "5.0", "1.5F", "2.5d", "1E308"))


def identifiers(dialect: str) -> st.SearchStrategy[str]:
    names = st.sampled_from(PROPERTY_NAMES + HEADER_NAMES[dialect])
    if dialect == "artemis":
        return st.one_of(names, st.sampled_from(ANNOTATION_NAMES).map(lambda n: "m." + n), st.just('"foo-bar"'), st.just('"a"'))
    return names


def _paren(s: str) -> str:
    return f"({s})"


def numeric_expressions(dialect: str) -> st.SearchStrategy[str]:
    leaves = st.one_of(identifiers(dialect), exact_literals(), approximate_literals())

    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from("+-*/"), inner).map(lambda p: f"{p[0]} {p[1]} {p[2]}"),
            st.tuples(st.sampled_from(("-", "+", "- ")), inner).map(lambda p: p[0] + _paren(p[1])),
            inner.map(_paren),
        )

    return st.recursive(leaves, extend, max_leaves=4)


def value_operands(dialect: str) -> st.SearchStrategy[str]:
    return st.one_of(numeric_expressions(dialect), string_literals(), st.sampled_from(("TRUE", "FALSE")), identifiers(dialect))


def predicates(dialect: str) -> st.SearchStrategy[str]:
    ident = identifiers(dialect)
    num = numeric_expressions(dialect)
    operand = value_operands(dialect)
    negation = st.sampled_from(("", "NOT "))
    choices = [
        st.tuples(operand, st.sampled_from(("=", "<>", "<", "<=", ">", ">=")), operand).map(lambda p: f"{p[0]} {p[1]} {p[2]}"),
        st.tuples(ident, st.sampled_from(("=", "<>")), string_literals()).map(lambda p: f"{p[0]} {p[1]} {p[2]}"),
        st.tuples(num, negation, num, num).map(lambda p: f"{p[0]} {p[1]}BETWEEN {p[2]} AND {p[3]}"),
        st.tuples(ident, negation).map(lambda p: f"{p[0]} IS {p[1]}NULL"),
        st.tuples(num, negation).map(lambda p: f"{p[0]} IS {p[1]}NULL"),
        ident,
        st.sampled_from(("TRUE", "FALSE")),
    ]
    in_items = st.lists(string_literals(), min_size=1, max_size=4)
    if dialect == "rocketmq":
        in_items = st.one_of(in_items, st.lists(st.one_of(exact_literals(), approximate_literals()), min_size=1, max_size=4))
        choices.append(
            st.tuples(ident, negation, st.sampled_from(("CONTAINS", "STARTSWITH", "ENDSWITH")), string_literals()).map(
                lambda p: f"{p[0]} {p[1]}{p[2]} {p[3]}"
            )
        )
    else:
        pattern = st.text(alphabet="ab%_!x", max_size=5)
        choices.append(
            st.tuples(ident, negation, pattern, st.sampled_from(("", " ESCAPE '!'"))).map(
                lambda p: f"{p[0]} {p[1]}LIKE {_string_literal(p[2])}{p[3] if not p[2].endswith('!') else ''}"
            )
        )
    choices.append(st.tuples(ident, negation, in_items).map(lambda p: f"{p[0]} {p[1]}IN ({', '.join(p[2])})"))
    return st.one_of(*choices)


def conditions(dialect: str) -> st.SearchStrategy[str]:
    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(("AND", "OR", "and", "Or")), inner).map(lambda p: f"{p[0]} {p[1]} {p[2]}"),
            inner.map(lambda s: f"NOT {_paren(s)}"),
            inner.map(_paren),
        )

    return st.recursive(predicates(dialect), extend, max_leaves=5)


@st.composite
def selectors(draw, dialect: str) -> str:
    """Selector text for `dialect` (it may still be refused: mistyped ones are generated too)."""
    if dialect == "rocketmq" and draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.just("*"), st.lists(st.sampled_from(("TagA", "TagB", "order")), min_size=1, max_size=3).map(" || ".join)))
    text = draw(conditions(dialect))
    if dialect == "artemis":
        prefix = draw(st.sampled_from(("", "", "convert_string_expressions:", "hyphenated_props:")))
        text = prefix + text
    return text


def tokens_soup() -> st.SearchStrategy[str]:
    """Text made of selector tokens and junk, for the parser fuzz."""
    token = st.one_of(
        st.sampled_from(
            ("a", "b", "JMSType", "m.a", '"q', '"x"', "'", "''", "'x'", "(", ")", ",", "=", "<>", "<", ">=", "+", "-", "*", "/",
             "NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "false", "0x", "0x1F", "017", "1L",
             "7E", "7E3", ".", ".5", "7.", "9223372036854775808", "||", "*", "CONTAINS", "convert_string_expressions:",
             "hyphenated_props:", "-", "\n", " ", "\t", "\\", "%", "_", "$", "#", "@", "\x00", "é")
        ),
        st.text(max_size=3),
    )
    return st.lists(token, max_size=30).map(" ".join) | st.lists(token, max_size=30).map("".join) | st.text(max_size=40)


def filter_set_junk() -> st.SearchStrategy:
    """Arbitrary structures of the kinds proton decodes, for the filter-set decoder fuzz."""
    descriptors = st.one_of(
        st.sampled_from(
            ("apache.org:selector-filter:string", "apache.org:jms-selector-filter:string", "apache.org:no-local-filter:list",
             "apache.org:legacy-amqp-direct-binding:string", "apache.org:legacy-amqp-topic-binding:string",
             "apache.org:legacy-amqp-headers-binding:map", "apache.org:or-filter:list", "apache.org:and-filter:list",
             "apache.org:not-filter:list", "apache.org:xquery-filter:string", "x")
        ).map(t.symbol),
        st.integers(0, 9).map(lambda c: t.ulong(0x0000468C00000000 + c)),
        st.integers(0, 2**64 - 1).map(t.ulong),
        st.text(max_size=5),
        st.none(),
    )
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
        st.sampled_from(("a = 1", "a =", "#", "*.x", "NoLocalFilter{}", "x-match", "any", "all", "0x0000468C:0x00000004")),
        st.binary(max_size=3), st.text(max_size=4).filter(str.isascii).map(t.symbol), st.integers(0, 9).map(t.ulong),
    )

    def extend(inner):
        return st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.one_of(st.text(max_size=4), st.text(max_size=4).filter(str.isascii).map(t.symbol)), inner, max_size=3),
            st.builds(t.Described, descriptors, inner),
            st.fixed_dictionaries({"descriptor": st.one_of(descriptors, st.text(max_size=12)), "value": inner}),
        )

    return st.recursive(scalars, extend, max_leaves=10)
