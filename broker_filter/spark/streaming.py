"""Live AMQP traffic for Structured Streaming: the receiver behind the `broker-filter` source.

Theory of operation: one proton connection per streaming query, on a thread of the process that
plans the query's micro-batches (Spark's driver-side source runner), receives from one address.
Each message is decoded (broker_filter.amqp), filtered, and kept as an archive row
(docs/archive.md) together with its unsettled delivery.  A micro-batch takes up to
`maxMessagesPerTrigger` buffered rows and numbers them with the stream offset (`seq`); its
deliveries are accepted upstream only when Spark commits the batch (the source's `commit`), so a
query that dies before committing leaves them unsettled and the broker delivers them again
(at-least-once).  Credit keeps at most two batches' worth of messages held (the batch awaiting its
commit, which Spark sends only once it has planned the next batch, and the buffer filling the next
one).

The filter: a selector (or the selector entries of a filter-set) goes into the attach source when
the peer's open frame offers `APACHE.ORG:SELECTOR` or `APACHE.ORG:JMS_FILTERS` (a broker-filter
daemon) and the dialect is `jms`; the peer then filters (push-down).  Everything else is evaluated
here with the filter core; a message it does not select is accepted at once (it is not part of the
stream, and releasing it would only bring it back).

No pyspark here: `broker_filter.spark.datasource` wraps this in Spark's data source API.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

from proton import Condition, Delivery
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector, Selector

from ..archive.parquet import ArchiveError, message_row
from ..amqp import CodecError, decode_message
from ..filters import FilterError, compile_filter_set, compile_selector
from .replay import Target, parse_target

log = logging.getLogger("broker_filter.spark.streaming")

SELECTOR_CAPS = frozenset({"APACHE.ORG:SELECTOR", "APACHE.ORG:JMS_FILTERS"})


class StreamError(RuntimeError):
    """The AMQP side of a streaming query failed: what, where."""


class OptionError(ValueError):
    """A bad option of the source or sink: which one, and why."""

    def __init__(self, what: str, option: str, problem: str):
        super().__init__(f"{what}: option '{option}': {problem}")
        self.option = option
        self.problem = problem


def target_of(options: Any, what: str) -> Target:
    """The connection URL and address of the `url` / `address` options.  Raises OptionError."""
    url = (options.get("url") or "").strip()
    if not url:
        raise OptionError(what, "url", "required (amqp://host:port)")
    address = options.get("address")
    if address:
        url = f"{url.rstrip('/')}/{quote(address, safe='/:')}"
    try:
        return parse_target(url)
    except ValueError as e:
        raise OptionError(what, "url" if not address else "address", str(e)) from None


def positive(options: Any, key: str, default: Any, what: str, kind: type = int) -> Any:
    """Option `key` as a positive int (or float: seconds), `default` when absent.  Raises OptionError."""
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = kind(str(raw).strip())
    except ValueError:
        value = 0
    if not value > 0:
        noun = "integer" if kind is int else "number of seconds"
        raise OptionError(what, key, f"must be a positive {noun}, got {raw!r}")
    return value


@dataclass(frozen=True)
class StreamFilter:
    """What a source selects: the compiled filter, and the selector text the peer may evaluate."""

    filter: Any  # core Filter / FilterSet, or None for every message
    pushable: str | None  # selector text to put in the attach source (jms dialect only)
    rest: Any  # what stays to evaluate here when `pushable` is pushed down (None: nothing)


def stream_filter(options: Any, what: str = "broker-filter source") -> StreamFilter:
    """The `selector` or `filter` (JSON filter-set) and `dialect` options, compiled.  Raises OptionError
    with the option, the problem and, for a selector, the line and column."""
    dialect = options.get("dialect") or "jms"
    selector, filter_set = options.get("selector"), options.get("filter")
    if selector is not None and filter_set is not None:
        raise OptionError(what, "filter", "give either 'selector' or 'filter', not both")
    try:
        if selector is not None and selector.strip():
            compiled = compile_selector(selector, dialect)
            return StreamFilter(compiled, selector if dialect == "jms" else None, None)
        if filter_set is not None:
            fs = compile_filter_set(filter_set, dialect)
            if fs.ignored:
                first = fs.ignored[0]
                raise OptionError(what, "filter", f"entry {str(first.key)!r}: {first.reason}")
            selectors = [e for e in fs.entries if e.kind == "selector" and isinstance(e.text, str)]
            if not fs.entries:
                return StreamFilter(None, None, None)
            if dialect == "jms" and len(selectors) == 1:
                rest = fs.subset(lambda e: e is not selectors[0])
                return StreamFilter(fs, selectors[0].text, rest if rest.entries else None)
            return StreamFilter(fs, None, None)
    except FilterError as e:
        option = "selector" if selector is not None else "filter"
        describe = getattr(e, "describe", None)
        raise OptionError(what, option, describe() if describe else str(e)) from None
    except KeyError:
        raise OptionError(what, "dialect", f"unknown dialect {dialect!r} (jms, artemis, rocketmq)") from None
    return StreamFilter(None, None, None)


class Receiver:
    """Receives from one address on a background thread and holds what it received, unsettled.

    Thread-safe: `take`, `settle` and `close` are called from the query's planning thread; proton
    objects are touched only on the receiver's own thread."""

    def __init__(
        self,
        target: Target,
        selection: StreamFilter,
        *,
        batch: int,
        timeout: float = 30.0,
        name: str = "broker-filter-source",
    ):
        self.target = target
        self.selection = selection
        self.batch = batch
        self.cap = 2 * batch  # most messages held: buffered + batched and awaiting the commit
        self.timeout = timeout
        self.name = name
        self.error: str | None = None
        self.pushed_down: bool | None = None  # known once the link is attached
        self.local_filter: Any = selection.filter
        self.counts = {"received": 0, "matched": 0, "skipped": 0, "unreadable": 0, "accepted": 0}
        self._cond = threading.Condition()
        self._buffer: list[tuple[int, dict]] = []  # (tag, row) in arrival order
        self._held = 0  # buffered + taken, not yet settled
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._attached = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._injector: Any = None

    # ----------------------------------------------------------------- planning-thread side
    def start(self) -> "Receiver":
        self._injector = EventInjector()
        handler = _Handler(self)
        container = Container(handler)
        container.selectable(self._injector)
        self._thread = threading.Thread(target=self._run, args=(container,), name=self.name, daemon=True)
        self._thread.start()
        if not self._attached.wait(self.timeout):
            self.close()
            raise StreamError(f"broker-filter source {self._where()}: no link after {self.timeout:.0f} s")
        self.check()
        return self

    def check(self) -> None:
        if self.error is not None:
            raise StreamError(f"broker-filter source {self._where()}: {self.error}")

    def take(self, limit: int, wait: float = 0.0) -> list[tuple[int, dict]]:
        """Up to `limit` buffered (tag, row) pairs, oldest first; waits up to `wait` seconds for `limit`."""
        deadline = time.monotonic() + wait
        with self._cond:
            while len(self._buffer) < limit and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.1))
            taken, self._buffer = self._buffer[:limit], self._buffer[limit:]
        self.check()
        return taken

    def settle(self, tags: list[int], wait: float | None = None) -> None:
        """Accept these deliveries upstream (on the receiver thread); with `wait`, until it is done."""
        if not tags:
            return
        done = threading.Event()
        self._call(lambda handler: (handler.accept(tags), done.set()))
        deadline = time.monotonic() + (wait or 0.0)
        while wait is not None and not done.wait(0.05) and self.error is None and time.monotonic() < deadline:
            pass

    def close(self) -> None:
        """Close the connection: the broker takes back every message not yet settled."""
        if self._closed:
            return
        self._closed = True
        self._call(lambda handler: handler.shutdown())
        if self._thread is not None:
            self._thread.join(10)

    # ----------------------------------------------------------------- receiver-thread side
    def _where(self) -> str:
        return f"{self.target.url}/{self.target.address}"

    def _call(self, fn: Callable[["_Handler"], Any]) -> None:
        self._calls.put(fn)
        if self._injector is not None:
            self._injector.trigger(ApplicationEvent("bf_calls"))

    def _run(self, container: Any) -> None:
        try:
            container.run()
        except Exception as e:  # an error escaping a callback ends the reactor: report it
            self._fail(f"receiver stopped: {e}")
        if self.error is None and not self._closed:
            self._fail("receiver stopped")

    def _fail(self, why: str) -> None:
        with self._cond:
            if self.error is None:
                self.error = why
            self._cond.notify_all()
        self._attached.set()

    def _add(self, tag: int, row: dict) -> None:
        with self._cond:
            self._buffer.append((tag, row))
            self._held += 1
            self._cond.notify_all()

    def _released_held(self, n: int) -> None:
        with self._cond:
            self._held -= n


def _condition_text(cond: Any) -> str:
    if cond is None:
        return ""
    return f"{cond.name}: {cond.description}" if cond.description else str(cond.name)


class _Handler(MessagingHandler):
    """Proton events of a Receiver (on its thread)."""

    def __init__(self, owner: Receiver):
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.owner = owner
        self.container: Any = None
        self.connection: Any = None
        self.link: Any = None
        self.deliveries: dict[int, Any] = {}
        self.next_tag = 0

    def on_start(self, event: Any) -> None:
        o = self.owner
        self.container = event.container
        self.connection = event.container.connect(o.target.url, reconnect=False, idle_timeout=o.timeout)

    def on_connection_opened(self, event: Any) -> None:
        o = self.owner
        offered = {str(c) for c in (event.connection.remote_offered_capabilities or ())}
        options = None
        if o.selection.pushable is not None and offered & SELECTOR_CAPS:
            options = Selector(o.selection.pushable)
            o.pushed_down = True
            o.local_filter = o.selection.rest
        else:
            o.pushed_down = False
        self.link = event.container.create_receiver(self.connection, o.target.address, name=o.name, options=options)

    def on_link_opened(self, event: Any) -> None:
        if event.link == self.link:
            self.flow()
            self.owner._attached.set()

    def on_link_error(self, event: Any) -> None:
        self.fail(f"link refused: {_condition_text(event.link.remote_condition)}")

    def on_link_closed(self, event: Any) -> None:
        if not self.owner._closed:
            self.fail(f"link closed by the peer {_condition_text(event.link.remote_condition)}".rstrip())

    def on_connection_error(self, event: Any) -> None:
        self.fail(f"connection closed: {_condition_text(event.connection.remote_condition)}")

    def on_transport_error(self, event: Any) -> None:
        self.fail(f"connection failed: {_condition_text(event.transport.condition)}")

    def on_disconnected(self, event: Any) -> None:
        if not self.owner._closed:
            cond = event.transport.condition if event.transport is not None else None
            self.fail(f"connection failed: {_condition_text(cond)}" if cond is not None else "disconnected")

    def on_bf_calls(self, event: Any) -> None:
        while True:
            try:
                fn = self.owner._calls.get_nowait()
            except queue.Empty:
                return
            fn(self)

    def on_delivery(self, event: Any) -> None:
        dlv, link = event.delivery, event.link
        if not link.is_receiver or dlv.partial or not dlv.readable:
            return
        data = link.recv(dlv.pending)
        link.advance()
        o = self.owner
        o.counts["received"] += 1
        arrival = time.time()
        try:
            message = decode_message(data)
            keep = o.local_filter is None or o.local_filter.evaluate(message) is True
            row = message_row(message, address=o.target.address, arrival_time=arrival) if keep else None
        except Exception as e:  # CodecError, ArchiveError, or any fault of this one message
            o.counts["unreadable"] += 1
            known = isinstance(e, (CodecError, ArchiveError))
            why = str(e) if known else "the message cannot be decoded"
            log.warning("%s: message refused: %s", o._where(), why, exc_info=not known)
            dlv.local.condition = Condition("amqp:decode-error", f"broker-filter source: {why}")
            dlv.update(Delivery.REJECTED)
            dlv.settle()
            self.flow()
            return
        if row is None:
            o.counts["skipped"] += 1
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            self.flow()
            return
        o.counts["matched"] += 1
        tag = self.next_tag
        self.next_tag += 1
        self.deliveries[tag] = dlv
        o._add(tag, row)

    def accept(self, tags: list[int]) -> None:
        n = 0
        for tag in tags:
            dlv = self.deliveries.pop(tag, None)
            if dlv is not None:
                dlv.update(Delivery.ACCEPTED)
                dlv.settle()
                n += 1
        self.owner.counts["accepted"] += n
        self.owner._released_held(n)
        self.flow()

    def flow(self) -> None:
        """Top credit up so that held messages plus outstanding credit stay within the cap."""
        link, o = self.link, self.owner
        if link is None or o._closed:
            return
        want = o.cap - o._held - link.credit
        if want >= max(1, o.batch // 2) or (want > 0 and link.credit == 0):
            link.flow(want)

    def shutdown(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        if self.owner._injector is not None:
            self.owner._injector.close()
        if self.container is not None:
            self.container.stop()

    def fail(self, why: str) -> None:
        self.owner._fail(why)
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        if self.container is not None:
            self.container.stop()
