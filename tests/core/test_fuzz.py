"""A short fuzz run of the selector parser and the filter-set decoder: any input either compiles or
raises the one documented error (SelectorError / FilterError); nothing else escapes and nothing hangs.
BROKER_FILTER_FUZZ_EXAMPLES scales the run (a long run before a release: e.g. 200000)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from broker_filter.filters import FilterError, SelectorError, compile_filter_set, compile_selector
from broker_filter.amqp.message import Message
from strategies import DIALECTS, filter_set_junk, tokens_soup

SAMPLES = (
    Message(),
    Message.from_json({"properties": {"subject": "a.b"}, "application_properties": {"a": 1, "s": "x"},
                       "message_annotations": {"x-opt-broker-filter-origin": "i/c"}}),
)


EXAMPLES = int(os.environ.get("BROKER_FILTER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
TIMEOUT = max(60, EXAMPLES // 20)

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(TIMEOUT)]


@pytest.mark.parametrize("dialect", DIALECTS)
@FUZZ
@given(text=tokens_soup())
def test_selector_text_compiles_or_raises_selector_error(dialect: str, text: str) -> None:
    try:
        f = compile_selector(text, dialect=dialect)
    except SelectorError as e:
        assert e.line is None or (e.line >= 1 and e.column >= 1)
        assert e.describe()
        return
    for message in SAMPLES:
        assert f.evaluate(message) in (True, False, None)


@FUZZ
@given(obj=filter_set_junk())
def test_filter_set_structures_compile_or_raise_filter_error(obj) -> None:
    try:
        fs = compile_filter_set(obj)
    except FilterError as e:
        assert e.describe()
        return
    for message in SAMPLES:
        assert fs.evaluate(message, "i/c") in (True, False, None)
    assert isinstance(fs.applied, dict)
