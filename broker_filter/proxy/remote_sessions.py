"""How a remote upstream (`remote.RemoteUpstream`) places its links in sessions and bounds the broker's
answers: the part of the upstream connection that applies `sessions.Sessions`' decisions.

Each link of the proxy's own gets a session of its own (`remote_links._RemoteLink`): a parked idle
one on RabbitMQ 4, else a new one, which begins at once or waits while an ended session may still
hold its channel number at the broker (`sessions.BEGIN_HOLD`).  Timers run what `Sessions` answers
with due times: the held begins, the end of sessions idle for `SESSION_IDLE`, a channel freed a
moment after its end was answered.  A begin or attach the broker leaves unanswered for
`answer_timeout` seconds refuses its link and reconnects the upstream connection, as do ended
sessions holding unsettled deliveries whose end stays unanswered (`_check_abandoned`): such a session
can be neither ended nor trusted, and on RabbitMQ 3.10 only its end or the connection's close
returns what it holds.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from ..engine.endpoints import LOCAL_CLOSED, REMOTE_CLOSED, REMOTE_UNINIT, Condition
from .remote_links import RemoteConsumer, _RemoteLink, link_state, session_state
from .sessions import Sessions
from .upstream import ErrorInfo, Loop

log = logging.getLogger("broker_filter.proxy.upstream")


class SessionPlacement:
    """`RemoteUpstream`'s sessions: placement, recycling, their timers and the unanswered-answer bounds
    (module docstring).  Uses the upstream's `sessions`, `connection`, `loop`, `answer_timeout`, `name`,
    `stopped`, `_close_connection` and `_lost`."""

    name: str
    sessions: Sessions
    connection: Any
    connected: bool
    stopped: bool
    loop: Loop | None
    answer_timeout: float
    stuck_reconnects: int
    _hold_timer: Any
    _idle_timer: Any
    _abandoned_timer: Any
    _stop_timer: Any

    @property
    def recycles_sessions(self) -> bool:
        """RabbitMQ 4: sessions outlive their links (broker_filter/proxy/sessions.py)."""
        return self.sessions.recycles

    @property
    def unanswered_ends(self) -> int:
        """Ended sessions given up on after `sessions.BEGIN_HOLD`."""
        return self.sessions.unanswered_ends

    def _session_for(self, endpoint: _RemoteLink) -> Any:
        """A session of the endpoint's own (see _RemoteLink), or None when the upstream is down: the
        endpoint is then told so on the next turn of the loop.  Which session, and whether it begins
        now, `self.sessions` decides."""
        if not self.connected or self.connection is None:
            self.loop.call_soon(lambda: endpoint._closed_by_upstream(
                ErrorInfo("amqp:connection:forced", f"upstream {self.name} is not connected", transient=True)))
            return None
        session = self.sessions.take_idle()
        if session is not None:
            session_state(session).endpoint = endpoint
            endpoint.session = session
            return session
        session = self.connection.session()
        session_state(session).endpoint = endpoint
        endpoint.session = session
        if self.sessions.begin(session):
            session.open()
        elif self._hold_timer is None:  # it begins, then its link attaches, in _begin_waiting
            self._hold_timer = self._at(self.sessions.hold_due(), self._begin_waiting)
        self._arm_abandoned()
        return session

    def _at(self, due: float, fn: Callable[[], None], least: float = 0.0) -> Any:
        """Run `fn` on the loop at `due` on the sessions' clock (at least `least` seconds from now)."""
        return self.loop.call_later(max(least, due - self.sessions.clock()), fn)

    def _ended_answered(self, session: Any) -> None:
        free_at = self.sessions.answered(session)
        if self.stopped:
            self.sessions.freed(session)
            if not self.sessions.ended and self._stop_timer is not None:
                self._close_connection()
            return
        if free_at is not None:
            # The broker forgets the channel only after it answered: keep it busy a moment longer.
            self._at(free_at, functools.partial(self._channel_free, session, self.connection))
            return
        self._channel_free(session, self.connection)

    def _channel_free(self, session: Any, connection: Any) -> None:
        if connection is not self.connection:
            return  # from a connection since lost, whose state went with it
        if self.sessions.freed(session):
            self._begin_waiting()

    def _recycle_after_detach(self, session: Any, link: Any) -> None:
        """Keep `session` for the next link once `link`'s detach is answered (RabbitMQ 4)."""
        if session.local_state == LOCAL_CLOSED:
            return
        if link.remote_state == REMOTE_CLOSED:
            self._park(session)
        else:
            link_state(link).recycle = session  # on_link_close parks it

    def _park(self, session: Any) -> None:
        session_state(session).endpoint = None
        if (self.connection is None or session.connection is not self.connection
                or session.local_state == LOCAL_CLOSED or session.remote_state == REMOTE_CLOSED):
            return
        if self.sessions.park(session) and self._idle_timer is None:
            self._idle_timer = self._at(self.sessions.idle_due(), self._end_idle)

    def _end_idle(self) -> None:
        """End the sessions idle for SESSION_IDLE seconds; look again while some are left."""
        self._idle_timer = None
        for session in self.sessions.end_idle():
            session.close()
        due = self.sessions.idle_due()
        if due is not None:
            self._idle_timer = self._at(due, self._end_idle, least=0.1)

    def _begin_waiting(self) -> None:
        waiting = self.sessions.begin_waiting()
        self._arm_abandoned()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        for session in waiting:
            session.open()
            # Opened only now: proton sends no attach for a link opened before its session began.
            endpoint = session_state(session).endpoint
            endpoint.link.open()
            self._await_answer(endpoint)

    # ------------------------------------------------------------------ unanswered begins, attaches, ends
    def _await_answer(self, endpoint: _RemoteLink) -> None:
        """Bound the wait for the answer to the begin and attach just sent for `endpoint`."""
        self.loop.call_later(self.answer_timeout,
                             functools.partial(self._check_answer, endpoint, self.connection))

    def _check_answer(self, endpoint: _RemoteLink, connection: Any) -> None:
        """`answer_timeout` after an attach went out: if it is still unanswered, the client link is
        refused and the upstream connection reconnected (a session the broker does not answer can be
        neither ended nor trusted, and on RabbitMQ 3.10 only its end or the connection's close
        returns what it holds unsettled)."""
        if connection is not self.connection or endpoint.ready or endpoint.closed:
            return
        session = endpoint.session
        what = "begin" if session is None or session.remote_state == REMOTE_UNINIT else "attach"
        link = endpoint.link.name if endpoint.link is not None else "?"
        address = endpoint.spec.address if isinstance(endpoint, RemoteConsumer) else endpoint.address
        reason = (f"upstream {self.name} did not answer the {what} of link {link} (address {address}) "
                  f"within {self.answer_timeout:g} s")
        # (not transient: this link is what the broker left unanswered, so it is refused, not resumed;
        # the other links of the connection are closed transiently by the reconnect, and resumed)
        endpoint._closed_by_upstream(ErrorInfo(
            "amqp:link:detach-forced", f"{reason}; the daemon reconnects to it: attach again", transient=False))
        self._reconnect_stuck(reason)

    def _arm_abandoned(self) -> None:
        """Look again when ended sessions given up on while holding unsettled deliveries are
        `answer_timeout` old (never while `sessions.RECONNECT_FOR_ENDS` is off)."""
        due = self.sessions.abandoned_due(self.answer_timeout)
        if due is not None and self._abandoned_timer is None:
            self._abandoned_timer = self._at(due, self._check_abandoned)

    def _check_abandoned(self) -> None:
        self._abandoned_timer = None
        due = self.sessions.abandoned_due(self.answer_timeout)
        if due is None or self.connection is None:
            return
        if due <= self.sessions.clock():
            self._reconnect_stuck(f"upstream {self.name} did not answer the end of {len(self.sessions.abandoned)} "
                                  f"session(s) holding unsettled messages within {self.answer_timeout:g} s")
        else:
            self._abandoned_timer = self._at(due, self._check_abandoned)

    def _reconnect_stuck(self, reason: str) -> None:
        if self.stopped or self.connection is None:
            return
        log.warning("%s; reconnecting the upstream connection (its links are detached and attach again)", reason)
        self.stuck_reconnects += 1
        self._lost(Condition("amqp:connection:forced", reason), cause="unanswered")

    def _drop_waiting(self, session: Any) -> bool:
        """Forget a session that never began (its endpoint closed while it waited)."""
        if not self.sessions.drop_waiting(session):
            return False
        session_state(session).endpoint = None
        session.free()
        return True
