"""The message archive: Parquet files (pyarrow only; no Spark here, the daemon's journal uses this),
and the Arrow stream a Spark partition of live messages travels in.

Theory of operation: one row per message.  Header and properties fields are columns (inside the
nullable structs `header` and `properties`, null when the message had no such section); annotations
and application properties are maps whose values are `TYPED` structs that keep the AMQP type name
next to the value, so a Spark expression can apply exactly the JMS typing rules (int width vs long
width, float vs double, string vs symbol, opaque char/binary/uuid) without decoding anything.  The
body is a `TYPED` struct too (a data section is `binary`).  Every value round-trips: list, map, array
and described values, which selectors cannot test, are kept as their JSON form (docs/message-json.md).
The layout is documented in docs/archive.md.

`JournalWriter` appends messages to rolling files and publishes each file atomically: rows go to a
hidden temporary file (readers, Spark included, skip names starting with "."), which `os.replace`
renames into place once complete.  A file is rolled when it reaches `max_bytes` or `max_seconds`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
import time
import uuid
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..amqp import types as t
from ..amqp.message import HEADER_FIELDS, PROPERTIES_FIELDS, Header, Message, Properties, value_from_json, value_to_json

SCHEMA_VERSION = 1

TYPED = pa.struct(
    [
        pa.field("type", pa.string()),  # AMQP type name: null, boolean, ubyte ... described
        pa.field("string", pa.string()),
        pa.field("long", pa.int64()),
        pa.field("double", pa.float64()),
        pa.field("boolean", pa.bool_()),
        pa.field("binary", pa.binary()),
    ]
)
TYPED_MAP = pa.map_(pa.string(), TYPED)

# Integer types whose value goes to `long` (ulong too, wrapped to 64 bits; its exact text is in `string`).
INTEGER_TYPES = frozenset({"ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp"})
# Types kept as JSON text in `string`.
JSON_TYPES = frozenset({"list", "map", "array", "described"})

_HEADER_ARROW = {
    "durable": pa.bool_(),
    "priority": pa.int16(),  # ubyte
    "ttl": pa.int64(),  # uint
    "first_acquirer": pa.bool_(),
    "delivery_count": pa.int64(),  # uint
}
_PROPERTIES_ARROW = {
    "message_id": TYPED,
    "user_id": pa.binary(),
    "to": pa.string(),
    "subject": pa.string(),
    "reply_to": pa.string(),
    "correlation_id": TYPED,
    "content_type": pa.string(),  # symbol
    "content_encoding": pa.string(),  # symbol
    "absolute_expiry_time": pa.int64(),  # timestamp, ms since the epoch
    "creation_time": pa.int64(),  # timestamp, ms since the epoch
    "group_id": pa.string(),
    "group_sequence": pa.int64(),  # uint
    "reply_to_group_id": pa.string(),
}
assert list(_HEADER_ARROW) == list(HEADER_FIELDS) and list(_PROPERTIES_ARROW) == list(PROPERTIES_FIELDS)

SCHEMA = pa.schema(
    [
        pa.field("address", pa.string()),
        pa.field("arrival_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("header", pa.struct([pa.field(n, ty) for n, ty in _HEADER_ARROW.items()])),
        pa.field("delivery_annotations", TYPED_MAP),
        pa.field("message_annotations", TYPED_MAP),
        pa.field("properties", pa.struct([pa.field(n, ty) for n, ty in _PROPERTIES_ARROW.items()])),
        pa.field("application_properties", TYPED_MAP),
        pa.field("body", TYPED),
        pa.field("encoded_size", pa.int64()),
    ],
    metadata={b"broker_filter.archive": str(SCHEMA_VERSION).encode()},
)


class ArchiveError(ValueError):
    """A message or file that cannot go into (or come out of) the archive; says why."""


# -------------------------------------------------------------------- values
def typed_value(v: Any) -> dict:
    """An AMQP value as a `TYPED` struct (a dict)."""
    try:
        kind = t.amqp_type(v)
    except TypeError as e:
        raise ArchiveError(str(e)) from None
    out: dict[str, Any] = {"type": kind}
    if kind == "null":
        pass
    elif kind == "boolean":
        out["boolean"] = bool(v)
    elif kind in INTEGER_TYPES:
        n = int(v)
        if kind == "ulong":
            out["string"] = str(n)
            if n >= 2**63:
                n -= 2**64  # Java's UnsignedLong.longValue(): the same 64 bits, read signed
        out["long"] = n
    elif kind in ("float", "double"):
        out["double"] = float(v)
    elif kind in ("decimal32", "decimal64", "decimal128"):
        out["string"] = format(v)
        try:
            out["double"] = float(v)
        except (OverflowError, ValueError):
            out["double"] = None
    elif kind in ("string", "symbol", "char"):
        out["string"] = _text(v)
    elif kind == "binary":
        out["binary"] = bytes(v)
    elif kind == "uuid":
        out["string"] = str(v)
        out["binary"] = v.bytes
    elif kind in JSON_TYPES:
        out["string"] = json.dumps(value_to_json(v), separators=(",", ":"), ensure_ascii=False)
    else:  # pragma: no cover - amqp_type knows no other names
        raise ArchiveError(f"cannot archive a {kind}")
    return out


def value_of(d: Any) -> Any:
    """The AMQP value of a `TYPED` struct (dict or Row-like); the inverse of `typed_value`."""
    if d is None:
        return None
    get = d.get if isinstance(d, dict) else (lambda k: getattr(d, k))
    kind = get("type")
    if kind == "null" or kind is None:
        return None
    if kind == "boolean":
        return bool(get("boolean"))
    if kind == "ulong":
        return t.ulong(int(get("string")) if get("string") is not None else get("long") % 2**64)
    if kind == "long":
        return int(get("long"))
    if kind in INTEGER_TYPES:
        return t.TYPE_CONSTRUCTORS[kind](int(get("long")))
    if kind == "float":
        return t.float32(get("double"))
    if kind == "double":
        return float(get("double"))
    if kind in ("decimal32", "decimal64", "decimal128"):
        return t.TYPE_CONSTRUCTORS[kind](get("string"))
    if kind == "string":
        return str(get("string"))
    if kind in ("symbol", "char"):
        return t.TYPE_CONSTRUCTORS[kind](get("string"))
    if kind == "binary":
        return bytes(get("binary"))
    if kind == "uuid":
        return uuid.UUID(get("string"))
    if kind in JSON_TYPES:
        return value_from_json(json.loads(get("string")))
    raise ArchiveError(f"unknown AMQP type {kind!r} in the archive")


def _typed_map(m: dict | None, section: str) -> list | None:
    if m is None:
        return None
    out = []
    for k, v in m.items():
        if not isinstance(k, str) or type(k) is t.char:
            kind = t.amqp_type(k) if k is not None else "null"
            raise ArchiveError(f"{section}: key {k!r} is a {kind}; the archive keeps string and symbol keys only")
        out.append((_text(k), typed_value(v)))
    return out


def _map_of(items: Any, key_type: type) -> dict | None:
    if items is None:
        return None
    pairs = items.items() if isinstance(items, dict) else items
    return {(key_type(k) if key_type is not str else k): value_of(v) for k, v in pairs}


# -------------------------------------------------------------------- rows
def _arrival(arrival_time: Any) -> _dt.datetime:
    if arrival_time is None:
        return _dt.datetime.now(_dt.timezone.utc)
    if isinstance(arrival_time, _dt.datetime):
        return arrival_time if arrival_time.tzinfo else arrival_time.replace(tzinfo=_dt.timezone.utc)
    return _dt.datetime.fromtimestamp(float(arrival_time), _dt.timezone.utc)  # seconds since the epoch


def message_row(message: Message, *, address: str | None = None, arrival_time: Any = None, seq: int = 0) -> dict:
    """The archive row of a message.  `arrival_time`: datetime or epoch seconds (default now)."""
    h = message.header
    p = message.properties
    header = None if h is None else {f: _int_or_same(getattr(h, f)) for f in HEADER_FIELDS}
    properties = None
    if p is not None:
        properties = {}
        for f in PROPERTIES_FIELDS:
            v = getattr(p, f)
            if f in ("message_id", "correlation_id"):
                properties[f] = None if v is None else typed_value(v)
            elif f == "user_id":
                properties[f] = None if v is None else bytes(v)
            else:
                properties[f] = _int_or_same(v)
    return {
        "address": address,
        "arrival_time": _arrival(arrival_time),
        "seq": seq,
        "header": header,
        "delivery_annotations": _typed_map(message.delivery_annotations, "delivery_annotations"),
        "message_annotations": _typed_map(message.message_annotations, "message_annotations"),
        "properties": properties,
        "application_properties": _typed_map(message.application_properties, "application_properties"),
        "body": typed_value(message.body) if message.has_body else None,
        "encoded_size": message.encoded_size,
    }


def _int_or_same(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    return _text(v) if isinstance(v, str) else v


def _text(v: str) -> str:
    """`v` as a plain str that Parquet can store (UTF-8: no lone surrogates)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArchiveError(f"text {v[:40]!r} is not valid Unicode ({e.reason})") from None
    return str(v)


def row_message(row: Any) -> Message:
    """The message of an archive row (a dict, e.g. from `Table.to_pylist()` or `Row.asDict(True)`)."""
    m = Message()
    h = row.get("header")
    if h is not None:
        m.header = Header(
            durable=h.get("durable"),
            priority=None if h.get("priority") is None else t.ubyte(h["priority"]),
            ttl=None if h.get("ttl") is None else t.uint(h["ttl"]),
            first_acquirer=h.get("first_acquirer"),
            delivery_count=None if h.get("delivery_count") is None else t.uint(h["delivery_count"]),
        )
    p = row.get("properties")
    if p is not None:
        fields: dict[str, Any] = {}
        for f, kind in PROPERTIES_FIELDS.items():
            v = p.get(f)
            if v is None:
                continue
            if kind is None:
                fields[f] = value_of(v)
            elif kind == "binary":
                fields[f] = bytes(v)
            else:
                fields[f] = t.TYPE_CONSTRUCTORS[kind](v)
        m.properties = Properties(**fields)
    m.delivery_annotations = _map_of(row.get("delivery_annotations"), t.symbol)
    m.message_annotations = _map_of(row.get("message_annotations"), t.symbol)
    m.application_properties = _map_of(row.get("application_properties"), str)
    if row.get("body") is not None:
        m.body = value_of(row["body"])
    m.encoded_size = row.get("encoded_size")
    return m


def rows_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def rows_stream(rows: list[dict], schema: pa.Schema | None = None) -> bytes:
    """Rows as an Arrow IPC stream (what a Spark partition of live messages carries), cast to `schema`."""
    table = rows_table(rows)
    if schema is not None:
        table = table.cast(schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def stream_batches(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream made by `rows_stream`."""
    return pa.ipc.open_stream(data).read_all().to_batches()


# -------------------------------------------------------------------- files
class LocalListing:
    """The local filesystem, for `archive_files`.  A listing answers `kind(path)` ("file", "dir" or None
    when nothing is there) and `entries(directory)`: (name, path, is_directory) of each entry.  Spark's
    commands pass one that lists any Hadoop filesystem (broker_filter.spark.paths); this package does
    not import Spark."""

    def kind(self, path: str) -> str | None:
        return "file" if os.path.isfile(path) else "dir" if os.path.isdir(path) else None

    def entries(self, directory: str) -> Iterator[tuple[str, str, bool]]:
        with os.scandir(directory) as found:
            for entry in found:
                yield entry.name, entry.path, entry.is_dir()


def archive_files(path: str | os.PathLike, listing: Any = None) -> list[str]:
    """The published Parquet files of an archive (a file or a directory tree), sorted by path.
    Names starting with "." or "_" (files being written, Spark's `_temporary`, checkpoints) are
    skipped, directories included.  `listing`: where to look (default the local filesystem)."""
    listing = listing or LocalListing()
    path = os.fspath(path)
    kind = listing.kind(path)
    if kind == "file":
        return [path]
    if kind != "dir":
        raise ArchiveError(f"{path}: no such archive (file or directory)")
    found, todo = [], [path]
    while todo:
        for name, entry, is_dir in listing.entries(todo.pop()):
            if name.startswith((".", "_")):
                continue
            if is_dir:
                todo.append(entry)
            elif name.endswith(".parquet"):
                found.append(entry)
    return sorted(found)


def read_messages(path: str | os.PathLike) -> Iterator[tuple[dict, Message]]:
    """(row, message) for every message of an archive, file by file, in file order."""
    for name in archive_files(path):
        pf = pq.ParquetFile(name)
        for batch in pf.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield row, row_message(row)


def write_table(table: pa.Table, directory: str | os.PathLike, name: str | None = None) -> str:
    """Publish `table` as one Parquet file in `directory`, atomically.  Returns the final path."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    name = name or _file_name()
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, final)
    return final


_counter = 0
_counter_lock = threading.Lock()


def _file_name() -> str:
    global _counter
    with _counter_lock:
        _counter += 1
        n = _counter
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    return f"part-{stamp}-{os.getpid()}-{n:05d}.parquet"


class JournalWriter:
    """Appends messages to rolling Parquet files in `directory`; each file is published atomically.

    Thread-safe.  `append` buffers rows and writes a row group every `batch_rows` rows; a file is
    published (renamed into place) when it holds `max_bytes` or is `max_seconds` old — checked on
    every append and by `roll_if_due()`, which a daemon calls from a timer so a quiet journal still
    publishes — and by `close()`.  Messages still buffered when the process dies are lost; published
    files are never partial.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_bytes: int = 128 * 1024 * 1024,
        max_seconds: float = 300.0,
        batch_rows: int = 1000,
        clock: Any = time.monotonic,
    ):
        if max_bytes <= 0 or max_seconds <= 0 or batch_rows <= 0:
            raise ValueError("max_bytes, max_seconds and batch_rows must be positive")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.batch_rows = batch_rows
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: list[dict] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: str | None = None
        self._final: str | None = None
        self._opened = 0.0
        self._seq = 0
        self._closed = False
        self.published: list[str] = []

    def append(self, message: Message, address: str | None = None, arrival_time: Any = None) -> None:
        """Journal one message (arrival time defaults to now).  Raises ArchiveError for an unarchivable one."""
        row = message_row(message, address=address, arrival_time=arrival_time)
        with self._lock:
            if self._closed:
                raise ArchiveError("journal is closed")
            row["seq"] = self._seq
            self._seq += 1
            if self._writer is None:
                self._open()
            self._rows.append(row)
            if len(self._rows) >= self.batch_rows:
                self._flush()
            self._roll_if_due_locked()

    def roll_if_due(self) -> str | None:
        """Publish the current file if it is due by size or age; the published path or None."""
        with self._lock:
            return self._roll_if_due_locked()

    def flush(self) -> None:
        """Write buffered rows to the current (unpublished) file."""
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Publish what is buffered and stop.  Idempotent."""
        with self._lock:
            if not self._closed:
                self._publish()
                self._closed = True

    def __enter__(self) -> "JournalWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals (lock held)
    def _open(self) -> None:
        name = _file_name()
        self._final = os.path.join(self.directory, name)
        self._tmp = os.path.join(self.directory, f".{name}.tmp")
        self._writer = pq.ParquetWriter(self._tmp, SCHEMA, compression="zstd")
        self._opened = self._clock()

    def _flush(self) -> None:
        if self._rows and self._writer is not None:
            self._writer.write_table(rows_table(self._rows))
            self._rows = []

    def _size(self) -> int:
        try:
            return os.path.getsize(self._tmp) if self._tmp else 0
        except OSError:
            return 0

    def _roll_if_due_locked(self) -> str | None:
        if self._writer is None:
            return None
        if self._clock() - self._opened >= self.max_seconds:
            return self._publish()
        if self._rows and self._size() + 200 * len(self._rows) >= self.max_bytes:
            self._flush()
        if self._size() >= self.max_bytes:
            return self._publish()
        return None

    def _publish(self) -> str | None:
        if self._writer is None:
            return None
        self._flush()
        self._writer.close()
        self._writer = None
        os.replace(self._tmp, self._final)
        final, self._tmp, self._final = self._final, None, None
        self.published.append(final)
        return final


def import_jsonl(lines: Iterable[str], *, address: str | None = None) -> tuple[list[dict], list[tuple[int, str]]]:
    """Rows from JSON-lines text, and (line number, problem) for every line that could not be used.

    A line is a message in the JSON form, or an envelope {"address": A, "arrival_time": T,
    "message": M} with T in epoch milliseconds or ISO 8601.  Without a time, the message's
    creation-time is used, else the time of import.  Blank lines are skipped.
    """
    rows: list[dict] = []
    errors: list[tuple[int, str]] = []
    now = _dt.datetime.now(_dt.timezone.utc)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ArchiveError(f"not JSON: {e.msg} at column {e.colno}") from None
            addr, when = address, None
            if isinstance(obj, dict) and "message" in obj:
                extra = set(obj) - {"message", "address", "arrival_time"}
                if extra:
                    raise ArchiveError(f"unknown envelope field {sorted(extra)[0]!r}")
                addr = obj.get("address", address)
                if addr is not None and not isinstance(addr, str):
                    raise ArchiveError("address is a string")
                when = _parse_time(obj.get("arrival_time"))
                obj = obj["message"]
            message = Message.from_json(obj)
            if when is None:
                ct = message.properties.creation_time if message.properties is not None else None
                when = now if ct is None else _dt.datetime.fromtimestamp(int(ct) / 1000, _dt.timezone.utc)
            rows.append(message_row(message, address=addr, arrival_time=when, seq=number))
        except (ValueError, TypeError, OverflowError) as e:  # json, MessageFormatError, ArchiveError
            errors.append((number, str(e) or type(e).__name__))
    return rows, errors


def _parse_time(v: Any) -> _dt.datetime | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise ArchiveError("arrival_time is epoch milliseconds or ISO 8601 text")
    if isinstance(v, (int, float)):
        return _dt.datetime.fromtimestamp(v / 1000, _dt.timezone.utc)
    if isinstance(v, str):
        try:
            d = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise ArchiveError(f"arrival_time {v!r} is not ISO 8601") from None
        return d if d.tzinfo else d.replace(tzinfo=_dt.timezone.utc)
    raise ArchiveError("arrival_time is epoch milliseconds or ISO 8601 text")
