"""Per-link forwarding state, without I/O: credit, custody of upstream deliveries, settlement,
held messages, redelivery in place, and the moves of the search of a queue for waiting links (whose
decisions are in `broker_filter.proxy.search`).

Theory of operation
-------------------
A `Feed` is one upstream consumer.  It serves one or more `Outlet`s (client receiving links):

* subscription feed (topic, exchange binding, multicast, client capability `topic`): one outlet,
  or the links of one named shared subscription; the upstream keeps a copy per subscription, so a
  message no outlet's filter selects is settled upstream as `accepted` (consumed for this
  subscription only).  Which links share a feed is decided in `broker_filter.proxy.sharing`.
* queue feed: every client link on the same queue (and the same pushed-down filters) shares the feed,
  like consumers with selectors on a broker queue.  Each message goes to one outlet whose filter
  selects it and which has credit, round robin.  A message no outlet can take now is *held*
  unsettled, in arrival order, and offered again whenever an outlet gets credit or attaches.

Custody (queue feeds).  The feed keeps every upstream delivery until a client settles it.  A client
that releases a message, or whose link goes (detach, closed connection, crash) with deliveries
unsettled, gives them back to the feed, not to the upstream: each is offered at once to the other
outlets whose filters select it, as a redelivery (first-acquirer false; delivery-count raised by a
detach or `modified{delivery-failed}`, not by `released`, AMQP 1.0 3.2.1 and 3.4; only that
delivery's header is re-encoded), and otherwise held like any message.  Accepted and rejected go
upstream; nothing else does while the feed lives.  Closing the feed returns everything.

Credit flows from the clients: the feed grants upstream credit only while at least one outlet has
credit, and keeps  held + moving + outstanding upstream credit <= min(sum of outlet credit,
max_credit) + window, so the proxy never holds more than that many messages per feed (a client's
returned deliveries come on top: at most its credit); with no client credit it pulls nothing.

The search (queue feeds with `recycle`).  A message that no outlet can take blocks the ones behind
it on a broker that cannot filter.  While an outlet waits with credit, the feed moves the messages
no outlet selects to the queue's tail, each copy marked with the filters it was offered to and the
pass that moved it, until a copy it moved comes round.  The theory, and every decision of the search
(what a pass is, when one opens and ends, what is moved and what is held, when to look again, count
the queue, go round or hand back), are in `broker_filter.proxy.search` (`QueueSearch`, the feed's
`search`); the feed does the moving (`broker_filter.proxy.moving`, a base class of `Feed`): it
publishes the marked copy through the I/O layer and accepts the original once the broker accepted
the copy.

Stopping (`stop`): no move starts, nothing more is pulled or sent; moves in flight finish (the I/O
layer waits for `moving` to reach 0, bounded by its grace) and their originals are accepted; then
`close` returns what is held.

The I/O layer implements `FeedIO` and calls the `on_*` methods; decisions come back as calls on it.
The records (`Outcome`, `Outlet`, `Custody`, `FeedStats`, `FeedIO`) are in `broker_filter.proxy.custody`.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import Any, Callable

from ..amqp.types import symbol
from ..amqp import CodecError, decode as _decode_value, decode_message, set_message_annotation
from ..amqp.sections import annotations_section
from .custody import (ACCEPTED, DELIVERY_FAILED, EVAL_MASK, EVAL_SAMPLE, MESSAGE_SIZE_EXCEEDED, RELEASED,
                      UNACQUIRED, UNDECODABLE, _NO_MARK, _ns, Custody, FeedIO, FeedStats, Outcome, Outlet,
                      filter_identity, too_large)
from .moving import OFFERED_ANNOTATION, QueueMoves, mark_section
from .search import QueueSearch

# The feed side's records are in `custody` (a leaf); the rest of the proxy takes them from here.
__all__ = ["ACCEPTED", "DELIVERY_FAILED", "EVAL_MASK", "EVAL_SAMPLE", "MESSAGE_SIZE_EXCEEDED", "OFFERED_ANNOTATION",
           "RELEASED", "STREAM_OFFSET", "UNACQUIRED", "UNDECODABLE", "Custody", "Feed", "FeedIO", "FeedStats",
           "Outcome", "Outlet", "UpstreamCredit", "decode_reads", "filter_identity", "mark_section", "too_large"]

_BAD = UNDECODABLE
# RabbitMQ 4's annotation on each message delivered from a stream (its offset in the stream)
STREAM_OFFSET = b"x-stream-offset"


def decode_reads(data: bytes, reads: frozenset, stats: FeedStats, log: Callable[[str], None] | None) -> Any:
    """The sections of an upstream message that `reads` names (None when no filter reads any), or
    UNDECODABLE, counted and logged: one message never fails a feed, and no filter that reads a
    section selects it."""
    if not reads:
        return None
    try:
        return decode_message(data, reads)
    except Exception as e:  # CodecError, or any decoder fault
        return _undecodable(e, stats, log)


def _undecodable(e: Exception, stats: FeedStats, log: Callable[[str], None] | None) -> Any:
    """UNDECODABLE, for an upstream message whose decoding raised `e`: counted and logged."""
    stats.undecodable += 1
    if log is not None:
        kind = "" if isinstance(e, CodecError) else f" ({type(e).__name__})"
        log(f"upstream message not decodable{kind}, no filter selects it: {e}")
    return UNDECODABLE


class UpstreamCredit:
    """`on_upstream_credit` for a feed with `upstream_credit` and `_top_up` (this module's `Feed`
    and the shared subscription's `FanoutFeed`)."""

    upstream_credit: int
    _broker_word: tuple[int, int] | None = None  # (credit the broker's last flow left, deliveries then)

    def _top_up(self) -> None: ...

    def _upstream_received(self) -> int:
        """How many upstream deliveries the feed has had."""
        raise NotImplementedError

    def on_upstream_credit(self, credit: int) -> None:
        """The upstream link's credit as a flow from the broker left it.  Noted here and taken at the
        next `tick` if no delivery came in between and it is lower than the feed's own count:
        credit the broker used up without delivering (a drain, or its own accounting, as RabbitMQ
        3.10 does) is then no longer counted as outstanding, or the feed would wait for messages
        that never come.  Not at once: RabbitMQ 3.10 answers every flow with one, and re-granting
        on each answer made it send far beyond the credit (rabbitmq-server#2597), thousands of
        messages past the feed's bound."""
        self._broker_word = (credit, self._upstream_received())

    def _take_broker_word(self) -> None:
        """(from `tick`) Take the broker's word on the credit if nothing arrived since it."""
        word, self._broker_word = self._broker_word, None
        if word is not None and word[1] == self._upstream_received() and word[0] < self.upstream_credit:
            self.upstream_credit = max(0, word[0])
            self._top_up()


class Feed(QueueMoves, UpstreamCredit):
    def __init__(
        self,
        io: FeedIO,
        *,
        subscription: bool,
        window: int = 100,
        max_credit: int = 1000,
        recycle: bool = False,
        custody: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        token: str = "",
        foreign_ttl: float = 60.0,
        look_again: float = 10.0,
        look_again_max: float = 600.0,
        log: Callable[[str], None] | None = None,
    ):
        if window < 1 or max_credit < 1:
            raise ValueError("window and max_credit are at least 1")
        self.io = io
        self.subscription = subscription
        self.stream = False  # the queue turned out to be a stream (`_check_stream`)
        # `modified{undeliverable-here}` from a client goes upstream, which dead-letters it (RabbitMQ 4)
        self.dead_letters = False
        self._unchecked = not subscription  # whether the next delivery is checked for being a stream's
        self.on_stream: Callable[[], None] | None = None  # told once the feed knows it reads a stream
        self.window = window
        self.max_credit = max_credit
        self.recycle = recycle and not subscription
        # Keep what clients give back (an upstream that redelivers in place itself, with the
        # history in the header, gets it back instead: the embedded broker).
        self.custody = custody and not subscription
        self.outlets: list[Outlet] = []
        self.held: deque[Custody] = deque()
        self.upstream_credit = 0
        self.moving = 0
        self.stopping = False
        self.stats = FeedStats()
        self._rr = 0
        # The search's state and decisions (queue feeds with `recycle`; see broker_filter.proxy.search)
        self._sections: dict[tuple, bytes] = {}  # mark -> its encoded message-annotations section
        self.search = QueueSearch(token=token, window=window, clock=clock, wall=wall, foreign_ttl=foreign_ttl,
                                  look_again=look_again, look_again_max=look_again_max,
                                  encode=partial(mark_section, self._sections))
        self._reads: frozenset = frozenset()
        self._clock = clock
        self._nobody = False  # the last `_offer` found that no outlet selects the message
        # Most messages of a pass carry the same annotations (the same mark): what was read of them,
        # by their bytes.
        self._marks_read: dict[bytes | None, Any] = {}
        self._merged: dict = {}  # set_message_annotation's cache of merged annotation sections
        # The upstream refused a move for want of room (its publisher has no credit): no more tries
        # until the next pump (its credit pumps the feed), so a backlog is not re-marked per message.
        self._no_room = False
        self._offers = 0  # changes when an outlet gains credit or the filters change (see `pump`)
        # Grant upstream credit only once the last grant is used up: for RabbitMQ 3.x, which resets
        # its queue's credit on every flow while deliveries are on their way and so sends beyond it
        # (rabbitmq-server#2597): frequent small grants during a search made it send thousands of
        # messages past the feed's bound.  Set by the I/O side when it knows the upstream.
        self.whole_grants = False
        self._pulled_total = 0  # upstream deliveries had (the search's count of the queue nets them out)
        self._log = log

    # ------------------------------------------------------------------ outlets
    def add_outlet(self, outlet: Outlet) -> None:
        self.outlets.append(outlet)
        self._filters_changed(added=True)  # (a new filter: one more search)
        self.pump()

    def remove_outlet(self, outlet: Outlet) -> None:
        """The client link is gone.  Queue: its unsettled deliveries are offered to the other
        outlets as redeliveries (a failed attempt each), else held.  Subscription: they go back
        upstream as failed attempts."""
        if outlet not in self.outlets:
            return
        self.outlets.remove(outlet)
        self._filters_changed()
        returned = list(outlet.in_flight.values())
        outlet.in_flight.clear()
        outlet.credit = 0
        outlet.waiting_since = None
        if not self.custody:
            for c in returned:
                self.io.settle_upstream(c.delivery, DELIVERY_FAILED)
        else:
            for c in returned:
                c.failed += 1
            self._take_back(returned, outlet.name)
        self.pump()

    def set_credit(self, outlet: Outlet, credit: int) -> None:
        had = outlet.credit
        outlet.credit = max(0, credit)
        if had <= 0 < outlet.credit:
            self._offers += 1  # a link that was passed over may select what is held
            if self.search.deferred and not self.stopping:
                self.search.credit(outlet.identity)  # (messages it selects were moved: one more pass)
        self.pump()

    def poke(self) -> None:
        """A message was published to this queue through the proxy: the search goes on at least until
        a copy moved after it comes round (a new pass: the end of the current one may lie before it)."""
        if self.recycle and not self.stopping and not self.search.published():
            self.pump()

    def _filters_changed(self, added: bool = False) -> None:
        self._offers += 1
        self._reads = frozenset().union(*(o.filter.reads for o in self.outlets))
        self.search.filters(frozenset(o.identity for o in self.outlets), added)

    # ------------------------------------------------------------------ upstream events
    def on_upstream_delivery(self, delivery: Any) -> None:
        self.upstream_credit = max(0, self.upstream_credit - 1)
        self._pulled_total += 1
        if self._unchecked:
            self._check_stream(delivery.data)
        search = self.search
        before = search.pass_no
        c = self._custody(delivery)
        if self.subscription:
            self._subscription_delivery(c)
        elif not self._offer(c, frozenset()):
            self._place(c)
        if search.pass_no != before:  # a new pass: what is held goes round too
            self.pump()
            return
        self._top_up()

    def _check_stream(self, data: bytes) -> None:
        """The first delivery of a queue feed tells whether its queue is a stream: RabbitMQ 4 puts
        the message annotation `x-stream-offset` on what it delivers from one.  A stream keeps every
        message for every consumer, each at its own offset: the feed then reads and skips as a
        subscription does (a message no link selects is settled, which takes nothing from the
        stream), and never moves or republishes (every copy would stay in the stream)."""
        self._unchecked = False
        try:
            raw = annotations_section(data, whole=False)
        except Exception:  # unreadable: the feed's own decode counts and logs it
            return
        if raw is None or STREAM_OFFSET not in raw:
            return
        self.stream = True
        self.subscription = True
        self.recycle = False
        self.custody = False
        self.search.pass_open = False
        if self._log is not None:
            self._log("the queue is a stream (its messages carry x-stream-offset): reading and skipping, "
                      "never moving")
        if self.on_stream is not None:
            self.on_stream()

    def _subscription_delivery(self, c: Custody) -> None:
        # With credit left after the last pump, nothing held is for an outlet with credit: order holds.
        if self._offer(c, frozenset()):
            return
        if not self.outlets or any(self._selects(o, c) for o in self.outlets):
            self._hold(c)
        elif any(o.max_size for o in self.outlets) and self._too_large(c):
            return
        else:
            # A copy of this subscription's (or shared subscription's) that none of its links selects.
            self.stats.filtered += 1
            self.io.settle_upstream(c.delivery, ACCEPTED)

    def _too_large(self, c: Custody) -> bool:
        """A subscription's copy that some link selects but none can take (its max-message-size):
        rejected upstream for this subscription (amqp:link:message-size-exceeded), counted, logged."""
        size = len(c.delivery.data)
        limits = [o.max_size for o in self.outlets if o.max_size and size > o.max_size
                  and (o.filter.evaluate(c.message, o.receiver) is True if c.message is not _BAD
                       else not o.filter.reads)]
        if not limits:
            return False
        self.stats.too_large += 1
        if self._log is not None:
            self._log(f"a {size}-byte message is larger than the max-message-size {max(limits)} of the "
                      f"subscription's links: rejected for it ({MESSAGE_SIZE_EXCEEDED})")
        self.io.settle_upstream(c.delivery, too_large(size, max(limits)))
        return True

    def on_client_outcome(self, outlet: Outlet, tag: Any, outcome: Outcome) -> None:
        c = outlet.in_flight.pop(tag, None)
        if c is None:
            return
        discard = outcome.kind == "modified" and outcome.undeliverable_here
        # (RabbitMQ 4 dead-letters a discarded message, as for a consumer of its own: it goes upstream)
        keep = discard and not self.subscription and not self.dead_letters
        if outcome.kind in ("accepted", "rejected") or not (self.custody or keep) or (discard and self.dead_letters):
            self.io.settle_upstream(c.delivery, outcome)
            return
        # released / modified: the message stays in the proxy, offered first to the other outlets
        if outcome.kind == "modified":
            if outcome.annotations:
                # AMQP 1.0 3.4.5: the modified outcome's message-annotations are merged into the
                # message for its next deliveries (RabbitMQ's requeue with annotations)
                data = c.delivery.data
                c.annotations = {**(c.annotations or {}), **outcome.annotations}
                for key, value in outcome.annotations.items():
                    data = set_message_annotation(data, symbol(key) if isinstance(key, str) else key, value)
                c.delivery.data = data
            if outcome.delivery_failed:
                c.failed += 1
            if outcome.undeliverable_here:
                c.excluded = c.excluded | {outlet.name}
        self._take_back([c], outlet.name)
        self.pump()

    def _take_back(self, returned: list[Custody], previous: str) -> None:
        """Deliveries a client gave back: to another outlet at once, else held at the front (they
        are the oldest), in their order."""
        keep = []
        for c in returned:
            c.redelivered = True
            if self.stopping or not self._offer(c, c.excluded | {previous}):
                keep.append(c)
        for c in reversed(keep):
            self.held.appendleft(c)
        if keep:
            self._count_held()

    def stop(self) -> None:
        """Stop starting anything: no move, no pull, no send.  Moves in flight still complete."""
        self.stopping = True
        self.search.pass_open = False
        self.stats.starved = 0

    def count_filters(self) -> None:
        """(The outlets' counts are kept as each message is evaluated: nothing to bring up to date.)"""

    def returns(self) -> list[tuple[Any, Outcome]]:
        """Before `close`: the held upstream deliveries that must not go back as a plain release.
        One no client ever received goes back `UNACQUIRED`, not as a delivery a consumer had
        (first-acquirer stays true); one a client gave back with annotations (a requeue with
        annotations) goes back `modified` with them, so the broker's copy carries them as a consumer
        of the broker's own would find it (an upstream that cannot take `modified` releases it)."""
        out = []
        for c in self.held:
            if not c.redelivered:
                out.append((c.delivery, UNACQUIRED))
            elif c.annotations:
                out.append((c.delivery, Outcome("modified", delivery_failed=c.failed > 0,
                                                annotations=dict(c.annotations))))
        return out

    def close(self) -> list[Any]:
        """Forget everything; returns upstream deliveries still unsettled (closing the upstream
        consumer returns them to the source)."""
        out = [c.delivery for c in self.held]
        for o in self.outlets:
            out.extend(c.delivery for c in o.in_flight.values())
            o.in_flight.clear()
        self.held.clear()
        self.search.kept = 0
        self.outlets.clear()
        self.stopping = True
        self._count_held()
        return out

    # ------------------------------------------------------------------ decisions
    def pump(self) -> None:
        """Offer held messages to outlets with credit, move what blocks the search, top up credit."""
        if self.stopping:
            return
        self._no_room = False
        if self.held and any(o.credit > 0 for o in self.outlets):
            keep: deque[Custody] = deque()
            offers = self._offers
            for c in self.held:
                if c.offered == offers:
                    keep.append(c)  # turned down by the same outlets with the same filters: no change
                    continue
                if not (self._reads <= c.reads) and c.message is not _BAD:
                    c.message = self._decode(c.delivery, self._reads)
                    c.reads = self._reads
                if not self._offer(c, c.excluded):
                    keep.append(c)
            self.held = keep
            self.search.kept = sum(1 for c in keep if c.kept)
            self._count_held()
        if self.held and self._searching():
            self._move_held()
        self._top_up()

    def _selects(self, o: Outlet, c: Custody) -> bool:
        if o.max_size and len(c.delivery.data) > o.max_size:
            return False
        if c.message is _BAD:
            return not o.filter.reads
        n = o.evaluated = o.evaluated + 1
        if n & EVAL_MASK == 1:
            t = _ns()
            ok = o.filter.evaluate(c.message, o.receiver) is True
            o.eval_ns += (_ns() - t) * EVAL_SAMPLE
        else:
            ok = o.filter.evaluate(c.message, o.receiver) is True
        if ok:
            o.matched += 1
        return ok

    def _offer(self, c: Custody, excluded: frozenset) -> bool:
        self._nobody = False
        if self.stopping:
            return False
        outlets = self.outlets
        n = len(outlets)
        evaluated = 0
        for i in range(n):
            o = outlets[(self._rr + i) % n]
            if o.credit <= 0 or o.name in excluded:
                continue
            evaluated += 1
            if not self._selects(o, c):
                continue
            self._rr = (self._rr + i + 1) % n
            self._send(o, c)
            return True
        # every outlet said no: `_wanted` need not ask them again
        self._nobody = evaluated == n and not c.excluded
        if not excluded or excluded is c.excluded:
            # the answer stands until an outlet gains credit or the filters change (`_offers`)
            c.offered = self._offers
        return False

    def _send(self, o: Outlet, c: Custody) -> None:
        if c.redelivered:
            self.stats.redelivered += 1
        tag = self.io.send(o, c.delivery, c.data())
        if o.presettled:
            self.io.settle_upstream(c.delivery, ACCEPTED)
        else:
            o.in_flight[tag] = c
        o.credit -= 1
        o.delivered += 1
        o.waiting_since = self._clock() if o.credit > 0 else None
        self.stats.delivered += 1

    def tick(self) -> None:
        """Called by the I/O layer now and then (about once a second): takes the broker's word on
        the credit, and while links wait, asks the search whether to hand back what the feed holds
        (`QueueSearch.hand_back_due`) and whether to look at the queue again (`QueueSearch.look`:
        a count asked of the upstream through `probe`, answered in `on_available`, or a timer)."""
        if not self.stopping:
            self._take_broker_word()
        search = self.search
        if not self.recycle or self.stopping or not any(o.credit > 0 for o in self.outlets):
            search.rest()
            return
        self._top_up()  # (a feed walled in may go round again now)
        if search.hand_back_due(bool(self.held), self.moving):
            self._hand_back()
        if search.look(self.io.probe, self.on_available, self.moving):
            self.pump()

    def _hold(self, c: Custody) -> None:
        self.held.append(c)
        self._count_held()

    def _count_held(self) -> None:
        n = len(self.held)
        self.stats.held = n
        if n > self.stats.held_peak:
            self.stats.held_peak = n

    def _top_up(self) -> None:
        credit = 0
        now = None
        for o in self.outlets:
            credit += o.credit
            if o.credit > 0 and o.waiting_since is None:
                now = now or self._clock()
                o.waiting_since = now
            elif o.credit <= 0:
                o.waiting_since = None
        if credit <= 0 or self.stopping:
            self.stats.starved = 0
            return
        held = len(self.held) + self.moving
        if (held >= self.window and self.recycle and self.held
                and self.search.go_round(self.stats.delivered)):
            # Walled in by messages every filter was offered, while another daemon on the queue
            # offers messages to its filters: what it moved may lie behind them.  Going round again.
            self._move_held()
            held = len(self.held) + self.moving
        if not self.subscription and held >= self.window:
            # Blocked: everything the proxy may hold is held, and clients with credit wait.
            if self.stats.starved == 0:
                self.stats.blocked += 1
            self.stats.starved = sum(1 for o in self.outlets if o.credit > 0)
            return
        self.stats.starved = 0
        target = min(credit, self.max_credit) + self.window
        room = target - held - self.upstream_credit
        if room > 0 and (self.upstream_credit == 0 or (room * 4 >= target and not self.whole_grants)):
            self.upstream_credit += room
            self.io.flow_upstream(room)

    def _upstream_received(self) -> int:
        return self._pulled_total

    def longest_wait(self) -> float:
        """Seconds the longest-waiting outlet has had credit without receiving anything."""
        since = [o.waiting_since for o in self.outlets if o.waiting_since is not None and o.credit > 0]
        return self._clock() - min(since) if since else 0.0

    # ------------------------------------------------------------------ decoding
    def _custody(self, delivery: Any) -> Custody:
        reads = self._reads
        message = self._decode(delivery, reads)
        mark: dict = _NO_MARK
        if message is not _BAD and self.recycle:
            # (decoding the filters' sections, if any, already checked every section)
            mark = self._read_mark(delivery.data, checked=message is not None)
            if mark is _BAD:
                message, mark = _BAD, _NO_MARK
            elif mark:
                self.search.learn(mark)
        return Custody(delivery, message, reads, mark)

    def _read_mark(self, data: bytes, checked: bool = False) -> Any:
        """The mark (filter identity -> [feed token, ms]) a moved copy carries ({} for none), or
        UNDECODABLE (counted and logged as `decode_reads` does) when its sections cannot be read
        (`checked`: the caller already knows they can).  Read once per distinct annotations bytes:
        the marks are shared and never changed in place."""
        try:
            raw = annotations_section(data, whole=not checked)
            mark = self._marks_read.get(raw)
            if mark is not None:
                return mark
            mark = {}
            if raw is not None:
                annotations, _ = _decode_value(raw, 0)
                if not isinstance(annotations, dict):
                    raise CodecError("message-annotations is not a map")
                offered = annotations.get(OFFERED_ANNOTATION)
                if isinstance(offered, dict):
                    for k, v in offered.items():
                        if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int):
                            mark[str(k)] = [str(v[0]), int(v[1])]
        except Exception as e:  # CodecError, or any decoder fault
            return _undecodable(e, self.stats, self._log)
        if len(self._marks_read) >= 64:
            self._marks_read.clear()
        self._marks_read[raw] = mark
        return mark

    def _decode(self, delivery: Any, reads: frozenset) -> Any:
        return decode_reads(delivery.data, reads, self.stats, self._log)
