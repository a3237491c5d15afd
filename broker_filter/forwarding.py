"""Per-link forwarding state, without I/O: credit, in-flight deliveries, settlement, held messages.

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
  unsettled, in arrival order, and offered again whenever an outlet gets credit or attaches.  Nothing
  is ever settled upstream without a client's outcome, so nothing is lost; nothing is released
  upstream for not matching, so there is no redelivery loop.

Credit flows from the clients: the feed grants upstream credit only while at least one outlet has
credit, and keeps  held + outstanding upstream credit <= min(sum of outlet credit, max_credit) + window.
So the proxy never holds more than that many unsettled messages per feed; with no client credit it
pulls nothing and the messages stay in the broker.  A queue feed whose held messages reach `window`
while outlets wait with credit is *blocked*: those outlets are starved (counted in `FeedStats`)
until a matching client appears, a held message is taken, or (with `recycle`) the oldest held
message nobody selects is moved to the tail of the queue by the I/O layer (copy published, original
accepted only after the broker accepted the copy: at-least-once, order changes, nothing lost).

The client's outcome is applied unchanged to the upstream delivery, except that on a queue feed
`modified{undeliverable-here}` keeps the message in the proxy for the other outlets (brokers differ
on what that outcome does upstream).  A detaching outlet's unsettled deliveries go back upstream as
`modified{delivery-failed}`: the client had them, so the broker counts a failed attempt and the next
consumer sees them as redelivered (an upstream that cannot take `modified` gets `released`).

The I/O layer implements `FeedIO` and calls the `on_*` methods; decisions come back as calls on it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .codec import CodecError, decode_message


@dataclass(frozen=True)
class Outcome:
    """An AMQP 1.0 terminal delivery state.

    kind: "accepted" | "rejected" | "released" | "modified".
    `error` is (condition, description) for rejected; the modified fields follow the spec.
    """

    kind: str
    error: tuple[str, str | None] | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False
    annotations: dict[Any, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("accepted", "rejected", "released", "modified"):
            raise ValueError(f"not an AMQP outcome: {self.kind!r}")


ACCEPTED = Outcome("accepted")
RELEASED = Outcome("released")
DELIVERY_FAILED = Outcome("modified", delivery_failed=True)


class FeedIO(Protocol):
    def send(self, outlet: "Outlet", delivery: Any) -> Any:
        """Transfer the delivery's bytes on the outlet's client link; return the client delivery tag."""

    def settle_upstream(self, delivery: Any, outcome: Outcome) -> None: ...

    def flow_upstream(self, n: int) -> None: ...

    def recycle(self, delivery: Any, done: Callable[[bool], None]) -> None:
        """Republish the delivery's bytes to the tail of the queue; done(True) once the broker accepted
        the copy (the feed then accepts the original), done(False) if it did not (the original is
        then held again, and the feed tries again at its next `pump`, which the I/O layer calls
        when publishing is possible again)."""


@dataclass
class FeedStats:
    delivered: int = 0  # messages sent to clients
    filtered: int = 0  # non-matches settled as consumed (subscriptions only)
    undecodable: int = 0  # messages whose sections could not be decoded (no filter selects them)
    recycled: int = 0  # held messages moved to the queue's tail
    blocked: int = 0  # times a queue feed stopped pulling with outlets waiting
    held: int = 0  # messages held right now
    held_peak: int = 0
    starved: int = 0  # outlets with credit waiting on a blocked feed right now


class Outlet:
    """One client receiving link.  `receiver` is its connection identity "<instance>/<connection>"."""

    __slots__ = ("name", "filter", "receiver", "credit", "in_flight", "delivered", "io_ref", "presettled")

    def __init__(self, name: str, filter: Any, receiver: str | None = None, io_ref: Any = None,
                 presettled: bool = False):
        self.name = name
        self.presettled = presettled  # the client asked for pre-settled deliveries (at most once)
        self.filter = filter
        self.receiver = receiver
        self.credit = 0
        self.in_flight: dict[Any, Any] = {}  # client tag -> upstream delivery
        self.delivered = 0
        self.io_ref = io_ref  # the I/O layer's link object

    def __repr__(self) -> str:
        return f"<Outlet {self.name} credit={self.credit} in_flight={len(self.in_flight)}>"


class _Held:
    __slots__ = ("delivery", "message", "reads", "excluded")

    def __init__(self, delivery: Any, message: Any, reads: frozenset, excluded: frozenset = frozenset()):
        self.delivery = delivery
        self.message = message
        self.reads = reads
        self.excluded = excluded


_BAD = object()  # a message that could not be decoded


class Feed:
    def __init__(
        self,
        io: FeedIO,
        *,
        subscription: bool,
        window: int = 100,
        max_credit: int = 1000,
        recycle: bool = False,
        recycle_budget: int | None = None,
        log: Callable[[str], None] | None = None,
    ):
        if window < 1 or max_credit < 1:
            raise ValueError("window and max_credit are at least 1")
        self.io = io
        self.subscription = subscription
        self.window = window
        self.max_credit = max_credit
        self.recycle = recycle and not subscription
        # Recycling without any delivery in between stops after this many messages (no endless cycling
        # of a queue nobody matches); a delivery or a new outlet starts a fresh budget.
        self.recycle_budget = recycle_budget if recycle_budget is not None else 10 * window
        self._budget = self.recycle_budget
        self.outlets: list[Outlet] = []
        self.held: deque[_Held] = deque()
        self.upstream_credit = 0
        self.recycling = 0
        self.stats = FeedStats()
        self._rr = 0
        self._reads: frozenset = frozenset()
        self._log = log

    # ------------------------------------------------------------------ outlets
    def add_outlet(self, outlet: Outlet) -> None:
        self.outlets.append(outlet)
        self._reads = self._reads | outlet.filter.reads
        self._budget = self.recycle_budget
        self.pump()

    def remove_outlet(self, outlet: Outlet) -> None:
        """The client link is gone: its unsettled deliveries go back upstream as failed attempts."""
        if outlet not in self.outlets:
            return
        self.outlets.remove(outlet)
        self._reads = frozenset().union(*(o.filter.reads for o in self.outlets))
        for delivery in outlet.in_flight.values():
            self.io.settle_upstream(delivery, DELIVERY_FAILED)
        outlet.in_flight.clear()
        outlet.credit = 0
        self.pump()

    def set_credit(self, outlet: Outlet, credit: int) -> None:
        outlet.credit = max(0, credit)
        self.pump()

    # ------------------------------------------------------------------ upstream events
    def on_upstream_delivery(self, delivery: Any) -> None:
        self.upstream_credit = max(0, self.upstream_credit - 1)
        reads = self._reads
        message = self._decode(delivery, reads)
        outlets = self.outlets
        n = len(outlets)
        if n == 1:
            o = outlets[0]
            if message is _BAD:
                selected = not o.filter.reads
            else:
                selected = o.filter.evaluate(message, o.receiver) is True
            if selected:
                # With credit left after the last pump, nothing held is for this outlet: order holds.
                if o.credit > 0:
                    self._send(o, delivery)
                    self._top_up()
                    return
                self._hold(_Held(delivery, message, reads))
            elif self.subscription:
                self.stats.filtered += 1
                self.io.settle_upstream(delivery, ACCEPTED)
            else:
                self._hold(_Held(delivery, message, reads))
            self._top_up()
            return
        if not self._offer(delivery, message, frozenset()):
            if self.subscription and not any(self._selects(o, message) for o in outlets):
                # A shared subscription's copy that none of its links selects.
                self.stats.filtered += 1
                self.io.settle_upstream(delivery, ACCEPTED)
            else:
                self._hold(_Held(delivery, message, reads))
        self._top_up()

    def on_client_outcome(self, outlet: Outlet, tag: Any, outcome: Outcome) -> None:
        delivery = outlet.in_flight.pop(tag, None)
        if delivery is None:
            return
        if outcome.kind == "modified" and outcome.undeliverable_here and not self.subscription:
            # Keep it for the others; at the front, it is the oldest.
            self.held.appendleft(_Held(delivery, self._decode(delivery, self._reads), self._reads, frozenset({outlet.name})))
            self._count_held()
            self.pump()
            return
        self.io.settle_upstream(delivery, outcome)

    def close(self) -> list[Any]:
        """Forget everything; returns upstream deliveries still unsettled (closing the upstream
        consumer returns them to the source)."""
        out = [h.delivery for h in self.held]
        for o in self.outlets:
            out.extend(o.in_flight.values())
            o.in_flight.clear()
        self.held.clear()
        self.outlets.clear()
        self._count_held()
        return out

    # ------------------------------------------------------------------ decisions
    def pump(self) -> None:
        """Offer held messages to outlets with credit, then top up upstream credit."""
        if self.held and any(o.credit > 0 for o in self.outlets):
            keep: deque[_Held] = deque()
            for h in self.held:
                if not self._offer_held(h):
                    keep.append(h)
            self.held = keep
            self._count_held()
        self._top_up()

    def _offer_held(self, h: _Held) -> bool:
        if not (self._reads <= h.reads) and h.message is not _BAD:
            h.message = self._decode(h.delivery, self._reads)
            h.reads = self._reads
        return self._offer(h.delivery, h.message, h.excluded)

    def _offer(self, delivery: Any, message: Any, excluded: frozenset) -> bool:
        outlets = self.outlets
        n = len(outlets)
        for i in range(n):
            o = outlets[(self._rr + i) % n]
            if o.credit <= 0 or o.name in excluded:
                continue
            if message is _BAD:
                if o.filter.reads:
                    continue
            elif o.filter.evaluate(message, o.receiver) is not True:
                continue
            self._rr = (self._rr + i + 1) % n
            self._send(o, delivery)
            return True
        return False

    @staticmethod
    def _selects(o: Outlet, message: Any) -> bool:
        if message is _BAD:
            return not o.filter.reads
        return o.filter.evaluate(message, o.receiver) is True

    def _send(self, o: Outlet, delivery: Any) -> None:
        tag = self.io.send(o, delivery)
        if o.presettled:
            self.io.settle_upstream(delivery, ACCEPTED)
        else:
            o.in_flight[tag] = delivery
        o.credit -= 1
        o.delivered += 1
        self.stats.delivered += 1
        self._budget = self.recycle_budget

    def _hold(self, h: _Held) -> None:
        self.held.append(h)
        self._count_held()

    def _count_held(self) -> None:
        n = len(self.held)
        self.stats.held = n
        if n > self.stats.held_peak:
            self.stats.held_peak = n

    def _top_up(self) -> None:
        credit = 0
        for o in self.outlets:
            credit += o.credit
        if credit <= 0:
            self.stats.starved = 0
            return
        held = len(self.held) + self.recycling
        if not self.subscription and held >= self.window:
            # Blocked: everything the proxy may hold is held, and clients with credit wait.
            if self.stats.starved == 0:
                self.stats.blocked += 1
            self.stats.starved = sum(1 for o in self.outlets if o.credit > 0)
            if self.recycle and self.upstream_credit == 0:
                self._recycle_oldest()
            return
        self.stats.starved = 0
        target = min(credit, self.max_credit) + self.window
        room = target - held - self.upstream_credit
        if room > 0 and (self.upstream_credit == 0 or room * 4 >= target):
            self.upstream_credit += room
            self.io.flow_upstream(room)

    def _recycle_oldest(self) -> None:
        if not self.held or self.recycling >= max(1, self.window // 10) or self._budget <= 0:
            return
        h = self.held.popleft()
        self.recycling += 1
        self._budget -= 1
        self._count_held()

        def done(ok: bool) -> None:
            self.recycling -= 1
            if ok:
                self.stats.recycled += 1
                self.io.settle_upstream(h.delivery, ACCEPTED)
                self.pump()
            else:
                # Not recycled (no publisher credit yet): the I/O layer pumps again when it can.
                self.held.appendleft(h)
                self._budget += 1
                self._count_held()

        self.io.recycle(h.delivery, done)

    def _decode(self, delivery: Any, reads: frozenset) -> Any:
        if not reads:
            return None
        try:
            return decode_message(delivery.data, reads)
        except Exception as e:  # CodecError, or any decoder fault: one message never fails the feed
            self.stats.undecodable += 1
            if self._log is not None:
                kind = "" if isinstance(e, CodecError) else f" ({type(e).__name__})"
                self._log(f"upstream message not decodable{kind}, no filter selects it: {e}")
            return _BAD
