"""Limits (docs/selectors.md, compile-time errors): selector length, nesting depth and IN-list size
are refused with a SelectorError, never a RecursionError or a hang; what stays under them works."""

from __future__ import annotations

import pytest

from broker_filter.filters import LimitError, SelectorError, compile_selector
from broker_filter.amqp.message import Message

pytestmark = pytest.mark.timeout(60)

A1 = Message.from_json({"application_properties": {"a": 1, "s": "v9999"}})


def refused(text: str, dialect: str = "jms") -> SelectorError:
    with pytest.raises(SelectorError) as info:
        compile_selector(text, dialect=dialect)
    assert info.value.message
    return info.value


@pytest.mark.parametrize("dialect", ["jms", "artemis", "rocketmq"])
def test_selector_length(dialect: str) -> None:
    clause = "a = 1 OR "
    under = clause * ((64 * 1024 - 10) // len(clause)) + "a = 1"
    assert len(under) <= 64 * 1024
    assert compile_selector(under, dialect=dialect).evaluate(A1) is True
    over = "a = 1" + " " * (64 * 1024)
    assert isinstance(refused(over, dialect), LimitError)


@pytest.mark.parametrize(
    "shape",
    [lambda n: "NOT " * n + "a = 1", lambda n: "a = " + "1 + (" * n + "1" + ")" * n, lambda n: "".join(f"(a = {i} {'AND' if i % 2 else 'OR'} " for i in range(n)) + "TRUE" + ")" * n],
    ids=["NOT", "arithmetic", "alternating AND/OR"],
)
def test_nesting_depth(shape) -> None:
    f = compile_selector(shape(50))
    assert f.evaluate(A1) in (True, False, None)
    assert isinstance(refused(shape(300)), LimitError)
    refused(shape(5000))  # far beyond: still a clean error, no RecursionError


@pytest.mark.parametrize(
    "text,expected",
    [
        ("(" * 300 + "a = 1" + ")" * 300, True),
        ("(" * 20000 + "a = 1" + ")" * 20000, True),
        ("a = " + "-" * 300 + "1", True),
        ("a = " + "- " * 20001 + "1", False),
        ("a = " + "(" * 20000 + "1" + ")" * 20000, True),
    ],
    ids=["300 parentheses", "20000 parentheses", "300 minus", "20001 minus", "20000 value parentheses"],
)
def test_redundant_nesting_compiles_or_is_refused_cleanly(text: str, expected: bool) -> None:
    # Parentheses and sign chains add no depth to the tree; either reading is fine, a crash is not.
    try:
        f = compile_selector(text)
    except SelectorError:
        return
    assert f.evaluate(A1) is expected


def test_unbalanced_deep_input_is_a_clean_error() -> None:
    for text in ("(" * 100000, ")" * 1000, "NOT " * 20000, "a IN (" + "'x', " * 20000):
        refused(text)


def short_strings(n: int) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    out, width = [], 1
    while len(out) < n:
        for i in range(len(alphabet) ** width):
            word, k = "", i
            for _ in range(width):
                word, k = alphabet[k % len(alphabet)] + word, k // len(alphabet)
            out.append(word)
            if len(out) == n:
                break
        width += 1
    return out


def test_in_list_size() -> None:
    words = short_strings(10001)
    within = "s IN (" + ",".join(f"'{w}'" for w in words[:10000]) + ")"
    assert len(within) < 64 * 1024
    f = compile_selector(within)
    assert f.evaluate(Message.from_json({"application_properties": {"s": words[9999]}})) is True
    assert f.evaluate(Message.from_json({"application_properties": {"s": "nope"}})) is False
    over = "s IN (" + ",".join(f"'{w}'" for w in words) + ")"
    assert len(over) < 64 * 1024
    assert isinstance(refused(over), LimitError)


def test_long_flat_chains_are_not_nesting() -> None:
    ors = " OR ".join(f"a = {i}" for i in range(3000))
    assert compile_selector(ors).evaluate(A1) is True
    ands = " AND ".join(f"a <> {i}" for i in range(2, 3000))
    assert compile_selector(ands).evaluate(A1) is True
    strings = " OR ".join(f"s = 'v{i}'" for i in range(3000))
    assert compile_selector(strings).evaluate(Message.from_json({"application_properties": {"s": "v2999"}})) is True
