"""`broker-filter backtest` end to end on the shared local Spark session."""

from __future__ import annotations

import json

import pytest

from broker_filter.archive.parquet import read_messages
from broker_filter.cli import main

pytestmark = pytest.mark.spark

LINES = [
    {"address": "orders", "arrival_time": "2026-01-01T10:05:00Z", "message": {"application_properties": {"color": "red", "n": 1}}},
    {"address": "orders", "arrival_time": "2026-01-01T10:55:00Z", "message": {"application_properties": {"color": "blue", "n": 2}}},
    {"address": "orders", "arrival_time": "2026-01-01T11:10:00Z", "message": {"application_properties": {"color": "red"}, "properties": {"subject": "a.b"}}},
    {"address": "audit", "arrival_time": "2026-01-01T11:20:00Z", "message": {"application_properties": {"color": "red", "n": 5}}},
    {"address": "audit", "arrival_time": "2026-01-01T12:00:00Z", "message": {"header": {"priority": 9}}},
]


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("bt")
    src = d / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES) + "\n", encoding="utf-8")
    assert main(["archive", "import", str(src), "-o", str(d / "archive")]) == 0
    return d


def test_backtest_json_per_filter(archive, capsys, spark):
    filters = archive / "filters.json"
    filters.write_text(
        json.dumps(
            {
                "red": "color = 'red'",
                "big": "n > 1",
                "urgent": "JMSPriority >= 7",
                "topic": {"t": {"descriptor": "apache.org:legacy-amqp-topic-binding:string", "value": "a.*"}},
            }
        ),
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["backtest", "--archive", str(archive / "archive"), "--filters", str(filters), "--json",
                 "--output", str(archive / "out")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"red", "big", "urgent", "topic"}
    red = report["red"]
    assert (red["matched"], red["total"], red["unknown"]) == (3, 5, 1)
    assert red["selectivity"] == pytest.approx(0.6)
    assert red["by_address"] == {"orders": 2, "audit": 1}
    assert red["by_hour"] == {"2026-01-01T10:00:00Z": 1, "2026-01-01T11:00:00Z": 2}
    assert (report["big"]["matched"], report["big"]["unknown"]) == (2, 2)
    assert report["urgent"]["matched"] == 1 and report["urgent"]["by_address"] == {"audit": 1}
    assert report["topic"]["matched"] == 1
    written = sorted(m.application_properties["n"] for _r, m in read_messages(archive / "out" / "big"))
    assert written == [2, 5]


def test_backtest_single_selector_text_output(archive, capsys, spark):
    capsys.readouterr()
    assert main(["backtest", "--archive", str(archive / "archive"), "--selector", "n BETWEEN 1 AND 2"]) == 0
    out = capsys.readouterr().out
    assert "selector: 2 of 5 matched (40.00%), 2 unknown" in out
    assert "address orders: 2" in out


def test_backtest_refuses_bad_input_clearly(archive, capsys):
    assert main(["backtest", "--archive", str(archive / "archive"), "--selector", "color = "]) == 2
    err = capsys.readouterr().err
    assert "line 1, column" in err
    assert main(["backtest", "--archive", str(archive / "nothing"), "--selector", "a = 1"]) == 2
    assert "no such archive" in capsys.readouterr().err
    bad = archive / "bad.json"
    bad.write_text('{"x": 5}', encoding="utf-8")
    assert main(["backtest", "--archive", str(archive / "archive"), "--filters", str(bad)]) == 2
    assert "filter 'x'" in capsys.readouterr().err
