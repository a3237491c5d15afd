"""The daemon's proton handlers on the engine loop: a stand-in for the parts of proton's `Container`
the daemon uses (`broker-filter serve`).

Theory of operation.  The daemon's handlers (`proxy.server`, `proxy.remote`, `proxy.lifecycle`) are
written against proton's Python API: events with `event.connection`, `event.link`, wrappers with
attributes.  `EngineContainer` gives them that API over `loop.EventLoop`: every collector event of
a connection made here that the handlers answer (`HANDED_ON`) is wrapped as proton's `Event` and
dispatched to the connection's proton handler as the Container would, while the loop owns the sockets (epoll, no descriptor ceiling), TLS,
the listener's SASL exchange, heartbeats and the limits.  `connect()`, `handler.add()` (with
`on_reactor_quiesced` at the end of each turn; no daemon handler uses it now), `run()` and `stop()`
behave as the Container's do for the daemon.  Timers, signals and deferred work are not emulated:
they are the engine loop's own (`container.loop`: `call_later`, `call_soon_threadsafe`, and
`proxy.loop.EngineLoop` for `call_soon` at the end of a turn).

The per-message events do not cross the bridge: a handler that routes a link (`route(link,
Typed(...))`) gets that link's PN_DELIVERY as `transfer(delivery pointer)` and its PN_LINK_FLOW as
`credit()`, with no proton event or wrapper built (the deliveries straight from the engine's
`process`: the routes are the engine's `typed`, shared).  Routes are keyed by the link's pointer and
dropped before proton can free it (at PN_LINK_FINAL, and for every link of a connection whose
transport closed), so a reused address never reaches the wrong handler.  Attach, detach, open and
close stay on the bridge: they are rare.

    container = EngineContainer(container_id, client_tls=client_ssl_context(config.upstream.tls))
    listening = listen(container, config.listener, handler, max_connections=...)
    container.run()
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Callable

from ..amqp import types as t
from ..security import IDENTITY_ATTRIBUTE, UserDatabase, server_ssl_context
from ._cproton import ffi, lib
from .endpoints import Condition, Connection, Handler, SaslClient, read_data
from .loop import EventLoop, Limits
from .streams import ServerSasl, Verify

log = logging.getLogger("broker_filter.engine")
NULL = ffi.NULL


def client_ssl_context(tls: Any) -> ssl.SSLContext:
    """An `ssl.SSLContext` for amqps:// upstreams from `[upstream.tls]` (verify: peer-name, peer, none)."""
    context = ssl.create_default_context(cafile=tls.ca_file or None)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file or None, password=tls.key_password or None)
    if tls.verify == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif tls.verify == "peer":
        context.check_hostname = False
    return context


# The proton events the daemon's handlers answer (`broker_filter.proxy`).  The rest
# (PN_TRANSPORT after every change, the init, bound, local-state and final events of sessions and
# links) would be wrapped as proton's Event and dispatched to no method at all: wrapping is most of
# this bridge's cost, so they are not handed on.  tests/engine/test_bridge.py checks that no daemon
# handler defines a method for an event left out here.
_FLOW = lib.PN_LINK_FLOW
HANDED_ON = frozenset({
    lib.PN_CONNECTION_REMOTE_OPEN, lib.PN_CONNECTION_REMOTE_CLOSE, lib.PN_CONNECTION_FINAL,
    lib.PN_SESSION_REMOTE_OPEN, lib.PN_SESSION_REMOTE_CLOSE,
    lib.PN_LINK_REMOTE_OPEN, lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH, lib.PN_LINK_FLOW,
    lib.PN_DELIVERY, lib.PN_TRANSPORT_ERROR, lib.PN_TRANSPORT_CLOSED,
})


class Typed:
    """The per-message handlers of a routed link: `transfer(delivery)` for its PN_DELIVERY events
    (the raw `pn_delivery_t` pointer), `credit()` for its PN_LINK_FLOW events (None: not wanted),
    `failed()` when either raised (after the exception was logged)."""

    __slots__ = ("transfer", "credit", "failed", "connection")

    def __init__(self, transfer: Callable[[Any], None], credit: Callable[[], None] | None = None,
                 failed: Callable[[], None] | None = None):
        self.transfer = transfer
        self.credit = credit
        self.failed = failed
        self.connection: Any = None  # the link's `pn_connection_t` (set by `route`)


def link_pointer(link: Any) -> Any:
    """The `pn_link_t` of a proton Link wrapper (or the pointer itself)."""
    return getattr(link, "_impl", link)


class _Bridge(Handler):
    """The engine handler of a bridged connection: the engine's own defaults stay out of the way
    (the proton handler answers opens and closes, and frees its sessions and links)."""

    def on_connection_open(self, connection: Connection) -> None:
        pass

    def on_connection_close(self, connection: Connection) -> None:
        pass


_BRIDGE = _Bridge()


class _QuiescedEvent:
    """What an `on_reactor_quiesced` handler gets (nothing to read)."""

    __slots__ = ()


_QUIESCED = _QuiescedEvent()


class _Handlers:
    """`container.handler`: global handlers that hear `on_reactor_quiesced` at the end of each turn
    (an `after_turn` callback of the engine loop, added with the first handler)."""

    def __init__(self, container: EngineContainer) -> None:
        self._container = container
        self.handlers: list = []

    def add(self, handler: Any) -> None:
        if not self.handlers:
            self._container.loop.add_after_turn(self._container._quiesced)
        self.handlers.append(handler)


class EngineContainer:
    """The subset of proton's Container the daemon uses, on an `EventLoop`."""

    def __init__(self, container_id: str | None = None, *, client_tls: ssl.SSLContext | None = None):
        self.loop = EventLoop(container_id=container_id)
        self.client_tls = client_tls
        self.handler = _Handlers(self)
        self._proton: dict[Any, Any] = {}  # connection pointer -> its proton handler
        # links refused before their handler saw them -> their connection's pointer; forgotten at
        # PN_LINK_FINAL or when the connection's transport closes (the engine frees its links
        # then, and a new link at a reused address must reach the handler)
        self._refused: dict[Any, Any] = {}
        self.typed: dict[Any, Typed] = self.loop.typed  # link pointer -> its per-message handlers (`route`)
        self._routed: dict[Any, set] = {}  # connection pointer -> its routed links' pointers
        self.loop.observers = self._proton
        self.loop.observe = self._dispatch

    @property
    def container_id(self) -> str:
        return self.loop.container_id

    @container_id.setter
    def container_id(self, value: str) -> None:
        self.loop.container_id = value

    # connections -------------------------------------------------------------------------------

    def connect(self, url: str, handler: Any, *, reconnect: Any = False, properties: dict | None = None,
                ssl_domain: Any = None, heartbeat: float | None = None, user: str | None = None,
                password: str | None = None, allow_insecure_mechs: bool = True,
                allowed_mechs: str | None = None, virtual_host: str | None = None, **ignored: Any) -> Any:
        """A client connection like `Container.connect` (no reconnect: the caller reconnects);
        returns proton's Connection wrapper."""
        from proton import Connection as ProtonConnection
        from proton import Url

        parsed = Url(url)
        user = user if user is not None else parsed.username
        password = password if password is not None else parsed.password
        secure = parsed.scheme == "amqps"
        if secure and self.client_tls is None:
            raise ValueError(f"{url}: amqps needs [upstream.tls] for the engine's TLS")
        if user is not None:
            sasl = SaslClient("PLAIN", user, password or "")
        else:
            sasl = SaslClient(allowed_mechs or "ANONYMOUS")
        host = parsed.host or "127.0.0.1"
        port = int(parsed.port or (5671 if secure else 5672))
        connection = self.loop.connect(host, port, _BRIDGE, sasl=sasl, tls=self.client_tls if secure else None,
                                       idle_timeout=heartbeat or 0.0)
        self._proton[connection.ptr] = handler
        connection.open(hostname=virtual_host or host, properties=_symbol_keys(properties))
        return ProtonConnection.wrap(connection.ptr)

    def abort(self, connection: Any, condition: str, description: str) -> bool:
        """Drop a connection's transport without a close frame (as a peer whose socket closes), the
        reason logged and kept as its error; `connection` is proton's wrapper.  False if it is gone."""
        engine_connection = self.loop.connections.get(getattr(connection, "_impl", None))
        if engine_connection is None:
            return False
        self.loop.abort(engine_connection, Condition(condition, description))
        return True

    def adopt(self, connection: Connection, handler: Any) -> None:
        """Dispatch a server connection's events to a proton handler."""
        connection.handler = _BRIDGE
        self._proton[connection.ptr] = handler

    def route(self, link: Any, typed: Typed) -> None:
        """Hand `link`'s per-message events (PN_DELIVERY, PN_LINK_FLOW) to `typed`, unwrapped."""
        pointer = link_pointer(link)
        typed.connection = lib.pn_session_connection(lib.pn_link_session(pointer))
        self.typed[pointer] = typed
        self._routed.setdefault(typed.connection, set()).add(pointer)

    def unroute(self, link: Any) -> None:
        self._forget_route(link_pointer(link))

    def _forget_route(self, pointer: Any) -> None:
        typed = self.typed.pop(pointer, None)
        if typed is not None:
            links = self._routed.get(typed.connection)
            if links is not None:
                links.discard(pointer)
                if not links:
                    del self._routed[typed.connection]

    def _dispatch(self, event: Any, handler: Any, kind: int) -> None:
        if kind == _FLOW:  # (a routed link's PN_DELIVERY never comes here: `Engine.process` hands it on)
            typed = self.typed.get(lib.pn_event_link(event)) if self.typed else None
            if typed is not None:
                try:
                    if typed.credit is not None:
                        typed.credit()
                except Exception:  # noqa: BLE001 - as the daemon's boundaries do: log, fail the link
                    log.exception("handling a flow failed")
                    if typed.failed is not None:
                        typed.failed()
                return
        elif kind == lib.PN_LINK_FINAL:
            if self.typed:
                self._forget_route(lib.pn_event_link(event))
        elif kind == lib.PN_TRANSPORT_CLOSED and (self.typed or self._refused):
            self._bridge(kind, event, handler)
            self._unroute_connection(lib.pn_event_connection(event))
            return
        self._bridge(kind, event, handler)

    def _unroute_connection(self, connection: Any) -> None:
        """The engine frees every link of `connection` next: forget their routes first."""
        for pointer in self._routed.pop(connection, ()):
            self.typed.pop(pointer, None)
        if self._refused:
            for pointer in [p for p, c in self._refused.items() if c == connection]:
                del self._refused[pointer]

    def _bridge(self, kind: int, event: Any, handler: Any) -> None:
        if self._refused:
            pointer = lib.pn_event_link(event)
            if pointer != NULL and pointer in self._refused:
                if kind == lib.PN_LINK_FINAL:
                    del self._refused[pointer]
                return  # a link refused here is none of the handler's business
        if kind not in HANDED_ON:
            return
        if kind == lib.PN_LINK_REMOTE_OPEN and self._refuse_unreadable_filter(lib.pn_event_link(event)):
            return
        from proton import Event

        wrapped = Event.wrap(event)
        if wrapped is None:
            return
        if kind == lib.PN_CONNECTION_REMOTE_OPEN:
            connection = self.loop.connections.get(lib.pn_event_connection(event))
            if connection is not None and connection.identity is not None:
                setattr(wrapped.connection, IDENTITY_ATTRIBUTE, connection.identity)
        try:
            wrapped.dispatch(handler)
        except Exception:  # noqa: BLE001 - as the daemon's boundaries do: log, keep the loop
            log.exception("handling %s failed", wrapped.type)

    def _refuse_unreadable_filter(self, pointer: Any) -> bool:
        """A receiving link whose source filter proton could not decode (a map whose size and count
        disagree) would reach proton's wrappers as no filter at all, and its consumer would get
        every message: refuse it here with amqp:decode-error, as the wire contract refuses (an
        attach with a null source, then a detach with closed=true)."""
        if not lib.pn_link_is_sender(pointer):
            return False
        _, error = read_data(lib.pn_terminus_filter(lib.pn_link_remote_source(pointer)))
        if error is None:
            return False
        self._refused[pointer] = lib.pn_session_connection(lib.pn_link_session(pointer))
        lib.pn_terminus_set_type(lib.pn_link_source(pointer), lib.PN_UNSPECIFIED)
        lib.pn_link_open(pointer)
        condition = lib.pn_link_condition(pointer)
        lib.pn_condition_set_name(condition, b"amqp:decode-error")
        lib.pn_condition_set_description(condition, f"the source filter cannot be read: {error}".encode())
        lib.pn_link_close(pointer)
        log.info("refused a link with an unreadable source filter", extra={"fields": {"reason": error}})
        return True

    # running ---------------------------------------------------------------------------------------

    def run(self) -> None:
        loop = self.loop
        try:
            loop.run()
            self._proton.clear()  # stopped: as with the Container, handlers hear nothing more
            self.typed.clear()
            self._routed.clear()
            for _ in range(20):  # but the close frames of what was closed on the way out leave
                if not any(channel.conn.ptr is not None for channel in loop.channels):
                    break
                loop.run_once(0.05)
        finally:
            loop.close()

    def _quiesced(self) -> None:
        for handler in self.handler.handlers:
            quiesced = getattr(handler, "on_reactor_quiesced", None)
            if quiesced is not None:
                quiesced(_QUIESCED)

    def stop(self) -> None:
        self.loop.stop()


class UpstreamLogin:
    """The pass-through check on the loop itself: do a client's PLAIN `user` / `password` open an AMQP
    connection to the upstream?  URLs are tried in order (failover): True on the first that opens,
    False as soon as one refuses the credentials (`amqp:unauthorized-access`) or when none answers
    within `timeout`.  No thread and no blocking wait: the attempt is one more client connection of
    the loop."""

    on_loop = True  # `EventLoop` calls it on its thread as check(user, password, done)

    def __init__(self, container: EngineContainer, urls: tuple[str, ...] | list[str], *, timeout: float = 10.0):
        from urllib.parse import urlsplit

        self._container = container
        self._timeout = timeout
        self._targets = []
        for url in urls:
            parts = urlsplit(url)
            secure = parts.scheme == "amqps"
            self._targets.append((parts.hostname or "127.0.0.1", parts.port or (5671 if secure else 5672), secure))

    def __call__(self, user: str, password: str, done: Callable[[bool], None]) -> None:
        self._attempt(0, user, password, done)

    def _attempt(self, index: int, user: str, password: str, done: Callable[[bool], None]) -> None:
        if index >= len(self._targets):
            done(False)
            return
        host, port, secure = self._targets[index]
        loop = self._container.loop
        attempt = _LoginAttempt(done, lambda: self._attempt(index + 1, user, password, done), f"{host}:{port}")
        try:
            connection = loop.connect(host, port, attempt, sasl=SaslClient("PLAIN", user, password),
                                      tls=self._container.client_tls if secure else None,
                                      name=f"login {host}:{port}")
        except OSError as e:  # the name does not resolve
            attempt.on_disconnected(None, Condition("amqp:connection:forced", str(e)))
            return
        connection.open(hostname=host)
        attempt.timer = loop.call_later(self._timeout, lambda: loop.abort(
            connection, Condition("amqp:connection:forced", f"no answer within {self._timeout:g} s")))


class _LoginAttempt(Handler):
    """One pass-through login attempt: decided at the upstream's open (True) or its refusal."""

    def __init__(self, decide: Callable[[bool], None], next_url: Callable[[], None], where: str):
        self.decide = decide
        self.next_url = next_url
        self.where = where
        self.decided = False
        self.timer: Any = None

    def on_connection_open(self, connection: Connection) -> None:
        if not self.decided:
            self.decided = True
            self.decide(True)
        connection.close()

    def on_disconnected(self, connection: Connection | None, error: Condition | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.decided:
            return
        self.decided = True
        if error is not None and error.name == "amqp:unauthorized-access":
            self.decide(False)
            return
        log.warning("pass-through check: upstream %s failed: %s", self.where,
                    error.description or error.name if error is not None else "closed")
        self.next_url()


def _symbol_keys(properties: dict | None) -> dict | None:
    if not properties:
        return None
    return {t.symbol(str(k)): v for k, v in properties.items()}


class EngineListening:
    """`listener.Listening` for the engine: `port`, `stop_accepting()`, `close()`."""

    front_end = True

    def __init__(self, listener: Any):
        self._listener = listener
        self.port = listener.port

    def stop_accepting(self) -> None:
        self._listener.close()

    def close(self) -> None:
        self._listener.close()


def listen(container: EngineContainer, listener: Any, handler: Any, *, passthrough: Verify | None = None,
           max_connections: int = 0, handshake_timeout: float = 10.0,
           on_refused: Callable[[str, str], None] | None = None) -> EngineListening:
    """`listener.listen` on the engine: `[listener]` SASL (PLAIN users, pass-through, EXTERNAL, the
    anonymous policy) and TLS, client connections dispatched to the proton `handler`; a connection
    that has not opened AMQP `handshake_timeout` seconds after accept is closed and counted."""
    verify: Verify | None = passthrough
    if verify is None and listener.users:
        verify = UserDatabase(listener.users).authenticate
    sasl = ServerSasl(tuple(listener.effective_mechanisms), verify=verify, allow_skip=listener.anonymous_allowed,
                      keep_password=passthrough is not None)
    tls = server_ssl_context(listener.tls) if listener.tls.enabled else None

    class Accepting(_Bridge):
        def on_accepted(self, connection: Connection) -> None:
            container.adopt(connection, handler)

    engine_listener = container.loop.listen(listener.host, listener.port, Accepting(), sasl=sasl, tls=tls,
                                            limits=Limits(max_connections=max_connections,
                                                          handshake_timeout=handshake_timeout),
                                            on_refused=on_refused)
    return EngineListening(engine_listener)
