"""The core's conformance tables on Spark: every evaluable row of data/selectors.toml and
data/type_matrix.toml (with the rows that cite a peer among them), every row of data/headers.json,
of data/amqp_sql.json (the amqp-sql dialect) and
of data/filtex.json (the property filters) must give the table's answer on the Spark backend too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))

from coretables import DATA, OUTCOMES, load, selector_cases, sql_cases  # noqa: E402

from broker_filter.amqp.types import Described, symbol  # noqa: E402
from broker_filter.filters import compile_filter_set, parse_selector  # noqa: E402
from broker_filter.amqp.message import Message, value_from_json  # noqa: E402

pytestmark = pytest.mark.spark

HEADERS = "apache.org:legacy-amqp-headers-binding:map"


def _message_key(case) -> str:
    return json.dumps([case.message_json, case.size], sort_keys=True)


def test_selector_tables_on_spark(evaluate_on_spark):
    cases = [c for c in selector_cases() if c.outcome != "E"]
    selectors: dict[tuple[str, str], int] = {}
    messages: dict[str, int] = {}
    for c in cases:
        selectors.setdefault((c.dialect, c.selector), len(selectors))
        messages.setdefault(_message_key(c), len(messages))
    asts = [parse_selector(text, dialect) for dialect, text in selectors]
    msgs = [None] * len(messages)
    for c in cases:
        msgs[messages[_message_key(c)]] = c.message()
    results = evaluate_on_spark(asts, msgs)
    wrong = []
    for c in cases:
        got = results[selectors[(c.dialect, c.selector)]][messages[_message_key(c)]]
        want = False if c.outcome == "X" else OUTCOMES[c.outcome]
        if got is not want:
            wrong.append(f"{c.source} [{c.dialect}] {c.selector!r} on {c.message_json}: table {c.outcome}, spark {got}")
    assert not wrong, f"{len(wrong)} of {len(cases)} rows differ:\n" + "\n".join(wrong[:40])
    citing = {f"selectors.toml#{i}" for i, row in enumerate(load("selectors.toml")["case"], 1) if "peer" in row}
    assert len(cases) > 2000 and len(citing & {c.source for c in cases}) > 100


def test_headers_table_on_spark(evaluate_on_spark):
    from broker_filter.spark.compile import compile_filter_set as spark_filter_set

    rows = [r for r in json.loads((DATA / "headers.json").read_text())["rows"] if not r.get("error")]
    messages = []
    compiled = []
    for row in rows:
        message_json = dict(row.get("message", {}))
        if row["properties"] is not None:
            message_json["application_properties"] = row["properties"]
        messages.append(Message.from_json(message_json))
        binding = value_from_json(row["binding"])
        compiled.append(spark_filter_set(compile_filter_set({symbol("h"): Described(symbol(HEADERS), binding)})))
    results = evaluate_on_spark(compiled, messages)
    wrong = [
        f"{json.dumps(row['binding'])} on {json.dumps(row['properties'])}: table {row['match']}, spark {results[i][i]}"
        for i, row in enumerate(rows)
        if results[i][i] is not row["match"]
    ]
    assert not wrong, "\n".join(wrong)
    assert sum(1 for r in rows if "peer" in r) >= 10


def test_amqp_sql_table_on_spark(evaluate_on_spark):
    cases = [c for c in sql_cases() if c.outcome != "E"]
    selectors: dict[str, int] = {}
    messages: dict[str, int] = {}
    for c in cases:
        selectors.setdefault(c.selector, len(selectors))
        messages.setdefault(json.dumps(c.message_json, sort_keys=True), len(messages))
    msgs = [None] * len(messages)
    for c in cases:
        msgs[messages[json.dumps(c.message_json, sort_keys=True)]] = c.message()
    results = evaluate_on_spark([parse_selector(text, "amqp-sql") for text in selectors], msgs, batch=15)
    wrong = []
    for c in cases:
        got = results[selectors[c.selector]][messages[json.dumps(c.message_json, sort_keys=True)]]
        if not c.accepts(got):
            wrong.append(f"{c.source} {c.selector!r} on {c.message_json}: table {c.outcome}, spark {got}")
    assert not wrong, f"{len(wrong)} of {len(cases)} rows differ:\n" + "\n".join(wrong[:40])
    assert len(cases) > 450


def test_filtex_property_filter_table_on_spark(evaluate_on_spark):
    from broker_filter.spark.compile import compile_filter_set as spark_filter_set

    from coretables import FILTEX_DESCRIPTORS as DESCRIPTORS, FILTEX_ROWS as ROWS, filtex_reference_map as reference_map

    compiled, messages, want = [], [], []
    for row in ROWS:
        if "error" in row:
            continue
        for descriptor in DESCRIPTORS[row["filter"]]:
            fs = compile_filter_set({symbol("f"): Described(descriptor, reference_map(row))})
            for message_json, outcome in row["checks"]:
                compiled.append(spark_filter_set(fs))
                messages.append(Message.from_json(message_json))
                want.append((row["name"], message_json, outcome == "T"))
    results = evaluate_on_spark(compiled, messages)
    wrong = [f"{name}: {m} table {w}, spark {results[i][i]}" for i, (name, m, w) in enumerate(want) if results[i][i] is not w]
    assert not wrong, f"{len(wrong)} of {len(want)} checks differ:\n" + "\n".join(wrong[:40])
    assert len(want) > 50
