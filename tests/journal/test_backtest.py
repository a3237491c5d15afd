"""A journal directory, written while open and rolled into several files, read by `broker-filter backtest`."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from broker_filter.amqp import types as t
from broker_filter import amqp
from broker_filter.archive.parquet import archive_files
from broker_filter.cli import main
from broker_filter.archive.journal import Journal
from broker_filter.amqp.message import Message, Properties

pytestmark = pytest.mark.spark

HOUR = dt.datetime(2026, 3, 1, 10, tzinfo=dt.timezone.utc)


def test_backtest_reads_a_rolled_journal(tmp_path, spark, capsys):
    d = tmp_path / "journal"
    j = Journal(d, addresses=["orders.#", "anycast://audit"], roll_bytes=4 * 1024, batch_rows=20)
    try:
        for i in range(300):
            m = Message(
                properties=Properties(subject=f"s{i}"),
                application_properties={"color": ("red", "blue", "green")[i % 3], "n": t.int32(i)},
                body=b"x" * 40,
            )
            address = ("orders.eu", "audit", "other")[i % 3] if i % 2 else "orders"
            j.record(address, amqp.encode_message(m), arrival_time=HOUR + dt.timedelta(minutes=i // 3))
        j.record("orders", b"\x00 not a message")
        for i in range(5):
            j.record("orders", amqp.encode_message(Message(application_properties={"color": "red", "n": t.int32(1000)})))
        assert j.drain(timeout=30)
    finally:
        assert j.close(timeout=30)
    files = archive_files(d)
    assert len(files) >= 2
    expected = [
        (i, ("orders.eu", "audit", "other")[i % 3] if i % 2 else "orders")
        for i in range(300)
    ]
    kept = [(i, a) for i, a in expected if a != "other"]
    red_big = [(i, a) for i, a in kept if i % 3 == 0 and i > 100]
    assert (j.recorded, j.skipped, j.failed) == (len(kept) + 5, 300 - len(kept), 1)
    capsys.readouterr()
    assert main(["backtest", "--archive", str(d), "--selector", "color = 'red' AND n > 100", "--master", "local[2]", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (name,) = report
    result = report[name]
    assert result["total"] == len(kept) + 5
    assert result["matched"] == len(red_big) + 5
    by_address: dict = {}
    for _i, a in red_big + [(None, "orders")] * 5:
        by_address[a] = by_address.get(a, 0) + 1
    assert result["by_address"] == by_address
