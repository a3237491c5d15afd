"""The amqp-sql dialect (OASIS filtex SQL filter, as RabbitMQ 4.2 evaluates it): every row of
data/amqp_sql.json on the compiled evaluator and on the reference interpreter, the refused rows with
what and where, rendering round trips, and the dialect's limits."""

from __future__ import annotations

import pytest
from coretables import SqlCase, sql_cases

from broker_filter.filters import LimitError, SelectorError, compile_selector, parse_selector, render_selector
from broker_filter.filters.reference import evaluate as reference_evaluate

CASES = sql_cases()
EVALUABLE = [c for c in CASES if c.outcome != "E"]
REFUSED = [c for c in CASES if c.outcome == "E"]


@pytest.mark.parametrize("case", EVALUABLE, ids=[c.id for c in EVALUABLE])
def test_compiled(case: SqlCase) -> None:
    got = compile_selector(case.selector, "amqp-sql").evaluate(case.message())
    assert case.accepts(got), f"{case.selector!r}: compiled {got}, table {case.outcome}"


@pytest.mark.parametrize("case", EVALUABLE, ids=[c.id for c in EVALUABLE])
def test_reference(case: SqlCase) -> None:
    got = reference_evaluate(parse_selector(case.selector, "amqp-sql"), case.message())
    assert case.accepts(got), f"{case.selector!r}: reference {got}, table {case.outcome}"


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_refused(case: SqlCase) -> None:
    with pytest.raises(SelectorError) as e:
        compile_selector(case.selector, "amqp-sql")
    text = str(e.value)
    assert "Error" not in text and text.strip()
    if case.error:
        assert case.error in text, text
    if case.at:
        assert (e.value.line, e.value.column) == case.at, text


@pytest.mark.parametrize("case", EVALUABLE, ids=[c.id for c in EVALUABLE])
def test_render_round_trip(case: SqlCase) -> None:
    parsed = parse_selector(case.selector, "amqp-sql")
    again = parse_selector(render_selector(parsed), "amqp-sql")
    assert again.expr == parsed.expr, render_selector(parsed)


def test_table_covers_rabbitmq_suite_and_docs() -> None:
    sources = [c.source for c in CASES]
    assert sum("amqp_filter_sql_unit_SUITE.erl" in s for s in sources) > 400
    assert sum("docs/stream-filtering" in s for s in sources) >= 50
    assert {c.outcome for c in CASES} == {"T", "F", "U", "N", "E"}


def test_limits_4096_characters_and_200_tokens() -> None:
    long = "a = '" + "x" * 4088 + "'"
    assert len(long) == 4094
    compile_selector(long, "amqp-sql")
    compile_selector(long + "  ", "amqp-sql")  # 4,096 characters: the last length allowed
    with pytest.raises(LimitError) as e:
        compile_selector(long + "   ", "amqp-sql")
    assert "4096" in str(e.value)
    items = ", ".join(f"'{n}'" for n in range(97))  # a IN ( + 97 strings + 96 commas + ) = 197 tokens
    compile_selector(f"a IN ({items})", "amqp-sql")
    with pytest.raises(LimitError) as e:
        compile_selector(f"a IN ({items}, 'x', 'y')", "amqp-sql")  # 201 tokens
    assert "200" in str(e.value)


def test_the_jms_dialect_is_untouched() -> None:
    with pytest.raises(SelectorError):
        compile_selector("a != 1", "jms")
    assert compile_selector("a BETWEEN 1 AND 2", "jms") is not None
    with pytest.raises(SelectorError):
        compile_selector("a BETWEEN 1 AND 2", "amqp-sql")


def test_sql_filter_in_a_filter_set_is_always_amqp_sql() -> None:
    from broker_filter.amqp.types import Described, symbol, ulong
    from broker_filter.filters import FilterError, compile_filter_set
    from broker_filter.amqp.message import Message

    text = "p.subject = \"eu\" AND n % 2 = 1"
    for descriptor in (symbol("amqp:sql-filter"), ulong(0x120), "0x00000000:0x00000120"):
        for dialect in ("jms", "artemis", "rocketmq"):
            fs = compile_filter_set({symbol("f"): Described(descriptor, text)}, dialect)
            (entry,) = fs.entries
            assert (entry.kind, entry.descriptor, entry.text) == ("sql", "amqp:sql-filter", text)
            assert fs.evaluate(Message.from_json({"properties": {"subject": "eu"}, "application_properties": {"n": 3}})) is True
            assert fs.evaluate(Message.from_json({"properties": {"subject": "eu"}, "application_properties": {"n": 4}})) is False
    with pytest.raises(SelectorError) as e:
        compile_filter_set({symbol("f"): Described(ulong(0x120), "n BETWEEN 1 AND 2")})
    assert e.value.key == "f" and "no BETWEEN" in e.value.describe() and "column 3" in e.value.describe()
    with pytest.raises(FilterError) as e:
        compile_filter_set({symbol("f"): Described(symbol("amqp:sql-filter"), 12)})
    assert "an SQL filter's value is a string, not int" in e.value.describe()
    fs = compile_filter_set('{"s": {"descriptor": "amqp:sql-filter", "value": "a = 1"}}')
    assert fs.entries[0].kind == "sql"
