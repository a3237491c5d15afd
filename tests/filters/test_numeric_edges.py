"""Numeric edge cases found by differential testing against the Spark backend and the reference."""

import pytest

from broker_filter.amqp import types as t
from broker_filter.filters import compile_selector, parse_selector
from broker_filter.amqp.message import Message


def ev(text, dialect="jms", **ap):
    return compile_selector(text, dialect).evaluate(Message(application_properties=ap))


def test_negative_zero_and_zero_are_different_constants():
    assert ev("a * 0.0 = 0 AND a / -0.0 < 0", a=t.int32(1)) is True
    assert ev("x = 0.0 OR a / -0.0 < 0", a=t.int32(1)) is True


def test_rocketmq_string_in_list_on_a_number_is_an_error_even_beside_true():
    assert ev("a IN ('1') OR TRUE", "rocketmq", a=t.ulong(34287)) is False


@pytest.mark.parametrize("s", [" 7", "NaN", "Infinity", "7", "7.5"])
def test_artemis_converted_strings_compute(s):
    assert ev("convert_string_expressions:0 + s IS NULL", "artemis", s=s) is False


@pytest.mark.parametrize("s", ["NaNd", "Infinityf", "\u0661"])
def test_java_rejects_suffixed_nan_and_non_ascii_digits(s):
    assert ev("convert_string_expressions:0 + s IS NULL", "artemis", s=s) is True


def test_negated_literals_keep_their_type_and_wrap_like_java():
    assert parse_selector("-2147483648 = a").expr.left.type == "long"
    assert ev("-(2147483648) - a = -2147483649", a=1) is True  # long arithmetic, no 32-bit wrap
    assert ev("-(-2147483648) = 2147483648") is True  # a long: no 32-bit wrap
    lit = parse_selector("-(-9223372036854775808) = a").expr.left
    assert lit.value == -(2**63) and lit.type == "long"


def test_ulong_above_the_long_range_reads_as_java_does():
    assert ev("a < 0", a=t.ulong(2**63)) is True
    assert ev("a = -1", a=t.ulong(2**64 - 1)) is True
    assert ev("a > 0", a=t.ulong(5)) is True
