"""Lifecycle: signals and graceful shutdown of the daemon.

Theory of operation.  The first SIGTERM (or SIGINT) asks the daemon to drain.  The signal handler
itself only hands the request to the event loop (`EventLoop.call_soon_threadsafe`: a deque append
and a byte written to the loop's non-blocking wake-up pipe, safe between any two bytecodes of the
main thread): the engine's objects are touched on the loop's thread alone.  There the listener stops
accepting, `/readyz` turns 503, and the daemon waits until no delivery is in flight (sent to a
client and not yet settled, or published by a client and not yet settled upstream) or
`shutdown.grace_period` has passed.  Then every client link is detached and
every client connection closed with `amqp:connection:forced` ("broker-filter is shutting down"),
the upstream is stopped, and once the client connections are closed and the upstream broker has
answered the upstream connection's close (at most two seconds; the outcomes written before that
close have then reached it) the loop ends: exit status 0.  Deliveries still unsettled at that point
go back to the upstream broker, which redelivers them (at-least-once).  The waits poll every
0.1 s on the loop's timers (`call_later`).  A second signal forces: the loop is interrupted wherever
it is and the daemon exits with 128 + the signal number.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import logs
from ..engine.endpoints import LOCAL_CLOSED, LOCAL_UNINIT, Condition, Connection, Delivery, Handler, Link, Session
from .records import ClientConnection

log = logging.getLogger("broker_filter.lifecycle")

SHUTDOWN_CONDITION = "amqp:connection:forced"
SHUTDOWN_DESCRIPTION = "broker-filter is shutting down"
_CLOSE_WAIT = 2.0
_POLL = 0.1


class Forced(BaseException):
    """Raised by the second signal to unwind the event loop at once."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class ConnectionRegistry(Handler):
    """The engine handler in front of the proxy's: remembers open client connections, and passes every
    client event on with the connection and link ids as ambient log context (`broker_filter.logs`),
    so whatever the proxy logs while handling it names the connection and link."""

    def __init__(self, inner: Handler):
        self.inner = inner
        self.connections: set[Connection] = set()

    def on_accepted(self, connection: Connection) -> None:
        self._forward(self.inner.on_accepted, connection)

    def on_connection_open(self, connection: Connection) -> None:
        self.connections.add(connection)
        self._forward(self.inner.on_connection_open, connection)

    def on_connection_close(self, connection: Connection) -> None:
        self._forward(self.inner.on_connection_close, connection)

    def on_session_open(self, session: Session) -> None:
        self._forward(self.inner.on_session_open, session)

    def on_session_close(self, session: Session) -> None:
        self._forward(self.inner.on_session_close, session)

    def on_link_open(self, link: Link) -> None:
        self._forward(self.inner.on_link_open, link)

    def on_link_close(self, link: Link) -> None:
        self._forward(self.inner.on_link_close, link)

    def on_flow(self, link: Link) -> None:
        self._forward(self.inner.on_flow, link)

    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        self._forward(self.inner.on_message, delivery, data)

    def on_delivery_update(self, delivery: Delivery) -> None:
        self._forward(self.inner.on_delivery_update, delivery)

    def on_disconnected(self, connection: Connection, error: Condition | None) -> None:
        self.connections.discard(connection)
        self._forward(self.inner.on_disconnected, connection, error)

    def _forward(self, method: Callable[..., None], subject: Any, *rest: Any) -> None:
        token = logs.enter(event_ids, subject)
        try:
            method(subject, *rest)
        finally:
            logs.leave(token)

    def open_connections(self) -> list[Connection]:
        return [c for c in self.connections if c.local_state != LOCAL_CLOSED]


def event_ids(subject: Any) -> dict[str, Any]:
    """{"conn": the proxy's connection id, "link": the link name} of what an event is about (a
    connection, session, link or delivery of the engine), as known."""
    ids: dict[str, Any] = {}
    link = subject.link if isinstance(subject, Delivery) else subject if isinstance(subject, Link) else None
    connection = (subject if isinstance(subject, Connection) else subject.connection
                  if isinstance(subject, (Session, Link)) else None)
    if connection is not None:
        state = connection.context  # the proxy's per-connection state, once admitted
        conn_id = state.id if isinstance(state, ClientConnection) else None
        if conn_id is None and connection.io is not None:
            conn_id = f"from {connection.io.peer}"
        if conn_id is not None:
            ids["conn"] = conn_id
    if link is not None:
        ids["link"] = link.name
    return ids


class GracefulShutdown:
    """Installs the signal handlers and runs the drain on the event loop's thread.

    in_flight(): deliveries not yet settled (0 lets the drain finish early).
    stop_accepting(): close the listening socket.  before_stop(): e.g. stop the upstream.
    """

    def __init__(
        self,
        container: Any,  # an EngineContainer: its engine loop (`container.loop`) runs the drain
        registry: ConnectionRegistry,
        *,
        grace_period: float,
        in_flight: Callable[[], int],
        stop_accepting: Callable[[], None],
        before_stop: Callable[[], None] = lambda: None,
        upstream_closing: Callable[[], bool] = lambda: False,
        health: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._container = container
        self._loop = container.loop
        self._registry = registry
        self._grace = grace_period
        self._in_flight = in_flight
        self._stop_accepting = stop_accepting
        self._before_stop = before_stop
        self._upstream_closing = upstream_closing
        self.health = health
        self._clock = clock
        self._previous: dict[int, Any] = {}
        self.requested_by: int | None = None
        self.finished = False
        self._deadline = 0.0
        self._phase = "running"

    # signals (any thread may be interrupted; only the loop's thread-safe entry point is touched)

    def install(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested_by is not None:
            raise Forced(signum)
        self.request(signum)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a graceful shutdown (thread-safe)."""
        if self.requested_by is None:
            self.requested_by = signum
        if not self.finished:
            self._loop.call_soon_threadsafe(self._requested)

    # the event loop's thread

    def _requested(self) -> None:
        if self.requested_by is not None and self._phase == "running":
            self._begin()

    def _poll(self) -> None:
        try:
            if self._phase == "draining":
                self._drain()
            elif self._phase == "closing":
                self._closing()
        except Exception:  # noqa: BLE001 - the shutdown itself must not crash the loop
            log.exception("graceful shutdown step failed; stopping now")
            self._stop()

    def _begin(self) -> None:
        self._phase = "draining"
        self._deadline = self._clock() + self._grace
        log.info("shutdown requested: no new connections, draining in-flight deliveries",
                 extra={"fields": {"grace_period": self._grace}})
        try:
            self._stop_accepting()
        except Exception:  # noqa: BLE001
            log.exception("closing the listener failed")
        if self.health is not None:
            self.health.set_ready(False, "shutting down")
        self._drain()

    def _drain(self) -> None:
        pending = self._in_flight()
        if pending and self._clock() < self._deadline:
            self._loop.call_later(_POLL, self._poll)
            return
        if pending:
            log.warning("grace period over with deliveries in flight; they return to the upstream",
                        extra={"fields": {"in_flight": pending}})
        self._close_clients()

    def _close_clients(self) -> None:
        self._phase = "closing"
        condition = Condition(SHUTDOWN_CONDITION, SHUTDOWN_DESCRIPTION)
        for connection in self._registry.open_connections():
            for session in list(connection.sessions):
                for link in list(session.links):
                    state = link.local_state
                    if state != LOCAL_CLOSED:
                        if state == LOCAL_UNINIT:
                            link.open()
                        link.close(condition)
            connection.close(condition)
        try:
            self._before_stop()
        except Exception:  # noqa: BLE001
            log.exception("stopping the upstream failed")
        self._deadline = self._clock() + _CLOSE_WAIT
        self._closing()

    def _closing(self) -> None:
        # The upstream's close is waited for too: the outcomes written just before it (a move's
        # accepted original) must reach the broker, or it would redeliver what was settled.
        busy = self._registry.connections or self._upstream_closing()
        if busy and self._clock() < self._deadline:
            self._loop.call_later(_POLL, self._poll)
            return
        self._stop()

    def _stop(self) -> None:
        self._phase = "stopped"
        self.finished = True
        self._container.stop()
