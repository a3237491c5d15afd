"""The search of a queue for waiting links, without I/O: its state and its decisions.

A queue feed with `recycle` (`broker_filter.proxy.forwarding.Feed`) asks a `QueueSearch` where the
search has a say, and does what it answers: it moves a message (publishes the marked copy, accepts
the original once the broker accepted the copy), holds it, asks the upstream for a count, settles
and grants credit.  The search reads the time from the clocks it is given and nothing else.

Theory of operation
-------------------
A message that no outlet can take blocks the ones behind it on a broker that cannot filter.  While an
outlet waits with credit, the feed moves every message no outlet selects to the queue's tail (the
I/O layer publishes the copy; the feed accepts the original once the broker accepted the copy), many
at a time.  Each copy carries the message annotation `x-opt-broker-filter-offered`, a map: filter
identity -> [feed token, first offer time] for every filter it was offered to (merged with what is
there, so several daemons add to one mark), and "" -> [the pass that moved it, time]
(`new_mark`).  The search stops by knowing, not by a counter:

* a pass ends when a copy it moved comes round (everything ahead of that copy has been offered:
  `pulled`).  With another daemon on the queue, that holds for what this daemon pulled: the other
  may have moved a message this one selects from ahead of the copy to behind it, and this one
  meets it on its next go-round (`go_round`, while the other is live) or look;
* a pass starts (`open_pass`) when the set of filters changes (a new filter attaches: `filters`),
  when the feed pulls a message not yet offered to every filter it knows (`pulled`), when `published`
  says a client published to the queue through the proxy, when a mark shows a filter another daemon
  serves on the queue (`learn`), and when the queue's ready count shows what the feed did not put
  there (`look`, `counted`);
* once the pass is over, a message already offered to every filter is held, never moved again
  (`movable`).

So each non-matching message is moved at most once per pass, a selective outlet finds a match at
any depth, and a queue nobody matches is not cycled.  Other daemons' filters count while their
marks are younger than `foreign_ttl` (first-offer times: moving a message again is no sign of
life), so two daemons in front of one queue pass each other's messages on and then go quiet
(`live_foreign`).  A message some outlet selects waits for that outlet's credit, within a bound:
messages held for outlets that select them but have no credit take at most `reserve` (half the
window, `keep`); while searching, the ones past it are moved like non-matching ones (a link that
never takes its messages cannot fill the window and starve the others or new arrivals), and when an
outlet whose messages were moved gets credit (`defer`, `credit`), one more pass starts, which brings
them round to it.  They are never given to an outlet that does not select them.

Between passes, while links still wait, `look` (from the feed's tick) decides when to look at the
queue again, by counting where the upstream answers a count, by a timer where it cannot; a feed
walled in while another daemon is live goes round again (`go_round`), and a feed holding messages
after its pass hands back the ones no link of its own selects (`hand_back_due`, `may_hand_back`).

The messages the search is asked about are the feed's custody objects: it reads their `mark`,
`redelivered` and `refused` and sets `kept`; of outlets it reads `credit`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable

# A feed holding messages hands back what it holds (see `QueueSearch.look`) first this many seconds
# after it began (aligned to the wall clock), then twice as long each time, at most `look_again_max`.
HAND_BACK_FIRST = 1.0

# A feed walled in while another daemon on the queue is live (see `QueueSearch.go_round`) goes round
# again at once while its go-rounds bring its links something; after one that brought nothing, it
# waits this long before the next, then twice as long each time, at most `WALLED_MAX` seconds.
WALLED_FIRST = 0.25
WALLED_MAX = 8.0

# Where the upstream answers the count (a probe) and no other consumer was seen, a finished pass is
# looked at again only after this many times `look_again` (see `QueueSearch.look`).
COUNTED_LOOK = 6

_NO_PASS = (None,)


def _unwritten(mark: dict) -> None:
    return None


class QueueSearch:
    """The search of one queue feed (see the module's text).

    token: names the feed in the marks it writes (unique across daemons).  window: the feed's
    window (the reserve is half of it).  clock: monotonic seconds (the timers); wall: wall-clock
    seconds (the marks' times, and the hand-back's moments, which daemons share).  encode(mark):
    what a mark is written as (the feed's annotations section), cached with the mark by `new_mark`.
    """

    def __init__(self, *, token: str = "", window: int = 100, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, foreign_ttl: float = 60.0, look_again: float = 10.0,
                 look_again_max: float = 600.0, encode: Callable[[dict], Any] = _unwritten):
        self.token = token
        self.pass_open = False
        self.pass_no = 0
        self.identities: frozenset = frozenset()  # the filters of the feed's outlets
        # Messages held for links that select them but have no credit take at most `reserve` of the
        # window (`kept` of them now); while searching, the rest are moved like non-matching ones
        # (see `keep`), and a link whose messages were moved (`deferred`, by filter identity) starts
        # a pass when it has credit.
        self.reserve = max(1, window // 2)
        self.kept = 0
        self.deferred: set[str] = set()
        self.foreign_ttl = foreign_ttl
        # After a pass that found nothing, with links still waiting: look again after `look_again`
        # seconds, doubling up to `look_again_max` (see `look`).
        self.look_again = look_again
        self.look_again_max = look_again_max
        self._clock = clock
        self._wall = wall
        self._encode = encode
        # Filters of other consumers of the queue (other daemons), learnt from the marks they wrote:
        # identity -> when last written.  Forgotten `foreign_ttl` seconds after the last sign of life.
        self._foreign: dict[str, float] = {}
        # The mark a move gives a message with a given mark in a given second (most copies of a
        # pass share one), with what it is written as.
        self._marks_moved: dict[tuple, tuple] = {}
        self._next_look: float | None = None
        self._look_delay = look_again
        # Knowing instead of looking again (see `look`): copies of the last pass the broker accepted
        # and copies of it pulled back (their difference is what the queue holds of them); all
        # copies accepted, and the highest and lowest count of the queue net of them and of what
        # the feed pulled (what others put in or took out); whether another consumer of the queue
        # was seen; a count asked for; counts never answered.
        self._pass_moved = 0
        self._pass_back = 0
        self._moved_total = 0
        self._others_high: int | None = None
        self._others_low = 0
        self._others = False
        self._probing = False
        self._unanswered = 0
        # Handing back what the feed holds (see `look`): the wall-clock time of the next, and the delay.
        self._next_hand_back: float | None = None
        self._hand_back_delay = HAND_BACK_FIRST
        # Going round when walled in (see `go_round`): not before `_walled_next`; the delay after a
        # go-round that brought the links nothing (0: at once), and what they had had at the last.
        self._walled_next = 0.0
        self._walled_delay = 0.0
        self._walled_delivered = -1

    # ------------------------------------------------------------------ passes
    def pass_tag(self) -> str:
        """What a copy moved in the current pass carries as the pass that moved it."""
        return f"{self.token}#{self.pass_no}"

    def open_pass(self) -> None:
        """One more search of the queue: it ends only at a copy moved after now."""
        self.pass_no += 1
        self.pass_open = True
        self._pass_moved = self._pass_back = 0
        self._next_look = None
        self._look_delay = self.look_again

    def filters(self, identities: frozenset, added: bool = False) -> None:
        """The feed's outlets have the filters `identities` now; `added`: because a link attached,
        and a filter new to the feed opens a pass."""
        changed = identities != self.identities
        self.identities = identities
        self._marks_moved.clear()
        if added and changed:
            self.open_pass()

    def published(self) -> bool:
        """A client published to the queue through the proxy: the search goes on at least until a
        copy moved after it comes round (a new pass: the end of the current one may lie before it).
        Whether a pass was open already."""
        was_open = self.pass_open
        self.open_pass()
        return was_open

    def credit(self, identity: str) -> None:
        """A link with the filter `identity` gained credit: if messages it selects were moved while
        its links had none, go round once more for them (a new pass even if one is open: that one
        may end at a copy it moved before them)."""
        if identity in self.deferred:
            self.deferred.discard(identity)
            self.open_pass()

    def defer(self, identities: Iterable[str]) -> None:
        """A message the filters `identities` select (their links have no credit) was moved."""
        self.deferred.update(identities)

    def searching(self, outlets: Iterable[Any]) -> bool:
        """Moving: a pass is open, or another daemon on the queue has offered messages to a filter
        of its own lately (its links may wait for what this one holds), and a link here waits."""
        return (self.pass_open or bool(self.live_foreign())) and any(o.credit > 0 for o in outlets)

    def pulled(self, mark: dict, outlets: Iterable[Any]) -> bool:
        """A pulled message no outlet could take, marked `mark`.  A copy this pass moved ends the
        pass (True: everything that was in the queue before it has been offered); with no pass
        open, one not yet offered to a filter here opens one while a link waits (there may be more
        behind it)."""
        if self.pass_open:
            last = mark.get("")
            if last is not None and last[0] == self.pass_tag():
                self.pass_open = False
                return True
        elif not self.identities.issubset(mark) and any(o.credit > 0 for o in outlets):
            self.open_pass()
        return False

    # ------------------------------------------------------------------ moved or held
    def keep(self, c: Any) -> bool:
        """A message some outlet selects (none with credit has taken it): held while such messages
        take less than `reserve` of the window, the oldest first; past it, it may be moved like a
        non-matching one (it comes round to its links, and a pass starts when one gets credit).  A
        redelivered message is always held."""
        if c.redelivered or self.kept < self.reserve:
            if not c.redelivered:
                c.kept = True
                self.kept += 1
            return True
        return False

    def movable(self, c: Any) -> bool:
        """During a pass everything is moved (to go round the queue) but what the broker refused a
        copy of in it; after it only what a filter of another daemon was not offered yet."""
        return c.refused != self.pass_no and (self.pass_open or not self.done(c.mark))

    def to_move(self, c: Any, wanted: bool, readable: bool = True) -> bool:
        """While searching, whether a message no outlet took is moved (else held): `wanted` (some
        outlet here selects it) within the reserve is kept; an unreadable one (no mark can be
        written on it) is never moved; else as `movable`."""
        if wanted and self.keep(c):
            return False
        return readable and self.movable(c)

    def recount(self, c: Any) -> None:
        """A held message left as it is (no move can start now; `kept` was set to 0 before the
        messages are gone through): a kept one stays kept within the reserve."""
        if c.kept:
            if self.kept < self.reserve:
                self.kept += 1
            else:
                c.kept = False

    def may_hand_back(self, c: Any) -> bool:
        """Whether a held message may be handed back (see `look`): not one whose copy the broker
        refused in this pass, nor one kept for links here."""
        return c.refused != self.pass_no and not c.kept

    def copy_accepted(self, moved_in: int) -> None:
        """The broker accepted a copy moved in pass `moved_in`."""
        if moved_in == self.pass_no:
            self._pass_moved += 1
        self._moved_total += 1

    # ------------------------------------------------------------------ marks
    def new_mark(self, old: dict) -> tuple[dict, Any]:
        """The mark a move gives a message marked `old`, now, and what it is written as: cached per
        (old mark, second, pass), as most copies of a pass share them."""
        ms = int(self._wall()) * 1000  # whole seconds: most copies of a pass share one mark
        tag = self.pass_tag()
        cache_key = (id(old), ms, tag)
        hit = self._marks_moved.get(cache_key)
        if hit is not None and hit[0] is old:
            return hit[1], hit[2]
        stamp = [self.token, ms]
        mark = dict(old)
        for identity in self.identities:
            # the time of the first offer: moving it again is no sign of life for the others
            mark.setdefault(identity, stamp)
        mark[""] = [tag, ms]  # which pass moved it last
        written = self._encode(mark)
        if len(self._marks_moved) >= 64:
            self._marks_moved.clear()
        self._marks_moved[cache_key] = (old, mark, written)  # (holds `old`: its id is not reused)
        return mark, written

    def learn(self, mark: dict) -> None:
        """A pulled message carries `mark` (not empty): another daemon moved it, or offered it to a
        filter this feed did not know (one more pass, and the messages held here that it was not
        offered must reach it), or it is a copy of this pass come back."""
        last = mark.get("")
        if last is not None and not last[0].startswith(self.token + "#"):
            self._others = True  # moved by another daemon on this queue
        for identity, (token, ms) in mark.items():
            if identity and token != self.token and identity not in self.identities:
                seen = ms / 1000.0
                if identity not in self._foreign and seen > self._wall() - self.foreign_ttl:
                    self.open_pass()
                if seen > self._foreign.get(identity, 0.0):
                    self._foreign[identity] = seen
        if mark.get("", _NO_PASS)[0] == self.pass_tag():
            self._pass_back += 1  # a copy of this (or the last) pass came back

    def live_foreign(self) -> list[str]:
        """The filters other daemons offered messages to in the last `foreign_ttl` seconds that are
        not filters here."""
        if not self._foreign:
            return []
        horizon = self._wall() - self.foreign_ttl
        for identity in [i for i, seen in self._foreign.items() if seen < horizon]:
            del self._foreign[identity]
        return [i for i in self._foreign if i not in self.identities]

    def done(self, mark: dict) -> bool:
        """Offered to every filter here and to every filter another daemon is known to serve now
        (the key "" names the pass that moved it last, not a filter)."""
        if not self.identities.issubset(mark):
            return False
        return all(i in mark for i in self.live_foreign())

    # ------------------------------------------------------------------ between passes
    def rest(self) -> None:
        """(the feed's tick) No link waits, or the feed does not search: no look, no hand-back due."""
        self._next_look = None
        self._next_hand_back = None

    def look(self, probe: Callable[[Callable[[int | None], None]], bool | None] | None,
             answer: Callable[[int | None], None], moving: int) -> bool:
        """(the feed's tick, about once a second, while links wait) Whether to look at the queue
        again now: True when a pass opened.  `probe(answer)` asks the upstream for the queue's ready
        count (None: this upstream has no such question; see `forwarding.FeedIO`); the answer comes
        to `counted`.  `moving`: the feed's moves in flight.

        A pass that is over while links still wait, and nothing in flight: ask the upstream how
        many messages the queue has ready.  What the queue should hold is known: the copies of the
        last pass not yet pulled back.  More than that is a message this feed never saw (published
        directly behind the finished pass): one more pass.  The count net of everything this feed
        pulled and moved is what others put in or took out: when it first falls, another consumer
        takes messages (another daemon, which may wait for what this one holds, and whose copies
        carry its filters): one more pass.  While the counts stay put nothing is moved but for a
        rare look again (`COUNTED_LOOK` × `look_again`, then doubling): another consumer that took
        its messages before this feed's first count never makes the count fall.

        Once another consumer was seen (a fall, or a copy another daemon moved), its own moves
        make copies this feed did not move, so from then on only a net count higher than ever
        starts a pass, and looking again after a while remains (10 s, then twice as long each time,
        at most 10 minutes; any other reason for a pass starts the delays over): the counts cannot
        tell a message published while the other consumer takes one.  So does an upstream that
        cannot be asked (no `probe`) or did not answer twice.

        A feed that holds messages after its pass while its links wait hides them from every other
        consumer of the queue, and when it is blocked (its window full of messages every filter it
        knows was offered) it sees nothing new either: another daemon may hold this one's messages
        while this one holds its, and neither pulls the copy that would tell it of the other.
        Neither a count (what others hold unsettled is not in it) nor a rare look again ends that
        soon.  So such a feed hands back what it holds that no link here selects (`hand_back_due`,
        asked before this): it moves those messages to the tail (no pass: each is moved once) and
        pulls as many, first `HAND_BACK_FIRST` second after it began holding, then twice as long
        each time up to `look_again_max`, at whole multiples of the delay on the wall clock, so
        that daemons blocked alike hand back at the same moment and each pulls the other's copies
        (their marks name the other's filters: from then on the search serves both).  Alone, it
        costs at most a window of moves now and then."""
        if self.pass_open:
            self._next_look = None
            return False
        if probe is not None and self._unanswered < 2:
            if not self._probing and moving == 0:
                asked = probe(answer)
                if asked is None:
                    self._unanswered = 2  # never asked: look again instead, from now on
                self._probing = bool(asked)
            if not self._others and self._unanswered < 2:
                # No other consumer seen: the counts tell nearly everything, so look again only
                # rarely (COUNTED_LOOK times later): a consumer that had already taken its messages
                # before the first count never makes the count fall.
                self._look_delay = max(self._look_delay, self.look_again * COUNTED_LOOK)
        now = self._clock()
        if self._next_look is None:
            self._next_look = now + self._look_delay
        elif now >= self._next_look:
            delay = min(self._look_delay * 2, self.look_again_max)
            self.open_pass()
            self._look_delay = delay
            return True
        return False

    def counted(self, n: int | None, busy: bool, pulled: int) -> bool:
        """The upstream's answer to a probe (see `look`): n messages ready, -1 the question was
        withdrawn, None no answer.  `busy`: the feed stops or has moves in flight (the count tells
        nothing then); `pulled`: every upstream delivery the feed has had.  True when a pass opened."""
        self._probing = False
        if n is None:
            self._unanswered += 1
            return False
        self._unanswered = 0
        if n < 0 or busy or self.pass_open:
            return False
        net = n - self._moved_total + pulled  # the queue as others left it
        if self._others_high is None:
            self._others_high = self._others_low = net
        grew = net > self._others_high
        met = net < self._others_low and not self._others
        self._others_high = max(self._others_high, net)
        self._others_low = min(self._others_low, net)
        if met:
            self._others = True
        if met or (grew if self._others else n > self._pass_moved - self._pass_back):
            self.open_pass()
            return True
        return False

    def hand_back_due(self, holding: bool, moving: int) -> bool:
        """(the feed's tick, while links wait) Whether to hand back now what the feed holds that no
        link here selects (see `look`): `holding`, no pass open, at the next whole multiple of the
        delay on the wall clock, with no move in flight; the delay then doubles."""
        if self.pass_open or not holding:
            self._next_hand_back = None
            self._hand_back_delay = HAND_BACK_FIRST
            return False
        wall = self._wall()
        delay = self._hand_back_delay
        if self._next_hand_back is None:
            # the first whole multiple of the delay at least half of it away
            self._next_hand_back = math.ceil((wall + delay / 2) / delay) * delay
            return False
        if wall < self._next_hand_back or moving:
            return False
        self._hand_back_delay = min(delay * 2, max(self.look_again_max, HAND_BACK_FIRST))
        self._next_hand_back = None
        return True

    def go_round(self, delivered: int) -> bool:
        """The feed is walled in (its window full, what it holds offered to every filter it knows):
        whether to go round again now, which opens a pass.  Only while another daemon on the queue
        offers messages to its filters (what it moved may lie behind them): at once while the last
        go-round brought the links something (`delivered`: what the feed has sent to clients), else
        `WALLED_FIRST` s after it, doubling up to `WALLED_MAX` (the tick asks again).  Messages no
        daemon's links select would otherwise go round for as long as the other daemon is live,
        which under steady traffic is for ever."""
        if self.pass_open or not self.live_foreign():
            return False
        now = self._clock()
        if now < self._walled_next:
            return False
        if delivered != self._walled_delivered:
            self._walled_delay = 0.0
        else:
            self._walled_delay = min(WALLED_MAX, max(WALLED_FIRST, self._walled_delay * 2))
        self._walled_delivered = delivered
        self._walled_next = now + self._walled_delay
        self.open_pass()
        return True
