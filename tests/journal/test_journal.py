"""The daemon's journal on real files: recording, address filtering, rolling, failures that never raise."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import time

import proton
import pyarrow.parquet as pq
import pytest

from broker_filter.amqp import types as t
from broker_filter import amqp
from broker_filter.archive.parquet import archive_files, read_messages
from broker_filter.config import Journal as JournalConfig
from broker_filter.archive.journal import CLOSED, IO, QUEUE_FULL, UNARCHIVABLE, UNDECODABLE, Journal
from broker_filter.amqp.message import Message, Properties


def rows_of(directory):
    return list(read_messages(directory))


def no_hidden_files(directory) -> bool:
    return not [n for n in os.listdir(directory) if n.startswith(".")]


def test_from_config_disabled_is_none_and_enabled_starts(tmp_path):
    assert Journal.from_config(JournalConfig()) is None
    cfg = JournalConfig(enabled=True, directory=str(tmp_path / "j"), addresses=("anycast://a.#",), roll_bytes=1234, roll_seconds=7.5)
    j = Journal.from_config(cfg)
    try:
        assert isinstance(j, Journal)
        assert (j.directory, j.patterns, j.roll_bytes, j.roll_seconds) == (str(tmp_path / "j"), ("a.#",), 1234, 7.5)
    finally:
        assert j.close()


def test_round_trip_with_types_intact(tmp_path, journals, make_message):
    j = journals(tmp_path)
    sent = [make_message(i) for i in range(20)]
    pm = proton.Message(
        id=7, subject="from-proton", properties={"color": "red", "n": proton.int32(3), "u": proton.ulong(2**63 + 1)},
        body={"k": [1, 2.5, None]},
    )
    pm.annotations = {proton.symbol("x-opt-k"): proton.ubyte(200)}
    proton_bytes = pm.encode()
    arrival = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)
    for m, data in sent:
        j.record("orders", data)
    j.record("proton", proton_bytes, arrival_time=arrival)
    assert j.close()
    rows = rows_of(tmp_path)
    assert [m for _r, m in rows[:20]] == [m for m, _d in sent]
    assert [r["seq"] for r, _m in rows] == list(range(21))
    assert all(r["address"] == "orders" for r, _m in rows[:20])
    assert [r["encoded_size"] for r, _m in rows[:20]] == [len(d) for _m, d in sent]
    last_row, last = rows[20]
    assert last_row["address"] == "proton" and last_row["arrival_time"] == arrival
    assert last == amqp.decode_message(proton_bytes)
    assert isinstance(last.application_properties["n"], t.int32)
    assert isinstance(last.application_properties["u"], t.ulong) and last.application_properties["u"] == 2**63 + 1
    assert isinstance(last.message_annotations[t.symbol("x-opt-k")], t.ubyte)
    assert last.body == {"k": [1, 2.5, None]}
    m0 = rows[0][1]
    assert isinstance(m0.properties.message_id, t.ulong) and isinstance(m0.application_properties["f"], t.float32)
    assert (j.recorded, j.skipped, j.failed) == (21, 0, 0)
    # arrival time defaults to the time of record()
    assert abs(rows[0][0]["arrival_time"].timestamp() - time.time()) < 60


def test_address_patterns_wildcards_prefixes_and_fqqn(tmp_path, journals, make_message):
    j = journals(tmp_path, addresses=["orders.#", "anycast://audit", "multicast://news.*", "billing::q1"])
    _m, data = make_message()
    offered = {
        "orders": True,  # '#' matches zero words
        "orders.eu.paris": True,
        "multicast://orders.eu": True,
        "audit": True,
        "anycast://audit": True,
        "audit.x": False,
        "news.uk": True,
        "news": False,
        "news.uk.sport": False,
        "billing": True,
        "billing::q2": True,  # matched on the address part
        "other": False,
        "ordersx": False,
    }
    for address in offered:
        j.record(address, data)
    # anonymous link: the message's `to` decides
    j.record(None, amqp.encode_message(Message(properties=Properties(to="orders.us"), body="to-match")))
    j.record(None, amqp.encode_message(Message(properties=Properties(to="elsewhere"), body="to-skip")))
    assert j.close()
    stored = [r["address"] for r, _m in rows_of(tmp_path)]
    assert stored == ["orders", "orders.eu.paris", "orders.eu", "audit", "audit", "news.uk", "billing", "billing", "orders.us"]
    want = sum(offered.values()) + 1
    assert (j.recorded, j.skipped, j.failed) == (want, len(offered) + 2 - want, 0)


def test_no_patterns_records_every_address(tmp_path, journals, make_message):
    j = journals(tmp_path)
    _m, data = make_message()
    for address in ("a", "b.c", None, "anycast://d"):
        j.record(address, data)
    assert j.close()
    assert [r["address"] for r, _m in rows_of(tmp_path)] == ["a", "b.c", None, "d"]
    assert j.skipped == 0


def test_rolls_by_size_into_several_complete_files(tmp_path, journals, make_message):
    j = journals(tmp_path, roll_bytes=16 * 1024, batch_rows=50)
    sent = [make_message(i) for i in range(1500)]
    for _m, data in sent:
        j.record("orders", data)
    assert j.drain(timeout=30)
    published_before_close = archive_files(tmp_path)
    assert len(published_before_close) >= 3
    assert j.close()
    files = archive_files(tmp_path)
    assert files == sorted(j.published)
    assert no_hidden_files(tmp_path)
    counts = [pq.ParquetFile(f).metadata.num_rows for f in files]
    assert all(n > 0 for n in counts) and sum(counts) == 1500
    assert [m for _r, m in rows_of(tmp_path)] == [m for m, _d in sent]


def test_rolls_by_age_on_tick(tmp_path, journals, make_message, clock):
    j = journals(tmp_path, roll_seconds=60, clock=clock)
    _m, data = make_message()
    for _ in range(3):
        j.record("a", data)
    assert j.drain(timeout=10)  # the file's age counts from when the writer thread opened it
    clock.advance(30)
    j.tick()
    assert j.drain(timeout=10)
    assert archive_files(tmp_path) == []  # not yet due
    clock.advance(31)
    j.tick()
    assert j.drain(timeout=10)
    assert len(archive_files(tmp_path)) == 1
    for _ in range(2):
        j.record("a", data)
    assert j.drain(timeout=10)
    clock.advance(61)
    j.tick()
    assert j.drain(timeout=10)
    files = archive_files(tmp_path)
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [3, 2]
    assert j.close()
    assert archive_files(tmp_path) == files  # nothing left open
    assert no_hidden_files(tmp_path)


def test_quiet_journal_publishes_by_age_without_tick(tmp_path, journals, make_message):
    j = journals(tmp_path, roll_seconds=0.2)
    _m, data = make_message()
    j.record("a", data)
    deadline = time.monotonic() + 10
    while not archive_files(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(archive_files(tmp_path)) == 1
    assert len(rows_of(tmp_path)) == 1


def test_close_publishes_the_last_file_and_is_idempotent(tmp_path, make_message, caplog):
    j = Journal(tmp_path)
    _m, data = make_message()
    for _ in range(5):
        j.record("a", data)
    assert j.drain(timeout=10)
    assert archive_files(tmp_path) == []
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")]  # the open file is hidden
    assert j.close()
    assert j.close()
    assert len(archive_files(tmp_path)) == 1 and len(rows_of(tmp_path)) == 5
    assert no_hidden_files(tmp_path)
    with caplog.at_level(logging.WARNING, logger="broker_filter.journal"):
        j.record("a", data)
        j.record("a", data)
    assert j.failures == {CLOSED: 2}
    assert len([r for r in caplog.records if "after the journal was closed" in r.getMessage()]) == 1
    assert j.drain(timeout=1)


def test_bad_messages_are_counted_logged_once_and_never_raise(tmp_path, journals, make_message, caplog):
    j = journals(tmp_path)
    good, good_bytes = make_message(1)
    ulong_key = amqp.encode_message(Message(message_annotations={t.ulong(5): "x"}, body="refused"))
    with caplog.at_level(logging.WARNING, logger="broker_filter.journal"):
        j.record("a", b"\x00Sw\xa1")  # truncated
        j.record("a", good_bytes)
        j.record("a", b"not amqp at all")
        j.record("a", ulong_key)
        j.record("a", ulong_key)
        j.record("a", b"")  # no sections: an empty message is archivable
        assert j.drain(timeout=10)
    assert j.failures == {UNDECODABLE: 2, UNARCHIVABLE: 2}
    assert (j.recorded, j.failed) == (2, 4)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not be decoded" in m for m in messages) == 1
    assert sum("cannot hold" in m for m in messages) == 1
    assert any("ulong" in m or "5" in m for m in messages if "cannot hold" in m)
    assert j.close()
    assert [m for _r, m in rows_of(tmp_path)] == [good, amqp.decode_message(b"")]


def test_unwritable_directory_is_counted_not_raised(tmp_path, journals, make_message):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    j = journals(blocker / "journal")
    _m, data = make_message()
    for _ in range(4):
        j.record("a", data)
    assert j.drain(timeout=10)
    assert (j.recorded, j.failures) == (0, {IO: 4})
    assert j.close()


def test_lost_directory_counts_the_open_file_and_recovers(tmp_path, journals, make_message, clock):
    d = tmp_path / "journal"
    j = journals(d, roll_seconds=60, batch_rows=1, clock=clock)
    _m, data = make_message()
    for _ in range(3):
        j.record("a", data)
    assert j.drain(timeout=10)
    shutil.rmtree(d)  # the open file's rename will fail
    clock.advance(61)
    j.tick()
    assert j.drain(timeout=10)
    assert (j.recorded, j.failures) == (0, {IO: 3})
    for _ in range(2):
        j.record("a", data)
    assert j.close()
    assert (j.recorded, j.failed) == (2, 3)
    assert len(rows_of(d)) == 2


def test_full_queue_drops_instead_of_blocking(tmp_path, journals, make_message):
    j = journals(tmp_path, queue_messages=5)
    _m, data = make_message()
    j.record("a", data)
    assert j.drain(timeout=10)
    stall = j._writer._lock  # a stalled disk: the writer thread cannot append
    with stall:
        started = time.monotonic()
        for _ in range(50):
            j.record("a", data)
        assert time.monotonic() - started < 5
        full = j.failures.get(QUEUE_FULL, 0)
    assert full >= 50 - 2 * 5  # at most one queue-full taken by the writer, one more queued
    assert j.close()
    assert j.recorded + j.failed == 51
    assert len(rows_of(tmp_path)) == j.recorded


def test_queue_bytes_bound(tmp_path, journals):
    j = journals(tmp_path, queue_bytes=1000)
    big = amqp.encode_message(Message(body=b"x" * 800))
    j.record("a", big)
    assert j.drain(timeout=10)
    with j._writer._lock:
        for _ in range(10):
            j.record("a", big)
        assert j.failures.get(QUEUE_FULL, 0) >= 8
    assert j.close()
    assert j.recorded + j.failed == 11


def test_record_never_raises_on_odd_arguments(tmp_path, journals):
    j = journals(tmp_path)
    j.record("a", None)  # type: ignore[arg-type]
    j.record(123, b"")  # type: ignore[arg-type]
    assert j.drain(timeout=10)
    assert j.failures == {"internal": 2}
    j.record("a", b"")
    assert j.close() and j.recorded == 1  # the writer thread survived
