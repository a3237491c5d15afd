"""The public API's promises beyond outcomes: errors that explain themselves, `reads`, `matches`,
caching by (dialect, text), dialects passed explicitly."""

from __future__ import annotations

import pytest

from broker_filter.filters import FilterError, SelectorError, compile_selector, parse_selector
from broker_filter.amqp.message import Message


def test_selector_error_carries_position_and_caret() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector("a = 1 AND\n  b = 'x")
    e = info.value
    assert isinstance(e, FilterError) and isinstance(e, ValueError)
    assert (e.line, e.column) == (2, 7)
    assert e.position == len("a = 1 AND\n  b = ")
    assert e.condition == "amqp:invalid-field"
    assert "line 2, column 7" in str(e)
    assert e.caret().splitlines() == ["  b = 'x", "      ^"]
    assert e.describe()


@pytest.mark.parametrize(
    "text,dialect,sections",
    [
        ("a = 1", "jms", {"application_properties"}),
        ("JMSPriority > 3", "jms", {"header"}),
        ("JMSType = 'x'", "jms", {"properties", "message_annotations"}),
        ("JMSMessageID = 'x' AND a = 1", "jms", {"properties", "application_properties"}),
        ("m.x = 1", "artemis", {"message_annotations"}),
        ("TagA || TagB", "rocketmq", {"properties"}),
        ("", "jms", set()),
        ("TRUE", "jms", set()),
    ],
)
def test_reads_names_the_sections(text: str, dialect: str, sections: set) -> None:
    assert compile_selector(text, dialect=dialect).reads == frozenset(sections)


def test_matches_is_evaluate_is_true() -> None:
    f = compile_selector("a = 1")
    for props, evaluated in (({"a": 1}, True), ({"a": 2}, False), ({}, None)):
        m = Message.from_json({"application_properties": props})
        assert f.evaluate(m) is evaluated
        assert f.matches(m) is (evaluated is True)


def test_dialect_is_explicit_and_default_is_jms() -> None:
    m = Message.from_json({"application_properties": {"a": 1}})
    assert compile_selector("a <> 'x'").evaluate(m) is False
    assert compile_selector("a <> 'x'", dialect="artemis").evaluate(m) is True
    assert compile_selector("a <> 'x'").evaluate(m) is False  # nothing global changed
    with pytest.raises((SelectorError, ValueError)):
        compile_selector("a = 1", dialect="oracle")


def test_compiled_selectors_are_cached_by_dialect_and_text() -> None:
    assert compile_selector("a = 1 AND b = 2") is compile_selector("a = 1 AND b = 2")
    assert compile_selector("a = 1 AND b = 2", dialect="artemis") is not compile_selector("a = 1 AND b = 2")


def test_parse_selector_keeps_dialect_and_prefixes() -> None:
    tree = parse_selector("convert_string_expressions:hyphenated_props:a-b = 1", dialect="artemis")
    assert (tree.dialect, tree.convert_strings, tree.hyphenated) == ("artemis", True, True)
    assert parse_selector("   ", dialect="jms").expr is None


def test_evaluate_accepts_messages_without_any_section() -> None:
    for text, dialect in (("a = 1 OR JMSPriority = 4", "jms"), ("AMQSize > 1 OR m.x IS NULL", "artemis"), ("*", "rocketmq")):
        assert compile_selector(text, dialect=dialect).evaluate(Message()) is True
