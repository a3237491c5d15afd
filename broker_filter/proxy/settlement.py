"""Settlement in arrival order, without I/O: which decided outcomes of an upstream consumer's
deliveries may be applied now.

A consumer that settles in order (`remote.RemoteConsumer.settle_in_order`) registers each delivery
as it arrives (`arrived`) and hands over each decision (`decided`).  A decision for the oldest
undecided delivery is applied at once, together with the run of decided deliveries right behind
it; a decision for a later one waits until every delivery before it is decided.  Proton-c then
sends one disposition frame for a run of consecutive deliveries instead of one per message.  At
most `limit` decided outcomes wait behind an undecided delivery: past it every decided one is
released at once, out of order, as `flush` does when the consumer closes.

Deliveries are any hashable objects, each registered once (the same object is passed to `decided`);
outcomes are opaque.  The pairs come from generators that move the state as they go: the caller
applies each pair before taking the next, and runs the generator to its end.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator

# At most this many decided outcomes wait behind an undecided delivery; past it they are released
# at once, out of order.
ORDER_LIMIT = 1000
_UNDECIDED = object()


class SettlementOrder:
    """The deliveries of one consumer in arrival order, each undecided or with the outcome it waits
    to be applied with.  `waiting`: how many decided outcomes wait."""

    __slots__ = ("_order", "waiting", "limit")

    def __init__(self, limit: int = ORDER_LIMIT):
        self._order: OrderedDict[Hashable, Any] = OrderedDict()
        self.waiting = 0
        self.limit = limit

    def __len__(self) -> int:
        """Deliveries registered and not released yet (undecided or waiting)."""
        return len(self._order)

    def arrived(self, delivery: Hashable) -> None:
        """Register `delivery`, undecided, behind every delivery registered before it."""
        self._order[delivery] = _UNDECIDED

    def decided_first(self, delivery: Hashable) -> bool:
        """The usual case, without a generator (once per message): `delivery` is the oldest
        undecided one and no decided one waits: it is forgotten, and True says to apply its outcome
        now.  False: nothing changed; hand the decision to `decided`."""
        order = self._order
        if self.waiting or not order or next(iter(order)) is not delivery:
            return False
        del order[delivery]
        return True

    def decided(self, delivery: Hashable, outcome: Any) -> Iterator[tuple[Hashable, Any]]:
        """Record `outcome` for `delivery`; yield the (delivery, outcome) pairs to apply now, in order.

        A delivery never registered, or already released, comes back at once.  So does a second
        decision for a delivery whose first one still waits: the first stays in its place and comes
        out with its run later."""
        order = self._order
        if order.get(delivery, outcome) is not _UNDECIDED:
            yield delivery, outcome
            return
        if not self.waiting and next(iter(order)) is delivery:  # the usual: decided in arrival order
            del order[delivery]
            yield delivery, outcome
            return
        order[delivery] = outcome
        self.waiting += 1
        while order:  # release the decided run at the head
            head = next(iter(order))
            held = order[head]
            if held is _UNDECIDED:
                break
            del order[head]
            self.waiting -= 1
            yield head, held
        if self.waiting > self.limit:
            yield from self.flush()

    def flush(self) -> Iterator[tuple[Hashable, Any]]:
        """Yield every decided (delivery, outcome) now, in arrival order but past the undecided ones
        before them, which stay registered."""
        order = self._order
        if not order or not self.waiting:
            return
        decided = [(d, o) for d, o in order.items() if o is not _UNDECIDED]
        for d, o in decided:
            del order[d]
            yield d, o
        self.waiting = 0

    def clear(self) -> None:
        """Forget every delivery, decided or not."""
        self._order.clear()
        self.waiting = 0
