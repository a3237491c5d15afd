"""A queue with broker semantics for consumers with selectors: the oldest matching message, always.

Theory of operation
-------------------
Messages get a sequence number when they enter the queue and keep it until they are removed, so a
message that is released goes back exactly where it was.  `_entries` maps seq -> entry for every
message in the queue (available or out on a delivery); `_available` is the sorted set of seqs
nobody holds.

Every consumer keeps a **cursor**: the highest seq it has already looked at.  Invariant: every
available message with seq <= cursor is one this consumer cannot take (its filter is not TRUE, the
message is marked undeliverable for it, ...), except the seqs in the consumer's **recheck heap**.
Finding the next message for a consumer therefore means: pop the recheck heap (oldest first), then
walk the available seqs after the cursor, evaluating each one once.  A message becomes available
again (released, modified, an unsettled delivery returned by a detach) only through `_make_available`,
which pushes its seq onto the recheck heap of every consumer whose cursor already passed it.  Hence:

* a consumer always gets the **oldest** available message its filter accepts (rechecks are all
  older than anything after the cursor, and both are visited in ascending order);
* non-matching messages stay in place for other consumers, at any depth: there is no window;
* each (message, consumer) pair is evaluated once, plus once per return of the message; the cost of
  serving a consumer is amortized O(log n) per evaluation (sorted-list seek), and a consumer whose
  selector has an equality conjunct (`index.EqualityHint`) walks only its candidates:
  O(log n + candidates) per message found.

`dispatch(budget)` hands messages to consumers with credit in round-robin order and stops after
`budget` filter evaluations, reporting that work is left, so a long scan never blocks the event
loop; the next call resumes from the cursors.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Iterator

from sortedcontainers import SortedList

from .index import EqualityHint, PropertyIndex, equality_hint

_consumer_ids = itertools.count(1)
INDEX_BUILD_AT_ATTACH = 50_000  # deeper queues build a new index in steps during dispatch


HEAD_SECTIONS = frozenset(
    {"header", "delivery_annotations", "message_annotations", "properties", "application_properties"}
)


class Stored:
    """One published message, shared by reference by every queue it was routed to.

    `message` is what filters see without the body (decoded when the message is stored, so a
    selective consumer scanning a deep queue only evaluates); `full` adds the body, decoded on
    first use by a filter that reads it."""

    __slots__ = ("payload", "size", "address", "refs", "message", "_full", "_decode", "origin")

    def __init__(self, payload: Any, size: int, address: Any, message: Any = None,
                 decode: Callable[[Any, Any], Any] | None = None, origin: str | None = None):
        self.payload = payload
        self.size = size
        self.address = address  # the Address whose limits this message counts against
        self.refs = 0
        self._full = message
        self._decode = decode
        self.origin = origin
        if message is None and decode is not None:
            try:
                message = decode(payload, HEAD_SECTIONS)
            except Exception:  # malformed bytes: no filter matches, plain consumers still get it
                message = None
        self.message = message

    @property
    def full(self) -> Any:
        """The message with its body (None if it cannot be decoded)."""
        if self._full is None and self._decode is not None:
            decode, self._decode = self._decode, None
            try:
                self._full = decode(self.payload, None)
            except Exception:
                self._full = None
        return self._full

    def message_properties(self) -> Any:
        m = self.message
        return getattr(m, "application_properties", None) if m is not None else None


class Entry:
    """A stored message in one queue: its place (seq) and delivery state there."""

    __slots__ = ("seq", "stored", "queue", "holder", "delivery_count", "acquisitions", "excluded", "annotations")

    def __init__(self, seq: int, stored: Stored, queue: "Queue"):
        self.seq = seq
        self.stored = stored
        self.queue = queue
        self.holder: Consumer | None = None  # the consumer it is out to, if any
        self.delivery_count = 0  # failed delivery attempts (AMQP header delivery-count; released does not count)
        self.acquisitions = 0  # times handed to a consumer (first-acquirer is false after the first)
        self.excluded: set[int] | None = None  # consumer ids it is undeliverable to
        # message-annotations a modified outcome added for this queue's next deliveries (AMQP 1.0 3.4.5;
        # the stored message is shared with other queues, so it is merged when handed out)
        self.annotations: dict | None = None

    @property
    def message(self) -> Any:
        return self.stored.full

    @property
    def payload(self) -> Any:
        return self.stored.payload

    def __repr__(self) -> str:
        return f"<Entry {self.queue.name}#{self.seq}>"


class Consumer:
    """A receiver on one queue.  `context` belongs to whoever drives the broker (e.g. the link)."""

    __slots__ = ("id", "queue", "filter", "receiver", "credit", "cursor", "recheck", "hint",
                 "outstanding", "context", "name", "closed", "evaluations", "needs_body", "recheck_set",
                 "browse", "matches")

    def __init__(self, queue: "Queue", filter_: Any = None, receiver: Any = None, *,
                 context: Any = None, name: str | None = None, browse: bool = False):
        self.id = next(_consumer_ids)
        # A browser (distribution-mode copy on a queue): sees each message once, in order, without
        # acquiring it; its deliveries are copies and settling them changes nothing.
        self.browse = browse
        self.queue = queue
        self.filter = filter_
        self.receiver = receiver  # identity handed to Filter.evaluate (no-local)
        self.credit = 0
        self.cursor = -1
        self.recheck: list[int] = []  # seqs behind the cursor available again (min-heap) ...
        self.recheck_set: set[int] = set()  # ... and the same as a set, so a seq is queued once
        self.hint: EqualityHint | None = None
        self.outstanding: dict[int, Entry] = {}
        self.context = context
        self.name = name
        self.closed = False
        self.evaluations = 0
        self.matches = 0  # messages its filter selected
        self.needs_body = _needs_body(filter_)

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.queue.name}>"


def _needs_body(f: Any) -> bool:
    return f is not None and "body" in getattr(f, "reads", ("body",))


class Queue:
    """An ordered store of entries with competing consumers (see the module docstring)."""

    def __init__(self, name: str, address: Any, routing_type: str, *, filter_: Any = None,
                 filter_receiver: Any = None, durable: bool = False, shared: bool = True,
                 temporary: bool = False, on_removed: Callable[[Stored], None] | None = None):
        self.name = name
        self.address = address
        self.routing_type = routing_type
        self.filter = filter_  # queue filter: decides at enqueue (subscription selectors, no-local)
        self.filter_receiver = filter_receiver
        self.durable = durable
        self.shared = shared
        self.temporary = temporary
        self.pinned = False  # a temporary queue kept while its creator lives (a dynamic target)
        self.evaluations = 0  # messages its filter was evaluated on (`accepts`), and the ones it took
        self.matches = 0
        self.binding: str | None = None  # wildcard pattern this subscription queue is bound to
        self.consumers: list[Consumer] = []
        self.browsing = 0  # how many of them browse
        self._entries: dict[int, Entry] = {}
        self._available = SortedList()
        self._seq = itertools.count()
        self._rr = 0
        self._indexes: dict[str, PropertyIndex] = {}
        self._on_removed = on_removed
        self.bytes = 0
        self.dirty = False

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        return len(self._entries)

    @property
    def available(self) -> int:
        return len(self._available)

    def entries(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    # ------------------------------------------------------------------ messages
    def accepts(self, stored: Stored) -> bool:
        """The queue filter's verdict (True when the queue has none)."""
        if self.filter is None:
            return True
        f = self.filter
        self.evaluations += 1
        try:
            ok = f.evaluate(stored.full if _needs_body(f) else stored.message, self.filter_receiver) is True
        except Exception:  # a broken filter never takes the broker down: treat as no match
            return False
        self.matches += ok
        return ok

    def enqueue(self, stored: Stored) -> Entry:
        seq = next(self._seq)
        entry = Entry(seq, stored, self)
        self._entries[seq] = entry
        self._available.add(seq)
        stored.refs += 1
        self.bytes += stored.size
        if self._indexes:
            props = stored.message_properties()
            for index in self._indexes.values():
                index.add(seq, props)
        self.dirty = True
        return entry

    def _remove(self, entry: Entry) -> None:
        if self._entries.pop(entry.seq, None) is None:
            return
        self._available.discard(entry.seq)
        self.bytes -= entry.stored.size
        if self._indexes:
            props = entry.stored.message_properties()
            alive = self._entries.__contains__
            for index in self._indexes.values():
                index.discard(entry.seq, props, alive)
        entry.stored.refs -= 1
        if self._on_removed is not None:
            self._on_removed(entry.stored)

    def _make_available(self, entry: Entry) -> None:
        entry.holder = None
        seq = entry.seq
        self._available.add(seq)
        for c in self.consumers:
            if c.cursor >= seq and seq not in c.recheck_set and not c.browse:
                c.recheck_set.add(seq)
                heapq.heappush(c.recheck, seq)
        self.dirty = True

    def purge(self) -> int:
        """Remove every message nobody holds; returns how many."""
        removed = 0
        for seq in list(self._available):
            self._remove(self._entries[seq])
            removed += 1
        return removed

    # ------------------------------------------------------------------ consumers
    def add_consumer(self, consumer: Consumer) -> None:
        hint = equality_hint(consumer.filter)
        if hint is not None:
            index = self._indexes.get(hint.key)
            if index is None:
                index = self._indexes[hint.key] = PropertyIndex(hint.key, self._entries)
                if len(self._entries) <= INDEX_BUILD_AT_ATTACH:
                    index.build_step(self._entries, len(self._entries))
            index.users += 1
            consumer.hint = hint
        self.consumers.append(consumer)
        if consumer.browse:
            self.browsing += 1
        self.dirty = True

    def remove_consumer(self, consumer: Consumer, *, delivery_failed: bool = True) -> None:
        """Detach: the consumer's unsettled messages go back in place."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if consumer.browse:
                self.browsing -= 1
        consumer.closed = True
        if consumer.hint is not None:
            index = self._indexes.get(consumer.hint.key)
            if index is not None:
                index.users -= 1
                if index.users <= 0:
                    del self._indexes[consumer.hint.key]
            consumer.hint = None
        held = sorted(consumer.outstanding.values(), key=lambda e: e.seq)
        consumer.outstanding.clear()
        for entry in held:
            if entry.seq in self._entries:
                if delivery_failed:
                    entry.delivery_count += 1
                self._make_available(entry)

    # ------------------------------------------------------------------ outcomes
    def accept(self, consumer: Consumer, entry: Entry) -> None:
        consumer.outstanding.pop(entry.seq, None)
        self._remove(entry)

    def drop(self, consumer: Consumer | None, entry: Entry) -> None:
        """Remove without delivery (rejected): the caller dead-letters it if configured."""
        if consumer is not None:
            consumer.outstanding.pop(entry.seq, None)
        self._remove(entry)

    def release(self, consumer: Consumer, entry: Entry, *, delivery_failed: bool = False,
                undeliverable_here: bool = False) -> None:
        if consumer.outstanding.pop(entry.seq, None) is None or entry.seq not in self._entries:
            return
        if delivery_failed:
            entry.delivery_count += 1
        if undeliverable_here:
            if entry.excluded is None:
                entry.excluded = set()
            entry.excluded.add(consumer.id)
        self._make_available(entry)

    # ------------------------------------------------------------------ dispatch
    def _takes(self, consumer: Consumer, entry: Entry) -> bool:
        if entry.excluded is not None and consumer.id in entry.excluded:
            return False
        f = consumer.filter
        if f is None:
            return True
        consumer.evaluations += 1
        stored = entry.stored
        try:
            ok = f.evaluate(stored.full if consumer.needs_body else stored.message, consumer.receiver) is True
        except Exception:  # never let a broken filter stop the queue
            return False
        consumer.matches += ok
        return ok

    def _next_for(self, consumer: Consumer, budget: int) -> tuple[Entry | None, int, bool]:
        """(entry or None, evaluations spent, finished).  finished=False: budget ran out."""
        spent = 0
        entries = self._entries
        recheck = consumer.recheck
        while recheck:
            if spent >= budget:
                return None, spent, False
            seq = heapq.heappop(recheck)
            consumer.recheck_set.discard(seq)
            entry = entries.get(seq)
            if entry is None or entry.holder is not None:
                continue
            spent += 1
            if self._takes(consumer, entry):
                return entry, spent, True
        hint = consumer.hint
        if hint is not None and self._indexes[hint.key].ready:
            source = self._indexes[hint.key].candidates(hint.values, consumer.cursor)
            check_holder = True  # candidates include removed and held messages
        else:
            source = self._available.irange(minimum=consumer.cursor, inclusive=(False, True))
            check_holder = False
        # The hot loop of a deep scan: `_takes` inlined.
        f = consumer.filter
        evaluate = f.evaluate if f is not None else None
        receiver = consumer.receiver
        needs_body = consumer.needs_body
        cid = consumer.id
        scanned = 0
        found = None
        finished = True
        for seq in source:
            if spent + scanned >= budget:
                finished = False
                break
            entry = entries.get(seq)
            consumer.cursor = seq
            if entry is None or (check_holder and entry.holder is not None):
                continue  # removed (the index forgets lazily) or out on a delivery (comes back via recheck)
            excluded = entry.excluded
            if excluded is not None and cid in excluded:
                continue
            if evaluate is None:
                found = entry
                break
            scanned += 1
            stored = entry.stored
            try:
                verdict = evaluate(stored.full if needs_body else stored.message, receiver)
            except Exception:  # never let a broken filter stop the queue
                verdict = None
            if verdict is True:
                found = entry
                consumer.matches += 1
                break
        consumer.evaluations += scanned
        return found, spent + scanned, finished if found is None else True

    def dispatch(self, budget: int) -> tuple[list[tuple[Consumer, Entry]], int, bool]:
        """Hand available messages to consumers with credit, round robin.

        Returns (assignments, evaluations spent, finished).  Each assigned entry is out on a
        delivery to its consumer until `accept` / `release` / `drop` / `remove_consumer`."""
        self.dirty = False
        out: list[tuple[Consumer, Entry]] = []
        spent = 0
        if self._browsers:
            spent = self._browse(out, budget)
            if spent >= budget:
                self.dirty = True
                return out, spent, False
        if not self._available or not self.consumers:
            return out, spent, self._build_indexes(budget - spent)
        n = len(self.consumers)
        waiting = [c for c in self.consumers[self._rr % n:] + self.consumers[: self._rr % n]
                   if c.credit > 0 and not c.browse]
        while waiting and self._available:
            still = []
            for c in waiting:
                if not self._available:
                    break
                entry, used, finished = self._next_for(c, max(1, budget - spent))
                spent += used
                if not finished:
                    # A long scan yields: the next turn serves the other consumers first.
                    self._rr = (self.consumers.index(c) + 1) % n
                    self.dirty = True
                    return out, spent, False
                if entry is None:
                    continue  # nothing for this consumer until something changes
                self._available.remove(entry.seq)
                entry.holder = c
                entry.acquisitions += 1
                c.outstanding[entry.seq] = entry
                c.credit -= 1
                out.append((c, entry))
                self._rr = (self.consumers.index(c) + 1) % n
                if c.credit > 0:
                    still.append(c)
            waiting = still
        return out, spent, self._build_indexes(budget - spent)

    def _browse(self, out: list, budget: int) -> int:
        """Give each browser with credit the messages past its cursor that it selects, unacquired
        (held ones too: browsing sees what the queue holds); returns the evaluations spent."""
        spent = 0
        for c in self._browsers:
            if c.credit <= 0:
                continue
            for seq in list(self._entries):  # in seq order (inserted so)
                if seq <= c.cursor:
                    continue
                if c.credit <= 0 or spent >= budget:
                    break
                c.cursor = seq
                spent += 1
                if self._takes(c, self._entries[seq]):
                    c.credit -= 1
                    out.append((c, self._entries[seq]))
        return spent

    @property
    def _browsers(self) -> list:
        return [c for c in self.consumers if c.browse] if self.browsing else []

    def _build_indexes(self, budget: int) -> bool:
        """Spend what is left of a dispatch turn on indexes under construction; True when none is."""
        finished = True
        for index in self._indexes.values():
            if not index.ready:
                if budget > 0:
                    budget -= index.build_step(self._entries, budget)
                if not index.ready:
                    finished = False
        if not finished:
            self.dirty = True
        return finished
