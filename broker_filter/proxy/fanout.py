"""One upstream subscription shared by the daemon's subscription links on one address, without I/O.

Theory of operation
-------------------
Every non-durable, unnamed subscription link the daemon serves on one upstream address (with the
same pushed-down filters, on one upstream connection: one credential in pass-through) is an
`Outlet` of one `FanoutFeed`, and the feed is one upstream subscription (`sharing.feed_key` says
which links join).  Each upstream message is decoded once (the sections the members' filters
read), matched once against the group's `SubscriptionIndex` (`broker_filter.filters.index`:
candidates from equality / IN conjuncts, bindings and filtex values; the full filter decides) and
queued to each member that selects it.  A message no member selects is accepted upstream at once
(this subscription is the daemon's own).  A link joins the group when its attach is answered and
gets the messages that arrive from then on; the upstream subscription ends with the last link.

Per-member queues.  Each member has a queue of copies not yet sent, emptied as its client gives
credit.  The group pulls from upstream while some member in the group has credit, so the fastest
member sets the pace and the upstream queue buffers when every member is slow.  It keeps at most
`window` plus the upstream messages it takes to fill the smallest credit a member of the group
last gave (at most `max_credit`) outstanding: that credit times the *spread*, the messages received
per message some member selected, measured over the last `SPREAD_BLOCK` messages and at most
`MAX_SPREAD` (a filter that selects half the messages needs two upstream messages per unit of
client credit; the ones nobody selects are accepted on arrival and kept nowhere).  A member
selected by every message (spread 1) then queues at most `window` while its client's credit is
out, and a group whose clients give large credit is not held to a small pipeline.

Settlement.  An upstream message is shared by the members it was queued to (a reference count).
It is settled upstream once every one of them is done with its copy: accepted, unless every copy
was rejected (or modified undeliverable-here), then rejected with the first copy's error.  As on
a per-subscriber queue (RabbitMQ: a requeued message goes back to the queue it came from, which
only that subscriber reads), a client's `released` or `modified` (not undeliverable-here) puts its
copy back at the head of its own queue and it is sent again to that link (first-acquirer false;
delivery-count raised by `modified{delivery-failed}` only); it never goes to the other members,
which have their own copies.  A pre-settled link is done as the copy is sent; a link that leaves
is done with every copy it had (its subscription ends with it).

Slow members.  A member's queue holds at most `buffer` copies beyond the credit its client last
gave (what is on its way for that credit may arrive before the client takes it).  A member
selected by a message while its queue is full leaves the group: the feed asks the I/O layer for an upstream subscription
of the member's own (`FanoutIO.open_own`).  The member stays in the group (the index) until the
shared subscription delivers the first message its own subscription delivered (the *marker*,
compared byte for byte): a message before the marker in the shared stream was published before its
own subscription existed, so only the group has it for the member; the marker and everything after
it are in its own subscription too.  At the marker the member leaves the index and its own
subscription's messages queue behind the copies it still has: it receives every message once, in
order, when it gives credit, and the others never wait for it.  (Its queue grows past `buffer` by
what is published until the marker comes round: one publish after the attach.  Two messages with
identical bytes on either side of the attach could switch it early.)  It stays on its own
subscription until it detaches.

The I/O layer implements `FanoutIO` and calls the `on_*` methods; the feed has the interface of
`broker_filter.proxy.forwarding.Feed` that the I/O layer uses.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..amqp import redelivery_bytes
from ..filters.index import SubscriptionIndex
from .custody import (ACCEPTED, EVAL_MASK, EVAL_SAMPLE, MESSAGE_SIZE_EXCEEDED, UNDECODABLE as _BAD, FeedStats,
                      Outcome, Outlet, _ns, too_large)
from .forwarding import UpstreamCredit, decode_reads
from .upstream import ConsumerHandler

SPREAD_BLOCK = 256  # upstream messages per measure of the spread
MAX_SPREAD = 8.0  # the most upstream messages pulled per unit of client credit


class FanoutIO(Protocol):
    def send(self, outlet: Outlet, delivery: Any, data: bytes) -> Any:
        """Transfer `data` on the outlet's client link; return the client delivery tag."""

    def settle_upstream(self, delivery: Any, outcome: Outcome) -> None: ...

    def flow_upstream(self, n: int) -> None: ...

    def open_own(self, outlet: Outlet, handler: "OwnHandler") -> Any:
        """Open an upstream subscription for `outlet` alone (the group's address and pushed-down
        filters); return the consumer (`flow`, `settle`, `close`).  `handler` gets its events."""

    def lost_outlet(self, outlet: Outlet, condition: str, description: str) -> None:
        """The outlet's own subscription failed: close its client link with this error."""


@dataclass
class FanoutStats:
    messages: int = 0  # upstream messages matched against the index
    selected: int = 0  # (message, member) pairs selected
    departed: int = 0  # members that left the group for a subscription of their own


class _Shared:
    """One upstream message and the members that have not finished with their copy of it."""

    __slots__ = ("delivery", "message", "pending", "accepted", "error", "rejected", "own")

    def __init__(self, delivery: Any, message: Any, own: Any = None):
        self.delivery = delivery
        self.message = message
        self.pending = 0
        self.accepted = False  # some member accepted (or was done without a verdict)
        self.rejected = False
        self.error: tuple | None = None
        self.own = own  # the consumer of a member's own subscription it came from, or None


class _Copy:
    """A member's copy: the shared message and this member's redelivery state."""

    __slots__ = ("shared", "failed", "redelivered")

    def __init__(self, shared: _Shared):
        self.shared = shared
        self.failed = 0
        self.redelivered = False

    @property
    def delivery(self) -> Any:
        return self.shared.delivery

    def data(self) -> bytes:
        data = self.shared.delivery.data
        return redelivery_bytes(data, failed=self.failed) if self.redelivered else data


class _Member:
    __slots__ = ("outlet", "queue", "own", "attached", "marker", "held_own", "switched", "own_credit", "granted")

    def __init__(self, outlet: Outlet):
        self.outlet = outlet
        self.queue: deque[_Copy] = deque()
        self.own: Any = None  # the consumer of its own subscription, once it left the group
        self.attached = False  # its own subscription is attached
        self.marker: bytes | None = None  # the first message its own subscription delivered
        self.held_own: deque[_Copy] = deque()  # its own subscription's copies, until the switch
        self.switched = False  # out of the group: served by its own subscription only
        self.own_credit = 0  # credit outstanding on its own subscription
        self.granted = 0  # the credit its client last gave (at most the feed's max_credit)


class OwnHandler(ConsumerHandler):
    """The `ConsumerHandler` of a member's own subscription: routes its events to the feed."""

    __slots__ = ("feed", "outlet")

    def __init__(self, feed: "FanoutFeed", outlet: Outlet):
        self.feed = feed
        self.outlet = outlet

    def on_consumer_ready(self, consumer: Any, info: Any) -> None:
        self.feed.on_own_ready(self.outlet, consumer)

    def on_delivery(self, consumer: Any, delivery: Any) -> None:
        self.feed.on_own_delivery(self.outlet, consumer, delivery)

    def on_consumer_closed(self, consumer: Any, error: Any) -> None:
        self.feed.on_own_closed(self.outlet, consumer, error)


class FanoutFeed(UpstreamCredit):
    """The shared subscription of a group of outlets (see the module's text)."""

    subscription = True
    recycle = False
    custody = False
    moving = 0
    pass_open = False

    def __init__(self, io: FanoutIO, *, window: int = 100, buffer: int = 100, max_credit: int = 1000,
                 indexed: bool = True, cache_size: int = 1024, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None, counters: Any = None):
        if window < 1 or buffer < 1 or max_credit < 0:
            raise ValueError("window and buffer are at least 1, max_credit at least 0")
        self.io = io
        self.window = window
        self.buffer = buffer
        self.max_credit = max_credit
        # the credit last given by each member in the group: value -> members (its smallest value,
        # cached in _extra, None when to be found again, is what the group pulls beyond `window`)
        self._granted: Counter = Counter()
        self._extra: int | None = None
        self.index = SubscriptionIndex(indexed=indexed, cache_size=cache_size)
        self.members: dict[Outlet, _Member] = {}
        self.upstream_credit = 0
        self.spread = 1.0  # upstream messages per message some member selects (see the module doc)
        self._block = 0  # messages, and messages nobody selected, since the spread was last measured
        self._block_dropped = 0
        self.stopping = False
        self.stats = FeedStats()
        self.fanout = FanoutStats()
        self.eval_ns = 0  # the subscription index's sampled time, not yet shared among its members
        self._reads: frozenset = frozenset()
        self._read_counts: Counter = Counter()  # section -> members whose filter reads it
        self._eager: set[Outlet] = set()  # members in the group with credit (the group pulls for them)
        self._switching: set[_Member] = set()  # own subscription attached, waiting for their marker
        self._limited = 0  # members whose link has a max-message-size (0: no size check per message)
        self._clock = clock
        self._log = log
        self.counters = counters  # broker_filter.metrics.SharedCounters, or None
        self._counted = (0, 0, 0, 0, 0)  # the counts last added to them (see `publish_counts`)

    @property
    def outlets(self) -> dict[Outlet, _Member]:
        """The members' outlets (a dict: membership and removal in O(1), iteration in join order)."""
        return self.members

    def _count_reads(self, outlet: Outlet, delta: int) -> None:
        counts = self._read_counts
        changed = False
        for section in outlet.filter.reads:
            counts[section] += delta
            if counts[section] <= 0:
                del counts[section]
                changed = True
            elif counts[section] == delta:
                changed = True
        if changed:
            self._reads = frozenset(counts)

    @property
    def held(self) -> list:
        return []  # nothing waits for a queue search here

    @property
    def grouped(self) -> int:
        """Members served by the shared subscription (not yet moved to their own)."""
        return sum(1 for m in self.members.values() if not m.switched)

    # ------------------------------------------------------------------ outlets
    def add_outlet(self, outlet: Outlet) -> None:
        if outlet in self.members:
            return
        self.members[outlet] = _Member(outlet)
        outlet.shared_base = self.fanout.messages
        if outlet.max_size:
            self._limited += 1
        self._grant(None, 0)
        self._count(outlet)
        self.index.register(outlet, outlet.filter, outlet.receiver)
        self._count_reads(outlet, +1)
        if self.counters is not None:
            self.counters.subscribers.inc()
        self._top_up()

    def returns(self) -> list:
        """What goes back upstream when the feed ends: nothing held here is unacquired (each copy is
        settled with its outcome as its members decide)."""
        return []

    def count_filters(self) -> None:
        """Bring the members' filter counts up to date: each was evaluated (by the index) on every
        message of the subscription since it joined; the index's time is shared among them."""
        messages = self.fanout.messages
        share = self.eval_ns // max(1, len(self.members))
        for o, m in self.members.items():
            base = o.shared_base if o.shared_base is not None else messages
            if not m.switched:  # (one served by its own subscription counts there)
                o.evaluated += messages - base
            o.shared_base = messages
            o.eval_ns += share
        self.eval_ns = 0 if self.members else self.eval_ns

    def remove_outlet(self, outlet: Outlet) -> None:
        """The link is gone, and its subscription with it: every copy it had is done."""
        if outlet in self.members:
            self.count_filters()
        m = self.members.pop(outlet, None)
        if m is None:
            return
        if outlet.max_size:
            self._limited -= 1
        self._switching.discard(m)
        if not m.switched:
            self._grant(m.granted, None)
        if self.counters is not None and not m.switched:
            self.counters.subscribers.dec()
        self.index.unregister(outlet)
        self._eager.discard(outlet)
        self._count_reads(outlet, -1)
        copies = list(outlet.in_flight.values()) + list(m.queue)
        outlet.in_flight.clear()
        m.queue.clear()
        m.held_own.clear()  # (its own subscription's: they go back with it)
        outlet.credit = 0
        outlet.waiting_since = None
        for c in copies:
            if c.shared.own is None:
                self._done(c.shared, None)
        if m.own is not None:
            m.own.close()  # what it had not settled goes back to its own subscription, which ends
            m.own = None
        self._top_up()

    def set_credit(self, outlet: Outlet, credit: int) -> None:
        outlet.credit = max(0, credit)
        m = self.members.get(outlet)
        if m is None or self.stopping:
            return
        if not m.switched:
            granted = min(outlet.credit, self.max_credit)
            if granted != m.granted:
                self._grant(m.granted, granted)
                m.granted = granted
        self._drain(m)
        self._top_up_own(m)
        self._top_up()

    def _grant(self, old: int | None, new: int | None) -> None:
        """A member of the group's last credit changes from `old` to `new` (None: it joins, leaves)."""
        counts = self._granted
        if old is not None:
            counts[old] -= 1
            if counts[old] <= 0:
                del counts[old]
                if old == self._extra:
                    self._extra = None
        if new is not None:
            counts[new] += 1
            if self._extra is not None and new < self._extra:
                self._extra = new

    def poke(self) -> None:
        pass

    def tick(self) -> None:
        """Called by the I/O layer about once a second: the broker's word on the credit (see
        `UpstreamCredit`), and the index's counts go to the metrics."""
        if not self.stopping:
            self._take_broker_word()
        self.publish_counts()

    def _upstream_received(self) -> int:
        return self.fanout.messages

    def publish_counts(self) -> None:
        """Add what the index counted since the last call to the metrics (once a second, not per
        message: five metric updates a message would cost more than matching it)."""
        c = self.counters
        if c is None:
            return
        index = self.index
        now = (self.fanout.messages, index.candidates_total, index.evaluations_total, index.cache_lookups,
               index.cache_hits)
        for counter, value, last in zip((c.messages, c.candidates, c.evaluations, c.cache_lookups, c.cache_hits),
                                        now, self._counted):
            if value > last:
                counter.inc(value - last)
        self._counted = now

    def stop(self) -> None:
        self.stopping = True

    def on_own(self) -> list[Outlet]:
        """The members served by an upstream subscription of their own (slow ones, `_depart`)."""
        return [o for o, m in self.members.items() if m.own is not None]

    def close(self) -> list[Any]:
        """Forget everything; returns the shared subscription's deliveries still unsettled (closing
        the upstream consumer returns them).  Members' own subscriptions are closed."""
        if self.counters is not None:
            self.counters.subscribers.dec(self.grouped)
            self.publish_counts()
        out: list[Any] = []
        seen: set[int] = set()
        for m in self.members.values():
            for c in list(m.outlet.in_flight.values()) + list(m.queue):
                if c.shared.own is None and id(c.shared) not in seen:
                    seen.add(id(c.shared))
                    out.append(c.shared.delivery)
            m.outlet.in_flight.clear()
            m.queue.clear()
            if m.own is not None:
                m.own.close()
                m.own = None
        self.members.clear()
        self._eager.clear()
        self._switching.clear()
        self.stopping = True
        return out

    def longest_wait(self) -> float:
        since = [o.waiting_since for o in self.outlets if o.waiting_since is not None and o.credit > 0]
        return self._clock() - min(since) if since else 0.0

    # ------------------------------------------------------------------ the shared subscription
    def on_upstream_delivery(self, delivery: Any) -> None:
        self.upstream_credit = max(0, self.upstream_credit - 1)
        if self._switching:
            for m in [m for m in self._switching if m.marker is not None and m.marker == delivery.data]:
                self._switch(m)
        message = decode_reads(delivery.data, self._reads, self.stats, self._log)
        self.fanout.messages += 1
        index = self.index
        if message is _BAD:
            selected = [o for o in self.outlets if not o.filter.reads]
            index.messages += 1
        elif self.fanout.messages & EVAL_MASK == 1:
            # the index's time, shared among its members by `count_filters`
            t = _ns()
            selected = index.match(message)
            self.eval_ns += (_ns() - t) * EVAL_SAMPLE
        else:
            selected = index.match(message)
        for o in selected:
            o.matched += 1
        self._block += 1
        if not selected:
            self._block_dropped += 1
        if self._block >= SPREAD_BLOCK:
            kept = self._block - self._block_dropped
            self.spread = min(MAX_SPREAD, self._block / kept) if kept else MAX_SPREAD
            self._block = self._block_dropped = 0
        if not selected:
            self.stats.filtered += 1
            self.io.settle_upstream(delivery, ACCEPTED)
            self._top_up()
            return
        members = self.members
        targets = [members[o] for o in selected]
        if self._limited:
            size = len(delivery.data)
            fits = [m for m in targets if not m.outlet.max_size or size <= m.outlet.max_size]
            if len(fits) < len(targets):
                limit = max(m.outlet.max_size for m in targets if m not in fits)
                self._too_large(size, limit)
                if not fits:  # every copy rejected: so is the message, for this subscription
                    self.io.settle_upstream(delivery, too_large(size, limit))
                    self._top_up()
                    return
                targets = fits
        shared = _Shared(delivery, message)
        self.fanout.selected += len(targets)
        shared.pending = len(targets)
        for m in targets:
            m.queue.append(_Copy(shared))
            self._drain(m)
            if len(m.queue) > self.buffer + m.granted and m.own is None:
                self._depart(m)
        self._top_up()

    def _too_large(self, size: int, limit: int) -> None:
        """A member's copy larger than its link's max-message-size: never sent, counted, logged (the
        upstream message is rejected with amqp:link:message-size-exceeded when no member takes it)."""
        self.stats.too_large += 1
        if self._log is not None:
            self._log(f"a {size}-byte message is larger than the max-message-size {limit} of a "
                      f"subscription link: not sent to it ({MESSAGE_SIZE_EXCEEDED})")

    def _depart(self, m: _Member) -> None:
        """A slow member leaves: its own subscription is opened; it stays in the group until the
        shared subscription delivers the first message its own one delivered (`_switch`)."""
        self.fanout.departed += 1
        if self._log is not None:
            self._log(f"link {m.outlet.name} is {len(m.queue)} messages behind: it continues on a "
                      "subscription of its own")
        m.own = self.io.open_own(m.outlet, OwnHandler(self, m.outlet))

    # ------------------------------------------------------------------ a member's own subscription
    def on_own_ready(self, outlet: Outlet, consumer: Any) -> None:
        m = self.members.get(outlet)
        if m is None or m.own is not consumer:
            return
        m.attached = True
        self._switching.add(m)
        # enough credit for the first message that marks the switch (more once switched)
        m.own_credit = self.buffer
        consumer.flow(self.buffer)

    def _switch(self, m: _Member) -> None:
        """The shared subscription delivered the member's marker: every message before it in the
        shared stream was published before the member's own subscription existed (it had them from
        the group), every one from it on is in its own subscription too.  From here on it is served by
        its own subscription only."""
        self._switching.discard(m)
        m.switched = True
        self._grant(m.granted, None)
        self.index.unregister(m.outlet)
        self._eager.discard(m.outlet)
        if self.counters is not None:
            self.counters.subscribers.dec()
        m.queue.extend(m.held_own)
        m.held_own.clear()
        self._drain(m)
        self._top_up_own(m)

    def on_own_delivery(self, outlet: Outlet, consumer: Any, delivery: Any) -> None:
        m = self.members.get(outlet)
        if m is None or m.own is not consumer:
            return
        m.own_credit = max(0, m.own_credit - 1)
        shared = _Shared(delivery, self._decode(delivery, outlet.filter.reads), own=consumer)
        if shared.message is _BAD:
            ok = not outlet.filter.reads
        else:
            try:
                ok = outlet.filter.evaluate(shared.message, outlet.receiver) is True
            except Exception:
                ok = False
            outlet.evaluated += 1
            outlet.matched += ok
        if not m.switched and m.marker is None:
            m.marker = delivery.data
        if ok and outlet.max_size and len(delivery.data) > outlet.max_size:
            self._too_large(len(delivery.data), outlet.max_size)
            consumer.settle(delivery, too_large(len(delivery.data), outlet.max_size))
        elif not ok:
            consumer.settle(delivery, ACCEPTED)
            self.stats.filtered += 1
        elif not m.switched:
            shared.pending = 1
            m.held_own.append(_Copy(shared))
        else:
            shared.pending = 1
            m.queue.append(_Copy(shared))
            self._drain(m)
        self._top_up_own(m)

    def on_own_closed(self, outlet: Outlet, consumer: Any, error: Any) -> None:
        m = self.members.get(outlet)
        if m is None or m.own is not consumer:
            return
        m.own = None
        self.remove_outlet(outlet)
        condition = (error.condition if error is not None else None) or "amqp:link:detach-forced"
        description = (error.description if error is not None else None) or "the link's upstream subscription ended"
        self.io.lost_outlet(outlet, condition, description)

    def _top_up_own(self, m: _Member) -> None:
        if not m.switched or m.own is None or self.stopping:
            return
        want = m.outlet.credit - len(m.queue) - m.own_credit
        if want > 0:
            m.own_credit += want
            m.own.flow(want)

    # ------------------------------------------------------------------ clients
    def on_client_outcome(self, outlet: Outlet, tag: Any, outcome: Outcome) -> None:
        c = outlet.in_flight.pop(tag, None)
        if c is None:
            return
        m = self.members.get(outlet)
        if c.shared.own is not None:
            # From the member's own subscription: the outcome is the upstream's, as on any subscription.
            c.shared.own.settle(c.shared.delivery, outcome)
            if m is not None:
                self._top_up_own(m)
            return
        if outcome.kind in ("released", "modified") and not outcome.undeliverable_here and m is not None:
            # Back to the head of this member's own queue: a copy never goes to another member.
            if outcome.kind == "modified" and outcome.delivery_failed:
                c.failed += 1
            c.redelivered = True
            m.queue.appendleft(c)
            self._drain(m)
            return
        self._done(c.shared, outcome)
        self._top_up()

    def _done(self, shared: _Shared, outcome: Outcome | None) -> None:
        """A member is done with its copy (outcome None: without a verdict, e.g. it left)."""
        if outcome is None or outcome.kind == "accepted":
            shared.accepted = True
        elif not shared.rejected:
            shared.rejected = True
            shared.error = outcome.error
        shared.pending -= 1
        if shared.pending <= 0:
            if shared.accepted or not shared.rejected:
                self.io.settle_upstream(shared.delivery, ACCEPTED)
            else:
                self.io.settle_upstream(shared.delivery, Outcome("rejected", error=shared.error))

    # ------------------------------------------------------------------ sending
    def pump(self) -> None:
        if self.stopping:
            return
        for m in self.members.values():
            if m.queue and m.outlet.credit > 0:
                self._drain(m)
            self._top_up_own(m)
        self._top_up()

    def _drain(self, m: _Member) -> None:
        o = m.outlet
        if self.stopping:
            return
        while m.queue and o.credit > 0:
            c = m.queue.popleft()
            tag = self.io.send(o, c.shared.delivery, c.data())
            if c.redelivered:
                self.stats.redelivered += 1
            o.credit -= 1
            o.delivered += 1
            self.stats.delivered += 1
            if o.presettled:
                if c.shared.own is not None:
                    c.shared.own.settle(c.shared.delivery, ACCEPTED)
                else:
                    self._done(c.shared, ACCEPTED)
            else:
                o.in_flight[tag] = c
        o.waiting_since = (o.waiting_since or self._clock()) if o.credit > 0 and not m.queue else None
        self._count(o, m)

    def _count(self, o: Outlet, m: _Member | None = None) -> None:
        if o.credit > 0 and not (m or self.members[o]).switched:
            self._eager.add(o)
        else:
            self._eager.discard(o)

    def _top_up(self) -> None:
        """Pull while a member in the group has credit, keeping at most `window` plus the smallest
        credit a member of the group last gave outstanding; once
        every member has a subscription of its own, pull to consume what nobody here takes any more
        (the shared subscription lives until its last link leaves)."""
        if self.stopping:
            return
        if not self._eager and (len(self.index) or not self.members):
            return
        extra = self._extra
        if extra is None:
            extra = self._extra = min(self._granted) if self._granted else 0
        target = self.window + int(extra * self.spread)
        room = target - self.upstream_credit
        if room > 0 and (self.upstream_credit == 0 or room * 4 >= target):
            self.upstream_credit += room
            self.io.flow_upstream(room)

    def _decode(self, delivery: Any, reads: frozenset | None = None) -> Any:
        return decode_reads(delivery.data, self._reads if reads is None else reads, self.stats, self._log)

    # ------------------------------------------------------------------ counters
    def index_stats(self) -> dict[str, float]:
        return self.index.stats()
