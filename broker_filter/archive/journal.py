"""The daemon's journal: accepted messages appended to rolling Parquet files for the Spark pipeline.

Theory of operation: `Journal.record` runs on the proxy's event-loop thread for every message a
client published that the upstream accepted, so it does only what is cheap there: it matches the
address against the configured patterns (AMQ wildcards, results cached per address), stamps the
arrival time and puts the raw bytes on a bounded in-memory queue.  One writer thread takes them off,
decodes them (`amqp.decode_message`), and appends them to an `archive.JournalWriter`, which writes a
row group every `batch_rows` rows (or `flush_bytes` of message bytes) and publishes each file
atomically when it reaches `roll_bytes` or `roll_seconds`; the thread also checks the age of the
open file whenever it is idle, so a quiet journal still publishes.

Nothing here raises into the caller.  A message the archive cannot hold, an I/O error, a full queue
(the event loop is never blocked: the message is dropped) or a record after `close` is counted in
`failed` (and in `failures` by kind) and logged once per kind.  After an I/O error the open file is
abandoned — the messages it held are counted as failed — and the next message starts a new file, so
the journal recovers once the disk does.  Invariant once the queue is drained:
`recorded + skipped + failed == ` the number of `record` calls.

Guarantee: published files are always complete; messages still queued, buffered or in the open file
when the process dies are lost (at most `roll_seconds` of traffic, plus the queue).  `close()`
publishes everything recorded before it.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable

from .. import amqp
from .parquet import ArchiveError, JournalWriter
from ..filters.wildcards import WildcardTrie

log = logging.getLogger("broker_filter.journal")

_ROUTING_PREFIXES = ("anycast://", "multicast://")
_FQQN_SEPARATOR = "::"

# failure kinds, as counted in Journal.failures
UNDECODABLE = "undecodable"  # the bytes are not an AMQP message
UNARCHIVABLE = "unarchivable"  # the archive cannot hold the message (e.g. a ulong annotation key)
IO = "io"  # the directory or a file could not be written
QUEUE_FULL = "queue-full"  # the writer thread is behind; dropped rather than block the event loop
CLOSED = "closed"  # recorded after close()
INTERNAL = "internal"  # anything else (a bug): logged with its traceback

_MESSAGES = {
    UNDECODABLE: "journal: a message could not be decoded and was not journaled",
    UNARCHIVABLE: "journal: a message the archive cannot hold was not journaled",
    IO: "journal: writing the journal failed; the open file's messages are lost, a new file is started",
    QUEUE_FULL: "journal: the writer is behind and its queue is full; messages are dropped",
    CLOSED: "journal: a message was recorded after the journal was closed",
    INTERNAL: "journal: unexpected error while journaling a message",
}


def address_part(name: str) -> str:
    """The address of a node name: without an `anycast://`/`multicast://` prefix or an FQQN `::queue`."""
    for prefix in _ROUTING_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if _FQQN_SEPARATOR in name:
        name = name.split(_FQQN_SEPARATOR, 1)[0]
    return name


class _Drain:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


class Journal:
    """Records accepted messages into a directory of Parquet files; see the module docstring.

    Thread-safe: `record`, `tick`, `drain` and `close` may be called from any thread; the daemon
    calls `record` from its event loop.  Counters (`recorded`, `skipped`, `failed`, `failures`)
    are read without locking and are exact once `drain()` or `close()` has returned.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        addresses: Iterable[str] = (),
        roll_bytes: int = 64 * 1024 * 1024,
        roll_seconds: float = 300.0,
        batch_rows: int = 1000,
        flush_bytes: int = 8 * 1024 * 1024,
        queue_messages: int = 10_000,
        queue_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ):
        if roll_bytes <= 0 or roll_seconds <= 0 or batch_rows <= 0 or flush_bytes <= 0:
            raise ValueError("roll_bytes, roll_seconds, batch_rows and flush_bytes must be positive")
        if queue_messages <= 0 or queue_bytes <= 0:
            raise ValueError("queue_messages and queue_bytes must be positive")
        self.directory = os.fspath(directory)
        self.patterns = tuple(address_part(a) for a in addresses if address_part(a))
        self._trie: WildcardTrie | None = None
        if self.patterns:
            self._trie = WildcardTrie(".")
            for p in self.patterns:
                self._trie.add(p, p, True)
        self.roll_bytes = roll_bytes
        self.roll_seconds = roll_seconds
        self.batch_rows = batch_rows
        self.flush_bytes = flush_bytes
        self.queue_messages = queue_messages
        self.queue_bytes = queue_bytes
        self._clock = clock

        # Each counter is written by one thread only (so no lock): the caller's or the writer's.
        self.recorded = 0
        self._skipped = [0, 0]  # [by record(), by the writer (anonymous links: the message's `to`)]
        self._failures = (collections.Counter(), collections.Counter())  # (by record(), by the writer)
        self._logged: set[str] = set()

        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0
        self._tick = False
        self._closing = False
        self._closed = False

        # writer-thread state
        self._writer: JournalWriter | None = None
        self._unpublished = 0  # messages in the open (not yet published) file
        self._unflushed_bytes = 0
        self.published: list[str] = []

        self._thread = threading.Thread(target=self._run, name="broker-filter-journal", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, journal_config: Any, **options: Any) -> "Journal | None":
        """A started Journal for the `[journal]` configuration section; None when it is disabled."""
        if not journal_config.enabled:
            return None
        return cls(
            journal_config.directory,
            addresses=journal_config.addresses,
            roll_bytes=journal_config.roll_bytes,
            roll_seconds=journal_config.roll_seconds,
            **options,
        )

    # ------------------------------------------------------------------ caller side
    @property
    def skipped(self) -> int:
        """Messages on addresses the journal does not record."""
        return self._skipped[0] + self._skipped[1]

    @property
    def failures(self) -> dict[str, int]:
        """Messages not journaled, by kind (UNDECODABLE, UNARCHIVABLE, IO, QUEUE_FULL, CLOSED, INTERNAL)."""
        return dict(self._failures[0] + self._failures[1])

    @property
    def failed(self) -> int:
        return sum(self._failures[0].values()) + sum(self._failures[1].values())

    @property
    def queued(self) -> int:
        """Messages waiting for the writer thread."""
        return len(self._queue)

    def wants(self, address: str | None) -> bool:
        """True if messages on `address` are journaled (None: decided from the message's `to`)."""
        if self._trie is None or address is None:
            return True
        return bool(self._trie.match(address_part(address)))

    def record(self, address: str | None, data: bytes, arrival_time: Any = None) -> None:
        """Journal one accepted message (its encoded bytes).  Never raises; never blocks on I/O.

        `address`: the address it was published to (None on an anonymous link: the message's `to`
        is used).  `arrival_time`: datetime or epoch seconds; default now.
        """
        try:
            if address is not None and self._trie is not None and not self._trie.match(address_part(address)):
                self._skipped[0] += 1
                return
            if arrival_time is None:
                arrival_time = time.time()
            size = len(data)
            with self._cond:
                if self._closing:
                    kind = CLOSED
                elif len(self._queue) >= self.queue_messages or (
                    self._queue and self._queued_bytes + size > self.queue_bytes
                ):
                    kind = QUEUE_FULL
                else:
                    self._queue.append((address, data, arrival_time))
                    self._queued_bytes += size
                    if len(self._queue) == 1:
                        self._cond.notify()
                    return
            self._fail(kind, None, side=0)
        except Exception as e:  # never into the event loop
            self._fail(INTERNAL, e, side=0)

    def tick(self) -> None:
        """Ask the writer thread to publish the open file if it is due.  Cheap; never blocks on I/O.

        Optional: the writer thread also checks whenever it is idle (at least every second).
        """
        with self._cond:
            if not self._tick:
                self._tick = True
                self._cond.notify()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every message recorded before this call has been handled; False on timeout.

        Handled means appended to the open file (or counted as failed), not published.
        """
        marker = _Drain()
        with self._cond:
            if self._closed:
                return True
            self._queue.append(marker)
            self._cond.notify()
        return marker.event.wait(timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Write what is queued, publish the open file and stop the writer thread.  Idempotent.

        Blocks up to `timeout` seconds (call it on shutdown, after the last `record`); False if the
        writer did not finish in time (it keeps going in the background).
        """
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writer thread
    def _fail(self, kind: str, error: BaseException | None, count: int = 1, side: int = 1) -> None:
        self._failures[side][kind] += count
        if kind not in self._logged:
            self._logged.add(kind)
            detail = f": {error}" if error is not None else ""
            log.warning(
                "%s%s (further %s failures are only counted)",
                _MESSAGES[kind],
                detail,
                kind,
                exc_info=error if kind == INTERNAL else None,
            )

    def _idle_wait(self) -> float:
        return min(1.0, self.roll_seconds / 2)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._tick and not self._closing:
                    self._cond.wait(self._idle_wait())
                batch = list(self._queue)
                self._queue.clear()
                self._queued_bytes = 0
                tick, self._tick = self._tick, False
                closing = self._closing
            drained = []
            for item in batch:
                if isinstance(item, _Drain):
                    drained.append(item)
                else:
                    try:
                        self._write(*item)
                    except Exception as e:  # the writer thread must outlive any one message
                        self._fail(INTERNAL, e)
            if self._unflushed_bytes >= self.flush_bytes:
                self._guard(self._flush)
            if not batch or tick:
                self._guard(self._roll_if_due)
            for marker in drained:
                marker.event.set()
            if closing:
                with self._cond:
                    if self._queue:  # recorded while the batch was written
                        continue
                    self._closed = True
                    rest = [m for m in self._queue if isinstance(m, _Drain)]
                self._guard(self._publish)
                for marker in rest:
                    marker.event.set()
                return

    def _write(self, address: str | None, data: bytes, arrival_time: Any) -> None:
        try:
            message = amqp.decode_message(data)
        except amqp.CodecError as e:
            self._fail(UNDECODABLE, e)
            return
        except Exception as e:
            self._fail(INTERNAL, e)
            return
        if address is None:
            to = message.properties.to if message.properties is not None else None
            address = None if to is None else str(to)
            if address is not None and not self.wants(address):
                self._skipped[1] += 1
                return
        else:
            address = address_part(address)
        try:
            writer = self._open()
            before = len(writer.published)
            writer.append(message, address=address, arrival_time=arrival_time)
        except ArchiveError as e:
            self._fail(UNARCHIVABLE, e)
            return
        except OSError as e:
            self._abandon(e, current=1)
            return
        except Exception as e:
            self._fail(INTERNAL, e)
            return
        self.recorded += 1
        self._unpublished += 1
        self._unflushed_bytes += len(data)
        self._published_since(writer, before)

    def _open(self) -> JournalWriter:
        if self._writer is None:
            self._writer = JournalWriter(
                self.directory,
                max_bytes=self.roll_bytes,
                max_seconds=self.roll_seconds,
                batch_rows=self.batch_rows,
                clock=self._clock,
            )
            self._unpublished = 0
            self._unflushed_bytes = 0
        return self._writer

    def _published_since(self, writer: JournalWriter, before: int) -> None:
        if len(writer.published) > before:
            self.published.extend(writer.published[before:])
            self._unpublished = 0
            self._unflushed_bytes = 0

    def _guard(self, step: Callable[[], None]) -> None:
        try:
            step()
        except OSError as e:
            self._abandon(e)
        except Exception as e:
            self._fail(INTERNAL, e)

    def _flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._unflushed_bytes = 0

    def _roll_if_due(self) -> None:
        if self._writer is not None:
            before = len(self._writer.published)
            self._writer.roll_if_due()
            self._published_since(self._writer, before)

    def _publish(self) -> None:
        if self._writer is not None:
            before = len(self._writer.published)
            self._writer.close()
            self._published_since(self._writer, before)
            self._writer = None

    def _abandon(self, error: OSError, current: int = 0) -> None:
        """After an I/O error: drop the open file (its messages are lost) so the next message starts anew."""
        lost = self._unpublished
        writer, self._writer = self._writer, None
        self._unpublished = 0
        self._unflushed_bytes = 0
        if writer is not None:
            _discard(writer)
        self.recorded -= lost
        self._fail(IO, error, count=current + lost)


def _discard(writer: JournalWriter) -> None:
    """Best effort: close an abandoned writer's hidden file and remove it (it is never published)."""
    pq_writer = getattr(writer, "_writer", None)
    tmp = getattr(writer, "_tmp", None)
    try:
        if pq_writer is not None:
            pq_writer.close()
    except Exception:
        pass
    if tmp:
        try:
            os.remove(tmp)
        except OSError:
            pass
