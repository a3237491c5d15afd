"""Selector conformance: every row of data/selectors.toml and data/type_matrix.toml, run against the
public API (compile_selector) and against the reference interpreter (parse_selector + reference)."""

from __future__ import annotations

import pytest

from broker_filter.filters import SelectorError, compile_selector, parse_selector
from broker_filter.filters import reference
from coretables import OUTCOMES, SelectorCase, params, selector_cases

CASES = selector_cases()


def check_error(case: SelectorCase, raised: SelectorError) -> None:
    assert isinstance(raised, ValueError)
    assert raised.condition == "amqp:invalid-field"
    assert raised.message, "a SelectorError explains itself"
    if case.at is not None:
        assert (raised.line, raised.column) == case.at, raised.describe()


def check_outcome(case: SelectorCase, got: bool | None, delivered: bool) -> None:
    if case.outcome == "X":
        assert got is False, f"an evaluation error makes the whole selector FALSE: got {got!r}"
    else:
        assert got is OUTCOMES[case.outcome], f"expected {case.outcome}, got {got!r}"
    assert delivered is (case.outcome == "T")


@pytest.mark.parametrize("case", params(CASES))
def test_compiled(case: SelectorCase) -> None:
    if case.outcome == "E":
        with pytest.raises(SelectorError) as info:
            compile_selector(case.selector, dialect=case.dialect)
        check_error(case, info.value)
        return
    f = compile_selector(case.selector, dialect=case.dialect)
    message = case.message()
    check_outcome(case, f.evaluate(message), f.matches(message))


@pytest.mark.parametrize("case", params(CASES, honour_xfail="errors"))
def test_reference(case: SelectorCase) -> None:
    if case.outcome == "E":
        with pytest.raises(SelectorError) as info:
            parse_selector(case.selector, dialect=case.dialect)
        check_error(case, info.value)
        return
    got = reference.evaluate(parse_selector(case.selector, dialect=case.dialect), case.message())
    check_outcome(case, got, got is True)


def test_tables_are_large_and_cover_every_dialect() -> None:
    assert len(CASES) > 1000
    for dialect in ("jms", "artemis", "rocketmq"):
        outcomes = {c.outcome for c in CASES if c.dialect == dialect}
        assert {"T", "F", "U", "E"} <= outcomes, dialect
    assert any(c.outcome == "X" for c in CASES)


@pytest.mark.parametrize("dialect", ["jms", "artemis", "rocketmq", "amqp-sql"])
def test_prepare_builds_the_parse_tables_a_dialect_uses(dialect):
    """The daemon calls `prepare` before serving, so its first attach with a selector does not
    build the tables: after it, parsing in that dialect builds nothing."""
    from broker_filter.filters.parser import _grammar_variant, parse, prepare

    prepare(dialect)
    before = _grammar_variant.cache_info()
    parse("a = 1 AND b IS NULL", dialect)
    after = _grammar_variant.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)
