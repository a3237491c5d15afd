"""Selected cases of the Spark compiler, each checked against the core evaluator (with codegen on)."""

from __future__ import annotations

import uuid

import pytest

from broker_filter.amqp import types as t
from broker_filter.filters import compile_selector, parse_selector
from broker_filter.amqp.message import Header, Message, Properties
from broker_filter.spark.compile import like_regex

pytestmark = pytest.mark.spark

MESSAGES = [
    Message(),
    Message(application_properties={"s": "a%b_c\nd", "n": t.int32(2**31 - 1), "l": 2**63 - 1, "f": float("nan")}),
    Message(application_properties={"s": "a.b*c", "n": t.ubyte(7), "l": -(2**63), "f": t.float32(0.5), "c": t.char("x")}),
    Message(
        header=Header(durable=True, priority=t.ubyte(9), delivery_count=t.uint(2)),
        properties=Properties(
            message_id=uuid.UUID(int=3), correlation_id=b"\x0a\xff", subject="TagA", user_id=b"\xff",
            creation_time=t.timestamp(1000), to="q1",
        ),
        message_annotations={t.symbol("x-opt-jms-type"): t.symbol("ignored-subject-wins"), t.symbol("k"): 5},
        application_properties={"s": "", "n": t.short(-1), "b": True},
    ),
    Message(message_annotations={t.symbol("jms-type"): "T"}, properties=Properties(message_id=t.ulong(2**64 - 1))),
]

CASES = [
    ("jms", "s LIKE 'a!%b!_c_d' ESCAPE '!'"),
    ("jms", "s LIKE 'a.b*%'"),
    ("jms", "s NOT LIKE '%'"),
    ("jms", "s LIKE '\\%' ESCAPE '\\'"),
    ("jms", "c LIKE 'x' OR c NOT LIKE 'x' OR c IS NULL"),
    ("jms", "n + 1 < 0"),
    ("jms", "n * n = 1"),
    ("jms", "l + 1 < 0"),
    ("jms", "-l = l"),
    ("jms", "n / 0 IS NULL"),
    ("jms", "f / 0 > 1000"),
    ("jms", "f = f"),
    ("jms", "f > 1E308"),
    ("jms", "-7 / 2 = -3"),
    ("jms", "n IN ('1') OR s IN ('a.b*c', '')"),
    ("jms", "n NOT BETWEEN s AND 10"),
    ("jms", "JMSPriority > 4 AND JMSDeliveryMode = 'PERSISTENT' AND JMSRedelivered"),
    ("jms", "JMSMessageID = 'ID:AMQP_UUID:00000000-0000-0000-0000-000000000003'"),
    ("jms", "JMSMessageID = 'ID:AMQP_ULONG:18446744073709551615'"),
    ("jms", "JMSCorrelationID = 'ID:AMQP_BINARY:0AFF'"),
    ("jms", "JMSType = 'TagA' OR JMSType = 'T'"),
    ("jms", "JMSXUserID IS NULL AND JMSXDeliveryCount = 3 AND JMSTimestamp = 1000 AND JMSExpiration = 0"),
    ("jms", "b"),
    ("jms", "NOT b"),
    ("artemis", "s = 1"),
    ("artemis", "s <> 1"),
    ("artemis", "missing = other"),
    ("artemis", "7 / 2 = 3.5"),
    ("artemis", "m.k = 5 AND AMQPriority = 9 AND AMQDurable = 'DURABLE'"),
    ("artemis", "convert_string_expressions:s + 1 = 1"),
    ("rocketmq", "TagA || TagB"),
    ("rocketmq", "s CONTAINS 'b' OR n > 1"),
    ("rocketmq", "s = 1 OR n = 7"),
    ("rocketmq", "n IN (7, -1)"),
]


def test_cases_agree_with_the_core_with_codegen_on(spark, evaluate_on_spark):
    spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")
    spark.conf.set("spark.sql.codegen.wholeStage", "true")
    try:
        results = evaluate_on_spark([parse_selector(text, dialect) for dialect, text in CASES], MESSAGES)
    finally:
        spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        spark.conf.set("spark.sql.codegen.wholeStage", "false")
    wrong = []
    for (dialect, text), got in zip(CASES, results):
        want = [compile_selector(text, dialect).evaluate(m) for m in MESSAGES]
        if want != got:
            wrong.append(f"[{dialect}] {text}: core {want}, spark {got}")
    assert not wrong, "\n".join(wrong)
    # The cases are not vacuous: each of TRUE, FALSE and UNKNOWN occurs.
    flat = {v for row in results for v in row}
    assert flat == {True, False, None}


def test_like_regex_quotes_every_special_character():
    assert like_regex("a.b", None) == r"(?s)\Aa\x{2e}b\z"
    assert like_regex("%_", None) == r"(?s)\A.*.\z"
    assert like_regex("!%!_!!", "!") == r"(?s)\A\x{25}\x{5f}\x{21}\z"
    assert like_regex("\\Q$", None) == r"(?s)\A\x{5c}Q\x{24}\z"


def test_compiled_plans_are_native_spark_sql(spark):
    from broker_filter.archive.parquet import message_row, rows_table
    from broker_filter.spark.compile import apply_all, compile_selector as spark_compile
    from broker_filter.spark.session import table_frame

    frame = table_frame(spark, rows_table([message_row(m) for m in MESSAGES]))
    compiled = {f"c{i}": spark_compile(parse_selector(text, dialect)) for i, (dialect, text) in enumerate(CASES)}
    plan = apply_all(frame, compiled)._jdf.queryExecution().analyzed().toString()
    assert "Project" in plan
    assert "Python" not in plan and "UDF" not in plan.upper()
