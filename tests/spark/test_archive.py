"""The Parquet archive: lossless rows, atomic journal files, `archive import`."""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid

import pyarrow.parquet as pq
import pytest

from broker_filter.amqp import types as t
from broker_filter.archive.parquet import (
    SCHEMA,
    ArchiveError,
    JournalWriter,
    archive_files,
    import_jsonl,
    message_row,
    read_messages,
    row_message,
    rows_table,
)
from broker_filter.cli import main
from broker_filter.amqp.message import Header, Message, Properties

TYPED_VALUES = {
    "ub": t.ubyte(200),
    "us": t.ushort(60000),
    "ui": t.uint(4_000_000_000),
    "ul": t.ulong(2**64 - 1),
    "b": t.byte(-5),
    "s": t.short(-300),
    "i": t.int32(-(2**31)),
    "l": -(2**63),
    "ts": t.timestamp(1_700_000_000_123),
    "f": t.float32(1.1),
    "d": float("-inf"),
    "d32": t.decimal32("1.5"),
    "d128": t.decimal128("-12345678901234567890.5"),
    "c": t.char("x"),
    "sym": t.symbol("sym"),
    "str": "text \u00e9 \U0001f600",
    "bool": False,
    "bin": b"\x00\xff",
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "none": None,
    "desc": t.Described(t.symbol("x:y"), [1, "a", {"k": t.ubyte(1)}]),
}


def full_message() -> Message:
    m = Message(
        header=Header(durable=True, priority=t.ubyte(9), ttl=t.uint(1000), first_acquirer=False, delivery_count=t.uint(2)),
        delivery_annotations={t.symbol("da"): 1},
        message_annotations={t.symbol("x-opt-jms-type"): t.symbol("T"), t.symbol("n"): t.int32(3)},
        properties=Properties(
            message_id=uuid.UUID(int=7),
            user_id=b"alice",
            to="q1",
            subject="a.b",
            reply_to="r",
            correlation_id=t.ulong(5),
            content_type=t.symbol("text/plain"),
            content_encoding=t.symbol("utf-8"),
            absolute_expiry_time=t.timestamp(5),
            creation_time=t.timestamp(6),
            group_id="g",
            group_sequence=t.uint(7),
            reply_to_group_id="rg",
        ),
        application_properties=dict(TYPED_VALUES),
        body=[1, t.symbol("s"), {"m": None}],
    )
    m.encoded_size = 321
    return m


@pytest.mark.parametrize(
    "message",
    [
        full_message(),
        Message(),
        Message(body=None),
        Message(body=b"\x01\x02"),
        Message(header=Header(), properties=Properties(), application_properties={}),
    ],
    ids=["full", "empty", "null-body", "data-body", "empty-sections"],
)
def test_rows_round_trip_through_parquet(tmp_path, message):
    table = rows_table([message_row(message, address="q1", arrival_time=1.5)])
    pq.write_table(table, tmp_path / "a.parquet")
    back = pq.read_table(tmp_path / "a.parquet")
    assert back.schema.equals(SCHEMA, check_metadata=False)
    row = back.to_pylist()[0]
    assert row["address"] == "q1"
    assert row["arrival_time"] == dt.datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=dt.timezone.utc)
    restored = row_message(row)
    assert restored == message
    assert restored.encoded_size == message.encoded_size


def test_typed_values_keep_their_amqp_types():
    row = message_row(full_message())
    props = dict(row["application_properties"])
    assert props["ub"] == {"type": "ubyte", "long": 200}
    assert props["ul"] == {"type": "ulong", "long": -1, "string": str(2**64 - 1)}
    assert props["f"]["type"] == "float" and props["f"]["double"] == float(t.float32(1.1))
    assert props["d32"] == {"type": "decimal32", "string": "1.5", "double": 1.5}
    assert props["sym"] == {"type": "symbol", "string": "sym"}
    assert props["c"] == {"type": "char", "string": "x"}
    assert props["uuid"]["binary"] == TYPED_VALUES["uuid"].bytes
    assert props["none"] == {"type": "null"}
    assert json.loads(props["desc"]["string"])["type"] == "described"


def test_non_string_annotation_keys_are_refused_with_the_reason():
    with pytest.raises(ArchiveError, match="message_annotations: key .* ulong"):
        message_row(Message(message_annotations={t.ulong(1): "x"}))


def test_journal_publishes_atomically_and_rolls_by_size_and_time(tmp_path):
    now = [0.0]
    journal = JournalWriter(tmp_path, max_bytes=10_000_000, max_seconds=60, batch_rows=10, clock=lambda: now[0])
    for i in range(25):
        journal.append(Message(application_properties={"i": i}), address="q", arrival_time=float(i))
    visible = archive_files(tmp_path)
    assert visible == []  # nothing published yet; the file being written is hidden
    assert any(name.startswith(".") and name.endswith(".tmp") for name in os.listdir(tmp_path))
    now[0] = 61.0
    first = journal.roll_if_due()
    assert first is not None and archive_files(tmp_path) == [first]
    assert [r["application_properties"][0][1]["long"] for r in pq.read_table(first).to_pylist()] == list(range(25))
    assert journal.roll_if_due() is None  # nothing open, nothing to publish
    small = JournalWriter(tmp_path / "small", max_bytes=3000, max_seconds=3600, batch_rows=5)
    for i in range(200):
        small.append(Message(application_properties={"pad": "x" * 50, "i": i}), address="q")
    small.close()
    files = archive_files(tmp_path / "small")
    assert len(files) > 1
    got = [m.application_properties["i"] for _row, m in read_messages(tmp_path / "small")]
    assert got == list(range(200))
    assert [f for f in os.listdir(tmp_path / "small") if f.startswith(".")] == []
    journal.close()
    journal.close()
    with pytest.raises(ArchiveError, match="closed"):
        journal.append(Message())


def test_import_reports_bad_lines_and_takes_envelopes():
    lines = [
        '{"application_properties": {"a": 1}}',
        "not json",
        "",
        '{"message": {"body": "x"}, "address": "q2", "arrival_time": "2026-01-01T10:00:00Z"}',
        '{"header": {"priority": 700}}',
        '{"message": {}, "adress": "typo"}',
        '{"properties": {"creation_time": 1700000000000}}',
    ]
    rows, errors = import_jsonl(lines, address="default")
    assert [n for n, _ in errors] == [2, 5, 6]
    assert "not JSON" in errors[0][1] and "priority" in errors[1][1] and "adress" in errors[2][1]
    assert [r["address"] for r in rows] == ["default", "q2", "default"]
    assert rows[1]["arrival_time"] == dt.datetime(2026, 1, 1, 10, tzinfo=dt.timezone.utc)
    assert rows[2]["arrival_time"] == dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)


def test_archive_import_command(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"application_properties": {"a": 1}}\n{"oops": 1}\n', encoding="utf-8")
    out = tmp_path / "arch"
    assert main(["archive", "import", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src}:2: oops: unknown section" in err
    assert not out.exists() or archive_files(out) == []
    assert main(["archive", "import", str(src), "-o", str(out), "--keep-going"]) == 1
    assert [m.application_properties for _r, m in read_messages(out)] == [{"a": 1}]
    src.write_text('{"application_properties": {"a": 2}}\n', encoding="utf-8")
    assert main(["archive", "import", str(src), "-o", str(out)]) == 0
    assert sorted(m.application_properties["a"] for _r, m in read_messages(out)) == [1, 2]
    assert main(["archive", "import", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2


def test_text_that_utf8_cannot_hold_is_a_clear_error():
    rows, errors = import_jsonl(['{"application_properties": {"a": "\\ud800"}}', '{"properties": {"to": "\\udfff"}}'])
    assert rows == [] and [n for n, _ in errors] == [1, 2]
    assert "not valid Unicode" in errors[0][1]
