"""The daemon's connections on the engine loop (`broker-filter serve`): what the proxy's handlers
need of a "container" beside the engine's own objects.

Theory of operation.  Every connection of the daemon is the engine's (`endpoints.Connection`) and
its events go to an engine `Handler`: the client listener's `ProxyServer` (through the connection
registry and, with pass-through credentials, `PassThrough`), each upstream's `RemoteUpstream`.
The loop owns the sockets (epoll, no descriptor ceiling), TLS, the listener's SASL exchange,
heartbeats and the limits.  `EngineContainer` adds `connect()` (a client connection from an
amqp[s]:// URL), `abort()`, timers and the run loop.
Timers, signals and deferred work are the engine loop's own (`container.loop`: `call_later`,
`call_soon_threadsafe`, and `proxy.loop.EngineLoop` for `call_soon` at the end of a turn).

The per-message events need no connection handler method at all: a link whose `Link.handler` is an
`endpoints.LinkHandler` (each client link's object of the proxy: `proxy.links`) gets its deliveries
as `handler.transfer(delivery pointer)` straight from the engine's `process`, with no object built
(one dict lookup by link pointer, `Engine.link_handlers`, dropped when the engine forgets the link).

    container = EngineContainer(container_id, client_tls=client_ssl_context(config.upstream.tls))
    listening = listen(container, config.listener, handler, max_connections=...)
    container.run()
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from ..amqp import types as t
from ..security import CertificateUsers, UserDatabase, harden, server_ssl_context
from .endpoints import Condition, Connection, Handler, SaslClient
from .logins import LoginPolicy
from .loop import EventLoop, Limits
from .streams import ServerSasl, Verify

log = logging.getLogger("broker_filter.engine")


def client_ssl_context(tls: Any) -> ssl.SSLContext:
    """An `ssl.SSLContext` for amqps:// upstreams from `[upstream.tls]` (verify: peer-name, peer, none;
    `min_version` and `ciphers`, Mozilla's intermediate profile unless set otherwise, as on the
    listener: `security.harden`)."""
    context = ssl.create_default_context(cafile=tls.ca_file or None)
    harden(context, tls)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file or None, password=tls.key_password or None)
    if tls.verify == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif tls.verify == "peer":
        context.check_hostname = False
    return context


class EngineContainer:
    """The daemon's connections on an `EventLoop` (see the module docstring)."""

    def __init__(self, container_id: str | None = None, *, client_tls: ssl.SSLContext | None = None):
        self.loop = EventLoop(container_id=container_id)
        self.client_tls = client_tls

    @property
    def container_id(self) -> str:
        return self.loop.container_id

    @container_id.setter
    def container_id(self, value: str) -> None:
        self.loop.container_id = value

    # connections -------------------------------------------------------------------------------

    def connect(self, url: str, handler: Handler, *, properties: dict | None = None, heartbeat: float | None = None,
                user: str | None = None, password: str | None = None, allowed_mechs: str | None = None,
                virtual_host: str | None = None, tls: ssl.SSLContext | None = None,
                server_hostname: str | None = None, **ignored: Any) -> Connection:
        """A client connection to an amqp[s]://host:port URL, opened (the caller reconnects; a
        failure reaches `handler.on_disconnected`).  Without `user`, the URL's; without either,
        SASL `allowed_mechs` (ANONYMOUS by default).  amqps: `tls` if given (the replicas' own
        context), else the container's; the certificate must name `server_hostname` (default: the
        URL's host)."""
        parts = urlsplit(url)
        user = user if user is not None else (unquote(parts.username) if parts.username else None)
        password = password if password is not None else (unquote(parts.password) if parts.password else None)
        secure = parts.scheme == "amqps"
        tls = tls or self.client_tls
        if secure and tls is None:
            raise ValueError(f"{url}: amqps needs [upstream.tls] for the engine's TLS")
        if user is not None:
            sasl = SaslClient("PLAIN", user, password or "")
        else:
            sasl = SaslClient(allowed_mechs or "ANONYMOUS")
        host = parts.hostname or "127.0.0.1"
        port = int(parts.port or (5671 if secure else 5672))
        connection = self.loop.connect(host, port, handler, sasl=sasl, tls=tls if secure else None,
                                       server_hostname=server_hostname, idle_timeout=heartbeat or 0.0)
        connection.open(hostname=virtual_host or host, properties=_symbol_keys(properties))
        return connection

    def abort(self, connection: Connection, condition: str, description: str) -> bool:
        """Drop a connection's transport without a close frame (as a peer whose socket closes), the
        reason logged and kept as its error.  False if it is gone."""
        if connection.ptr is None:
            return False
        self.loop.abort(connection, Condition(condition, description))
        return True

    def adopt(self, connection: Connection, handler: Handler) -> None:
        """Dispatch a connection's events (one made outside `connect`, e.g. in memory) to `handler`."""
        connection.handler = handler

    # running ---------------------------------------------------------------------------------------

    def run(self) -> None:
        loop = self.loop
        try:
            loop.run()
            loop.link_handlers.clear()  # stopped: link handlers hear nothing more
            for _ in range(20):  # but the close frames of what was closed on the way out leave
                if not any(channel.conn.ptr is not None for channel in loop.channels):
                    break
                loop.run_once(0.05)
        finally:
            loop.close()

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
    """`listener.Listening` for the engine: `port`, `stop_accepting()`, `close()`; `logins` the
    listener's login gate."""

    front_end = True

    def __init__(self, listener: Any, users: Any = None):
        self._listener = listener
        self.port = listener.port
        self.logins = listener.logins
        self.users = users  # the PLAIN user database (`security.UserDatabase`), None without one

    def stop_accepting(self) -> None:
        self._listener.close()

    def close(self) -> None:
        self._listener.close()


def listen(container: EngineContainer, listener: Any, handler: Any, *, passthrough: Verify | None = None,
           max_connections: int = 0, handshake_timeout: float = 10.0,
           on_refused: Callable[[str, str], None] | None = None, keep_first_input: int = 0,
           on_login_failure: Callable[[str], None] | None = None, known_users: Any = ()) -> EngineListening:
    """`listener.listen` on the engine: `[listener]` SASL (PLAIN users, pass-through, EXTERNAL with
    `listener.certificate_users`, the anonymous policy), `[listener.login]` (the PLAIN checks' throttle
    and queue) and TLS, client connections dispatched to the engine `handler`; a connection that has
    not opened AMQP `handshake_timeout` seconds after accept is closed and counted.
    `on_login_failure(reason)` counts failed, refused and abandoned logins.  `known_users`: users
    configured elsewhere (`[security.roles]`) whom an EXTERNAL certificate's CN may name too."""
    verify: Verify | None = passthrough
    remembered = None
    users = None
    if verify is None and listener.users:
        users = UserDatabase(listener.users)
        verify, remembered = users.authenticate, users.remembered
    certificates = CertificateUsers(getattr(listener, "certificate_users", None) or {},
                                    set(listener.users) | set(known_users))
    sasl = ServerSasl(tuple(listener.effective_mechanisms), verify=verify, allow_skip=listener.anonymous_allowed,
                      keep_password=passthrough is not None, remembered=remembered,
                      certificate_users=certificates, logins=LoginPolicy.of(getattr(listener, "login", None)))
    tls = server_ssl_context(listener.tls) if listener.tls.enabled else None

    engine_listener = container.loop.listen(listener.host, listener.port, handler, sasl=sasl, tls=tls,
                                            limits=Limits(max_connections=max_connections,
                                                          handshake_timeout=handshake_timeout,
                                                          keep_first_input=keep_first_input),
                                            on_refused=on_refused, on_login_failure=on_login_failure)
    return EngineListening(engine_listener, users)
