"""The upstream connection's sessions, without I/O: which session a new link gets, which sessions
begin now and which wait, which end, and when the next look is due.

Every link of `remote.RemoteUpstream` has a session of its own, ended with it: RabbitMQ 3.10 returns
a consumer's unsettled messages to the queue only when its session ends, and answers some errors (a
missing exchange) by ending the session, which must take down only the endpoint concerned.  A new
session never begins while one the proxy ended still waits for the broker's `end`: proton reuses the
lowest free channel number as soon as its own `end` is out, and RabbitMQ 4 hands a `begin` arriving
on a channel whose session is still ending to that session, which never answers it (the link would
hang).  Such sessions wait (at most `BEGIN_HOLD` seconds from the oldest end) and begin when the ends
are in; an end unanswered for `BEGIN_HOLD` is given up on (`give_up_ends`, counted in
`unanswered_ends`: RabbitMQ 3.10 leaves some ends unanswered) so later sessions begin at once.
RabbitMQ 4 frees the channel a moment *after* answering an `end` (its reader forgets the channel when
the session process exits), so even a `begin` sent right after the answer can go to the dying
session; but RabbitMQ 4 also returns a detached link's unsettled messages itself.  On RabbitMQ 4
(`recycles`, by its `version` property) a link's session therefore outlives the link: once the
detach is answered the session waits, idle, for the next link (`SESSION_IDLE` seconds, then it
ends), new links take idle sessions first (the most recently parked: the oldest may soon end), and a
`begin` after an `end` waits `END_SETTLE` seconds past the answer.  What an ended session held unsettled is remembered
(`holding`); one given up on while it held some would make the upstream reconnect
(`abandoned_due`) if `reconnect_for_ends` were on, which it is not (`RECONNECT_FOR_ENDS`).  When the
connection is lost every session goes with it (`reset`).

Sessions are any hashable handles; `remote.RemoteUpstream` passes proton sessions and applies what
this class decides: it begins, closes and frees them, and runs the timers at the times given here
(`hold_due`, `idle_due`, `abandoned_due`, `answered`), read on the injected `clock`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

log = logging.getLogger("broker_filter.proxy.upstream")

BEGIN_HOLD = 1.0  # longest wait for an ended session's answer, counted from its end
SESSION_IDLE = 30.0  # RabbitMQ 4: how long a session whose link detached waits for another link before it ends
END_SETTLE = 0.25  # RabbitMQ 4: how long after an end is answered its channel is still taken to be busy
# Reconnect when an ended session holding unsettled deliveries stays unanswered: off.  (It detached
# every link of the connection each time a queue feed ended holding messages, which RabbitMQ 3.10
# does in ordinary traffic; what such a session holds it returns when the connection closes.)
RECONNECT_FOR_ENDS = False


class Sessions:
    """The sessions of one upstream connection the proxy must remember: ended and unanswered
    (`ended`, session -> when ended), waiting to begin (`waiting`, in order), idle for reuse
    (`idle`, session -> since when, oldest first), and of the ended ones those that held unsettled
    deliveries (`holding`, session -> how many) and those given up on while holding some
    (`abandoned`, session -> when ended).  `recycles`: sessions outlive their links (RabbitMQ 4)."""

    def __init__(self, name: str = "", clock: Callable[[], float] = time.monotonic, *,
                 reconnect_for_ends: bool = RECONNECT_FOR_ENDS):
        self.name = name  # the upstream's, for the log
        self.clock = clock
        self.reconnect_for_ends = reconnect_for_ends
        self.recycles = False
        self.ended: dict[Hashable, float] = {}
        self.waiting: list[Hashable] = []
        self.idle: dict[Hashable, float] = {}
        self.holding: dict[Hashable, int] = {}
        self.abandoned: dict[Hashable, float] = {}
        self.unanswered_ends = 0  # ended sessions given up on after BEGIN_HOLD

    def reset(self) -> None:
        """The connection is lost, and its sessions with it (`unanswered_ends` counts on)."""
        self.ended.clear()
        self.abandoned.clear()
        self.holding.clear()
        self.waiting.clear()
        self.idle.clear()

    # ------------------------------------------------------------------ a new link
    def take_idle(self) -> Hashable | None:
        """An idle session for a new link, no longer idle: the most recently parked; None if none."""
        if not self.idle:
            return None
        return self.idle.popitem()[0]

    def begin(self, session: Hashable) -> bool:
        """A new session for a link: True, begin it now; False, it waits in `waiting` for the ended
        sessions' answers, at the latest until `hold_due()` (then `begin_waiting`)."""
        if self.ended and self.hold_due() <= self.clock():
            self.give_up_ends()
        if self.ended:
            self.waiting.append(session)
            return False
        return True

    def hold_due(self) -> float:
        """When the waiting sessions begin even without the answers (`ended` must not be empty)."""
        return min(self.ended.values()) + BEGIN_HOLD

    def drop_waiting(self, session: Hashable) -> bool:
        """Forget a session that never began (its link closed while it waited); False if it was not
        waiting."""
        if session not in self.waiting:
            return False
        self.waiting.remove(session)
        return True

    def begin_waiting(self) -> list[Hashable]:
        """The waiting sessions, to begin now in order (`hold_due` has come, or every end is in):
        every ended session still unanswered is forgotten, those older than BEGIN_HOLD counted."""
        self.give_up_ends()
        if self.ended:
            log.warning("upstream %s: %d ended session(s) unanswered; beginning %d waiting session(s)",
                        self.name, len(self.ended), len(self.waiting))
            for session, at in list(self.ended.items()):
                self._abandon(session, at)
            self.ended.clear()
        waiting, self.waiting = self.waiting, []
        return waiting

    # ------------------------------------------------------------------ ends
    def ending(self, session: Hashable, holding: int = 0) -> None:
        """`session` was ended here; `holding`: deliveries it had received and not settled (RabbitMQ
        3.10 returns them to their queue when the end is handled)."""
        self.ended[session] = self.clock()
        if holding:
            self.holding[session] = holding

    def answered(self, session: Hashable) -> float | None:
        """The broker answered the end of `session`, which the proxy ended: None, its channel is
        free now (call `freed`); or when it is (RabbitMQ 4: END_SETTLE later)."""
        self.abandoned.pop(session, None)
        self.holding.pop(session, None)
        if self.recycles and session in self.ended:
            return self.clock() + END_SETTLE
        return None

    def freed(self, session: Hashable) -> bool:
        """The channel of `session` is free: True, begin the waiting sessions now (`begin_waiting`)."""
        self.ended.pop(session, None)
        return not self.ended and bool(self.waiting)

    def give_up_ends(self) -> int:
        """Forget the ended sessions unanswered for BEGIN_HOLD: later sessions begin at once instead
        of each waiting for an answer that may never come (RabbitMQ 3.10 leaves some ends
        unanswered).  A late answer is still handled (`answered`); what such a session holds
        unsettled the broker returns to its queue when the upstream connection closes.  How many."""
        cutoff = self.clock() - BEGIN_HOLD
        stale = [session for session, at in self.ended.items() if at <= cutoff]
        if stale:
            log.warning("upstream %s: %d ended session(s) unanswered after %.0f s; giving up on them",
                        self.name, len(stale), BEGIN_HOLD)
            self.unanswered_ends += len(stale)
            for session in stale:
                self._abandon(session, self.ended.pop(session))
        return len(stale)

    def _abandon(self, session: Hashable, ended_at: float) -> None:
        """An ended session given up on: remembered in `abandoned` only if it held unsettled
        deliveries and `reconnect_for_ends` is on."""
        if self.reconnect_for_ends and self.holding.get(session):
            self.abandoned[session] = ended_at

    def abandoned_due(self, timeout: float) -> float | None:
        """When the upstream reconnects for the abandoned sessions: `timeout` after the oldest ended
        (None: none abandoned)."""
        return min(self.abandoned.values()) + timeout if self.abandoned else None

    # ------------------------------------------------------------------ idle sessions (RabbitMQ 4)
    def park(self, session: Hashable) -> bool:
        """`session`'s link is detached on both ends: it waits, idle, for the next link (`idle_due`).
        False if it was idle already."""
        if session in self.idle:
            return False
        self.idle[session] = self.clock()
        return True

    def drop_idle(self, session: Hashable) -> bool:
        """The broker ended `session`: no longer idle (False if it was not)."""
        return self.idle.pop(session, None) is not None

    def idle_due(self) -> float | None:
        """When the oldest idle session has been idle SESSION_IDLE seconds (None: none idle)."""
        for since in self.idle.values():
            return since + SESSION_IDLE
        return None

    def end_idle(self) -> list[Hashable]:
        """The sessions idle for SESSION_IDLE seconds, oldest first: no longer idle, ended now (to
        close)."""
        cutoff = self.clock() - SESSION_IDLE
        expired = [session for session, since in self.idle.items() if since <= cutoff]
        for session in expired:
            del self.idle[session]
            self.ending(session)
        return expired
