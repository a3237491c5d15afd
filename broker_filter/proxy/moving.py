"""A queue feed's moves for the search of its queue (`forwarding.Feed` with `recycle`), without I/O.

Theory of operation
-------------------
Every decision of the search (what a pass is, when one opens and ends, what is moved and what is
held, when to look again, count the queue, go round or hand back) is `broker_filter.proxy.search`'s
(`QueueSearch`, the feed's `search`).  This module does what those decisions say, on the feed's own
state: a message no outlet can take is moved while the search is on (`_place`), the held ones at a
pump (`_move_held`), the ones no link here selects when the search says to hand them back
(`_hand_back`, from the feed's `tick`).  A move (`_move`) publishes the delivery's copy, marked
with the filters it was offered to (`OFFERED_ANNOTATION`, written by `mark_section`), to the
queue's tail through the I/O layer's `recycle`, and accepts the original once the broker accepted
the copy; a copy the broker refused leaves the original held, not moved again in that pass.

`QueueMoves` is a part of `forwarding.Feed` (a base class, so a move costs no extra object or
lookup): it declares below what of the feed it uses.
"""

from __future__ import annotations

from collections import deque

from ..amqp import CodecError, set_message_annotation
from ..amqp.sections import MESSAGE_ANNOTATIONS, encode_section
from ..amqp.types import symbol
from .custody import ACCEPTED, UNDECODABLE as _BAD, Custody, FeedIO, FeedStats, Outlet
from .search import QueueSearch

# On a moved copy: the identities (see `custody.filter_identity`) of the filters it was offered to.
OFFERED_ANNOTATION = symbol("x-opt-broker-filter-offered")


def mark_section(sections: dict[tuple, bytes], mark: dict) -> bytes:
    """The message-annotations section that writes `mark` on a moved copy (a feed's search's
    `encode`), cached in `sections` (at most 64)."""
    key = tuple(sorted((k, v[0], v[1]) for k, v in mark.items()))
    section = sections.get(key)
    if section is None:
        if len(sections) >= 64:
            sections.clear()
        section = sections[key] = encode_section(MESSAGE_ANNOTATIONS, {OFFERED_ANNOTATION: mark})
    return section


class QueueMoves:
    """The moves of `forwarding.Feed` (see the module's doc)."""

    # What of the feed the moves use (`forwarding.Feed` sets them)
    io: FeedIO
    stats: FeedStats
    search: QueueSearch
    outlets: list[Outlet]
    held: deque[Custody]
    recycle: bool
    stopping: bool
    moving: int
    _no_room: bool
    _nobody: bool
    _merged: dict
    _pulled_total: int

    # ... and of its methods (`forwarding.Feed` defines each of these)
    def pump(self) -> None: ...

    def _top_up(self) -> None: ...

    def _selects(self, o: Outlet, c: Custody) -> bool: ...

    def _hold(self, c: Custody) -> None: ...

    def _count_held(self) -> None: ...

    def _hand_back(self) -> None:
        """Move the held messages no link here selects to the queue's tail (see `QueueSearch.look`)."""
        keep: deque[Custody] = deque()
        handed = 0
        search = self.search
        for c in self.held:
            if c.message is _BAD or not search.may_hand_back(c) or self._wanted(c) or not self._move(c):
                keep.append(c)
            else:
                handed += 1
        self.held = keep
        self._count_held()
        self.stats.handed_back += handed
        self._top_up()

    def on_available(self, n: int | None) -> None:
        """The upstream's count of messages ready in the queue (see `QueueSearch.counted`)."""
        if self.search.counted(n, self.stopping or self.moving != 0, self._pulled_total):
            self.pump()

    def _place(self, c: Custody) -> None:
        """A queue message no outlet can take now: move it while searching, else hold it."""
        if not self.recycle or self.stopping or c.message is _BAD or not self.outlets:
            self._hold(c)
            return
        search = self.search
        if search.pulled(c.mark, self.outlets):
            self.stats.passes += 1  # a copy this pass moved came round
        wanted = not self._nobody and self._wanted(c)
        if not self._searching() or not search.to_move(c, wanted) or not self._move(c, wanted):
            self._hold(c)  # (an outlet that selects it takes it with its next credit)

    def _wanted(self, c: Custody) -> bool:
        return any(o.name not in c.excluded and self._selects(o, c) for o in self.outlets)

    def _move_held(self) -> None:
        """While searching: move the held messages the search moves (`QueueSearch.to_move`)."""
        keep: deque[Custody] = deque()
        search = self.search
        search.kept = 0
        searching = self._searching()  # (once: nothing in the loop changes it)
        for c in self.held:
            if self._no_room and searching:
                # No move starts before the next pump: the rest stay as they are, unevaluated (the
                # filters ran for each held message at every pump), kept within the reserve.
                search.recount(c)
                keep.append(c)
                continue
            c.kept = False
            if not searching:
                keep.append(c)
                continue
            wanted = self._wanted(c)
            if not search.to_move(c, wanted, c.message is not _BAD) or not self._move(c, wanted):
                keep.append(c)
        self.held = keep
        self._count_held()

    def _move(self, c: Custody, wanted: bool = False) -> bool:
        """Publish `c`'s copy with its new mark to the queue's tail; accept the original once the
        broker accepted the copy, else hold it again.  `wanted`: links without credit select it."""
        if self._no_room:
            return False
        search = self.search
        mark, section = search.new_mark(c.mark)
        try:
            data = set_message_annotation(c.data(), OFFERED_ANNOTATION, mark, section, self._merged)
        except CodecError:
            c.message = _BAD  # cannot carry a mark: never moved
            return False
        moved_in = search.pass_no

        def done(ok: bool) -> None:
            self.moving -= 1
            self.stats.moving = self.moving
            if ok:
                search.copy_accepted(moved_in)
                self.stats.recycled += 1
                self.io.settle_upstream(c.delivery, ACCEPTED)
            else:
                # The broker refused the copy: hold the original, not moved again in this pass.
                c.refused = search.pass_no
                self.held.appendleft(c)
                self._count_held()
            self._top_up()  # room to pull more (nothing held became deliverable)

        self.moving += 1
        self.stats.moving = self.moving
        if not self.io.recycle(c.delivery, data, done):
            self.moving -= 1
            self.stats.moving = self.moving
            self._no_room = True
            return False
        c.mark = mark
        c.kept = False
        if wanted:  # moved away from links without credit that select it
            search.defer(o.identity for o in self.outlets if o.name not in c.excluded and self._selects(o, c))
        return True

    def _searching(self) -> bool:
        """Moving (see `QueueSearch.searching`)."""
        return self.recycle and not self.stopping and self.search.searching(self.outlets)

