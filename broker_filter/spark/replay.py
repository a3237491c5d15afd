"""Replay: send an archive's matching messages, in arrival order, to an AMQP address.

Theory of operation: Spark selects the matching rows (the compiled selector, TRUE only) after the
saved position and sorts them by (arrival_time, seq, file); the driver streams them in order
(`toLocalIterator`), re-encodes each archived message exactly (broker_filter.amqp) and sends it
with python-qpid-proton, keeping up to `window` deliveries unsettled.  A message counts only when
the receiver accepts it; the position saved in the state file is the last message of the
contiguous accepted prefix, so a replay stopped at any point (rejection, release, lost connection,
Ctrl-C) resumes after the last confirmed message and sends nothing confirmed twice (messages in
flight when it stopped are sent again: at-least-once).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlsplit

from ..archive.parquet import row_message
from ..amqp import encode_message
from .compile import CompiledSelector
from .paths import is_uri, local_path
from .sqlexpr import lit

STATE_VERSION = 1


class ReplayError(RuntimeError):
    """Replay stopped: what happened, and how far it got."""


@dataclass
class Target:
    url: str  # connection URL without the address
    address: str


def parse_target(url: str) -> Target:
    """amqp[s]://[user:password@]host[:port]/address -> connection URL and address."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ValueError(f"{url!r}: expected amqp://host[:port]/address (or amqps://)")
    address = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not address:
        raise ValueError(f"{url!r}: no address after host:port (amqp://host:port/address)")
    try:
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        raise ValueError(f"{url!r}: bad port") from None
    auth = ""
    if parts.username:
        auth = parts.username + (f":{parts.password}" if parts.password else "") + "@"
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return Target(f"{parts.scheme}://{auth}{host}:{port}", address)


# ----------------------------------------------------------------------------- resumable state
@dataclass
class ReplayState:
    path: str
    identity: dict  # what is being replayed (archive, selector, dialect, destination)
    sent: int = 0
    position: list | None = None  # [arrival micros, seq, file] of the last confirmed message
    done: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: str, identity: dict) -> "ReplayState":
        """The saved state for this replay, or a fresh one.  Refuses a state file of another replay."""
        if not os.path.exists(path):
            return cls(path, identity)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: unreadable replay state ({e})") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: not a replay state file of this version")
        if data.get("identity") != identity:
            raise ValueError(
                f"{path}: belongs to another replay ({data.get('identity')}); use --restart or another --state"
            )
        return cls(path, identity, int(data.get("sent", 0)), data.get("position"), bool(data.get("done")))

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(
                {"version": STATE_VERSION, "identity": self.identity, "sent": self.sent, "position": self.position,
                 "done": self.done},
                f,
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def archive_identity(archive: str) -> str:
    """The archive as a replay's identity names it: a URI as given, a plain path made absolute."""
    return archive if is_uri(archive) else os.path.abspath(archive)


def default_state_path(archive: str, identity: dict) -> str:
    """`.replay-<id>.json` in the archive's directory when the archive is local (a plain path or a
    `file:` URI), else in the current directory: the state file is the driver's, written locally."""
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    local = local_path(archive) if is_uri(archive) else archive
    if local is not None and os.path.isdir(local):
        base = local
    elif local is not None and os.path.isfile(local):
        base = os.path.dirname(os.path.abspath(local))
    else:
        base = os.curdir
    return os.path.join(base, f".replay-{digest}.json")


# ----------------------------------------------------------------------------- Spark side
def matching_rows(frame: Any, compiled: CompiledSelector, position: list | None) -> Any:
    """Matching rows after `position`, sorted in arrival order, with the position columns."""
    from pyspark.sql import functions as F

    frame = frame.withColumn("__file", F.input_file_name())
    frame = frame.withColumn("__micros", F.expr("unix_micros(arrival_time)"))
    matched = compiled.where(frame)
    if position is not None:
        micros, seq, name = position
        t, s, n = lit(int(micros)).sql, lit(int(seq)).sql, lit(str(name)).sql
        matched = matched.where(
            f"`__micros` > {t} OR (`__micros` = {t} AND (seq > {s} OR (seq = {s} AND `__file` > {n})))"
        )
    return matched.orderBy("__micros", "seq", "__file")


def row_stream(frame: Any) -> Iterator[tuple[list, bytes]]:
    """(position, encoded message) for each row, in the frame's order."""
    for row in frame.toLocalIterator(prefetchPartitions=True):
        d = row.asDict(recursive=True)
        message = row_message(d)
        if not message.has_body:
            message.body = b""  # AMQP requires a body section: an empty data section
        yield [d["__micros"], d["seq"], d["__file"]], encode_message(message)


# ----------------------------------------------------------------------------- AMQP side
def send_all(
    target: Target,
    items: Iterator[tuple[list, bytes]],
    on_confirmed: Callable[[list], None],
    *,
    window: int = 200,
    timeout: float = 30.0,
) -> int:
    """Send every item, keeping up to `window` unsettled; `on_confirmed(position)` in order for each
    accepted one.  Returns the number confirmed; raises ReplayError when the receiver refuses a
    message or the connection fails (what was confirmed before stays confirmed)."""
    from proton import Delivery
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    class Replayer(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
            self.items = items
            self.exhausted = False
            self.next_index = 0
            self.in_flight: dict[Any, int] = {}
            self.positions: dict[int, list] = {}
            self.accepted: set[int] = set()
            self.committed = 0  # indexes below this are confirmed and reported
            self.error: str | None = None
            self.connection = None
            self.sender = None
            self.last_progress = time.monotonic()

        def on_start(self, event: Any) -> None:
            self.container = event.container
            self.connection = event.container.connect(target.url, reconnect=False, idle_timeout=timeout)
            self.sender = event.container.create_sender(self.connection, target.address)
            self.timer = event.container.schedule(timeout, self)

        def on_timer_task(self, event: Any) -> None:
            if self.error is None and self.connection is not None:
                if time.monotonic() - self.last_progress >= timeout:
                    self.fail(f"no confirmation for {timeout:.0f} s")
                    return
                self.timer = event.container.schedule(timeout, self)

        def on_sendable(self, event: Any) -> None:
            self.pump()

        def pump(self) -> None:
            sender = self.sender
            if sender is None:
                return
            while not self.exhausted and self.error is None and sender.credit > 0 and len(self.in_flight) < window:
                try:
                    position, data = next(self.items)
                except StopIteration:
                    self.exhausted = True
                    break
                dlv = sender.delivery(str(self.next_index).encode())
                sender.stream(data)
                sender.advance()
                self.in_flight[dlv] = self.next_index
                self.positions[self.next_index] = position
                self.next_index += 1
            self.maybe_finish()

        def on_accepted(self, event: Any) -> None:
            index = self.in_flight.pop(event.delivery, None)
            if index is None:
                return
            self.last_progress = time.monotonic()
            self.accepted.add(index)
            while self.committed in self.accepted:
                self.accepted.discard(self.committed)
                on_confirmed(self.positions.pop(self.committed))
                self.committed += 1
            self.pump()

        def on_rejected(self, event: Any) -> None:
            cond = event.delivery.remote.condition
            self.fail(f"message {self.committed + 1} of this run was rejected" + (f": {cond.description}" if cond else ""))

        def on_released(self, event: Any) -> None:
            state = "modified" if event.delivery.remote_state == Delivery.MODIFIED else "released"
            self.fail(f"the receiver {state} a message instead of accepting it")

        def on_settled(self, event: Any) -> None:
            if event.delivery in self.in_flight:  # settled with no outcome we understand
                self.fail(f"a message was settled without being accepted (state {event.delivery.remote_state})")

        def on_link_error(self, event: Any) -> None:
            cond = event.link.remote_condition
            self.fail(f"link refused: {cond.name if cond else ''} {cond.description if cond else ''}".strip())

        def on_connection_error(self, event: Any) -> None:
            cond = event.connection.remote_condition
            self.fail(f"connection closed: {cond.name if cond else ''} {cond.description if cond else ''}".strip())

        def on_transport_error(self, event: Any) -> None:
            cond = event.transport.condition
            self.fail(f"transport error: {cond.name if cond else ''} {cond.description if cond else ''}".strip())

        def on_disconnected(self, event: Any) -> None:
            if not self.finished():
                self.fail("disconnected")

        def finished(self) -> bool:
            return self.exhausted and not self.in_flight

        def maybe_finish(self) -> None:
            if self.finished() and self.connection is not None:
                self.close()

        def fail(self, why: str) -> None:
            if self.error is None:
                self.error = why
            self.close()
            self.container.stop()  # do not wait for a peer that may be gone

        def close(self) -> None:
            if self.connection is not None:
                self.connection.close()
                self.connection = None
                self.sender = None
            if getattr(self, "timer", None) is not None:
                self.timer.cancel()
                self.timer = None

    handler = Replayer()
    container = Container(handler)
    try:
        container.run()
    except Exception as e:  # an error escaping a callback unwinds run(): report it, keep what was confirmed
        handler.error = handler.error or f"{type(e).__name__}: {e}"
    if handler.error is not None:
        raise ReplayError(f"{handler.error} (confirmed {handler.committed} in this run)")
    if not handler.finished():
        raise ReplayError(f"stopped before the end (confirmed {handler.committed} in this run)")
    return handler.committed
