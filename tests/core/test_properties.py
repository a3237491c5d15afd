"""Laws of the selector language, checked on generated selectors and messages (strategies.py):
the canonical form round-trips, evaluation never raises, NOT/AND/OR obey three-valued logic, and the
compiled evaluator agrees with the reference interpreter in every dialect."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_filter.filters import SelectorError, compile_selector, parse_selector, reference, render_selector
from strategies import DIALECTS, conditions, messages, selectors

EXAMPLES = int(os.environ.get("BROKER_FILTER_PROPERTY_EXAMPLES", "60"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def compiled_or_none(text: str, dialect: str):
    try:
        return compile_selector(text, dialect=dialect)
    except SelectorError:
        return None


def same_tree(a, b) -> bool:
    return (a.expr, a.dialect, a.convert_strings, a.hyphenated) == (b.expr, b.dialect, b.convert_strings, b.hyphenated)


@pytest.mark.parametrize("dialect", DIALECTS)
@PROPERTY
@given(data=st.data())
def test_render_parse_round_trip(dialect: str, data) -> None:
    text = data.draw(selectors(dialect))
    try:
        tree = parse_selector(text, dialect=dialect)
    except SelectorError:
        return
    canonical = render_selector(tree)
    again = parse_selector(canonical, dialect=dialect)
    assert same_tree(again, tree), canonical
    assert render_selector(again) == canonical  # the canonical form is a fixed point


@pytest.mark.parametrize("dialect", DIALECTS)
@PROPERTY
@given(data=st.data())
def test_compiled_agrees_with_reference(dialect: str, data) -> None:
    text = data.draw(selectors(dialect))
    f = compiled_or_none(text, dialect)
    if f is None:
        with pytest.raises(SelectorError):
            parse_selector(text, dialect=dialect)
        return
    tree = parse_selector(text, dialect=dialect)
    for _ in range(3):
        message = data.draw(messages())
        expected = reference.evaluate(tree, message)
        got = f.evaluate(message)
        assert got is expected, f"{text!r} on {message!r}: compiled {got!r}, reference {expected!r}"
        assert f.matches(message) is (expected is True)


@pytest.mark.parametrize("dialect", DIALECTS)
@PROPERTY
@given(data=st.data())
def test_evaluation_never_raises(dialect: str, data) -> None:
    text = data.draw(selectors(dialect))
    f = compiled_or_none(text, dialect)
    if f is None:
        return
    message = data.draw(messages(odd=True))
    assert f.evaluate(message) in (True, False, None)
    assert f.matches(message) in (True, False)
    assert reference.evaluate(parse_selector(text, dialect=dialect), message) in (True, False, None)


@pytest.mark.parametrize("dialect", DIALECTS)
@PROPERTY
@given(data=st.data())
def test_three_valued_laws(dialect: str, data) -> None:
    p = data.draw(conditions(dialect))
    q = data.draw(conditions(dialect))
    pairs = [
        (f"NOT (({p}) AND ({q}))", f"(NOT ({p})) OR (NOT ({q}))"),  # De Morgan
        (f"NOT (({p}) OR ({q}))", f"(NOT ({p})) AND (NOT ({q}))"),
        (f"NOT (NOT ({p}))", f"({p})"),  # double negation
        (f"({p}) AND ({q})", f"({q}) AND ({p})"),  # commutativity
        (f"({p}) OR ({q})", f"({q}) OR ({p})"),
    ]
    compiled = [(compiled_or_none(a, dialect), compiled_or_none(b, dialect)) for a, b in pairs]
    if any(fa is None or fb is None for fa, fb in compiled):
        return
    message = data.draw(messages())
    for (a, b), (fa, fb) in zip(pairs, compiled):
        assert fa.evaluate(message) is fb.evaluate(message), f"{a!r} vs {b!r} on {message!r}"
    if any(raises_evaluation_error(c, dialect, message) for c in (p, q)):
        return  # rocketmq: an evaluation error makes the whole selector FALSE, so no Kleene composition
    # Parenthesised, as inside the compositions (a lone rocketmq word on its own is a tag expression).
    vp, vq = compiled_or_none(f"({p})", dialect).evaluate(message), compiled_or_none(f"({q})", dialect).evaluate(message)
    conj = compiled_or_none(f"({p}) AND ({q})", dialect).evaluate(message)
    disj = compiled_or_none(f"({p}) OR ({q})", dialect).evaluate(message)
    assert conj is reference.logical_and(vp, vq)
    assert disj is reference.logical_or(vp, vq)
    assert compiled_or_none(f"NOT ({p})", dialect).evaluate(message) is reference.logical_not(vp)


def raises_evaluation_error(condition: str, dialect: str, message) -> bool:
    tree = parse_selector(f"({condition})", dialect=dialect)
    try:
        reference.Interpreter(tree.dialect, tree.convert_strings, message).condition(tree.expr)
    except reference.EvaluationError:
        return True
    return False
