"""Pass-through credentials: each client identity gets its own upstream connection.

Theory of operation.  With `upstream.credentials = "pass-through"` the listener checks a client's
PLAIN credentials against the upstream broker (`engine.container.UpstreamLogin`) before the client is in,
and keeps them in the connection's `Identity`.  `PassThrough` is the handler client connections
are served by.  It routes every event of a client connection to the proxy server of that client's
identity, creating it -- a `ProxyServer` with its own upstream connection logged in with the
client's user and password -- at the identity's first connection.  Until that upstream connection is
up, the client connection's events wait in order (the client's open is answered only then), so a
client never sees "upstream not connected" for its own fresh login; if the upstream refuses, the
client connection is closed with the upstream's error.  An identity's server and upstream connection
stop `idle` seconds after its last client connection ended.

A tenant is one identity in one vhost: a client whose open frame names a vhost (`vhost:NAME`, as
RabbitMQ's clients send it) is served by an upstream connection that opens that vhost, with its own
credentials, so RabbitMQ decides (a vhost that does not exist, or that the user may not use, closes
the client's connection with RabbitMQ's own error); a client that names none gets the upstream URL's.

A client that gave no password (ANONYMOUS, EXTERNAL with a certificate, or no SASL at all) has no
credentials of its own to open an upstream connection with, and is never served with the daemon's
own account (`upstream.user`, the URL's login): its connection is answered with an open and a close
with `amqp:unauthorized-access` saying why, logged and counted (`no-upstream-account`).  The
default server, with the configured credentials, serves only the daemon's own needs (`/readyz`).

So the broker's own permissions apply to everything a client does through the proxy; the proxy
grants nobody more than the broker would.  Clients with the same credentials share one upstream
connection and its queue feeds.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..engine.endpoints import LOCAL_CLOSED, LOCAL_UNINIT, Condition, Connection, Delivery, Handler
from ..security import identity_of
from . import reports
from .upstream import UpstreamListener
from .routing import vhost_asked

log = logging.getLogger("broker_filter.passthrough")


def _connection_of(subject: Any) -> Connection:
    if isinstance(subject, Connection):
        return subject
    if isinstance(subject, Delivery):
        return subject.link.connection
    return subject.connection


@dataclass(frozen=True)
class _Refusal:
    condition: str
    description: str
    aborted: bool = False  # (as `upstream.ErrorInfo`, the other reason a tenant goes down)


@dataclass
class _Tenant:
    """One identity's server, its upstream, and the client connections it serves."""

    key: tuple[str, str, str | None]
    user: str
    server: Any
    upstream: Any
    up: bool = False
    failed: Any = None  # the upstream's ErrorInfo when it refused before ever coming up
    connections: set = field(default_factory=set)
    waiting: list = field(default_factory=list)  # (method, subject, rest) held until the upstream is up
    idle_timer: Any = None


class _UpstreamTap(UpstreamListener):
    """The upstream listener of a tenant's server, telling PassThrough when the upstream is up."""

    def __init__(self, owner: PassThrough, tenant: _Tenant):
        self._owner = owner
        self._tenant = tenant

    def on_upstream_up(self, upstream: Any) -> None:
        self._tenant.server.on_upstream_up(upstream)
        self._owner._up(self._tenant)

    def on_upstream_down(self, upstream: Any, error: Any) -> None:
        self._tenant.server.on_upstream_down(upstream, error)
        self._owner._down(self._tenant, error)

    def on_upstream_failed(self, upstream: Any, error: Any) -> None:
        """An attempt that never opened: a tenant never up gives up at once (its clients get the
        upstream's reason now, not after the connect timeout)."""
        self._owner._down(self._tenant, error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tenant.server, name)


class PassThrough(Handler):
    """Routes client connection events to per-identity proxy servers (see the module docstring).

    make_server(user, password, n, vhost) -> (server, upstream): a ProxyServer and its not yet
    started upstream for those credentials and that vhost (None: the upstream URL's) (`n` numbers the
    tenants, for a distinct instance name).
    start_upstream(upstream, listener): start it on the loop.  call_later(delay, fn): the loop's timer.
    """

    def __init__(
        self,
        default: Any,
        make_server: Callable[[str, str, int, str | None], tuple[Any, Any]],
        start_upstream: Callable[[Any, Any], None],
        call_later: Callable[[float, Callable[[], None]], Any],
        *,
        idle: float = 30.0,
        connect_timeout: float = 10.0,
        abort: Callable[[Any, str, str], bool] | None = None,
        on_login_failure: Callable[[str], None] | None = None,
    ):
        self.default = default
        self._on_login_failure = on_login_failure
        self._make_server = make_server
        self._start_upstream = start_upstream
        self._call_later = call_later
        self._idle = idle
        self._connect_timeout = connect_timeout
        # abort(connection, condition, description): drop a client connection without a close frame
        self._abort = abort
        self._tenants: dict[tuple[str, str, str | None], _Tenant] = {}
        self._numbers = itertools.count(1)
        self._stopped = False
        self._quiesced = False
        self._closing: list = []  # upstreams stopped by `stop`, until their close is answered
        self._by_connection: dict[Connection, _Tenant] = {}  # a client connection -> its tenant
        self._refused: set[Connection] = set()  # closed for want of a password: their events go nowhere

    # every event of a client connection

    def _route(self, method: str, subject: Any, *rest: Any) -> None:
        connection = _connection_of(subject)
        tenant = self._by_connection.get(connection)
        if tenant is None and connection in self._refused:
            return  # (a session or link pipelined behind the refused open: nobody serves it)
        if tenant is None:
            getattr(self.default, method)(subject, *rest)
        elif not tenant.up:
            tenant.waiting.append((method, subject, rest))
        else:
            getattr(tenant.server, method)(subject, *rest)

    def on_connection_close(self, connection: Connection) -> None:
        self._route("on_connection_close", connection)

    def on_session_open(self, session: Any) -> None:
        self._route("on_session_open", session)

    def on_session_close(self, session: Any) -> None:
        self._route("on_session_close", session)

    def on_link_open(self, link: Any) -> None:
        self._route("on_link_open", link)

    def on_link_close(self, link: Any) -> None:
        self._route("on_link_close", link)

    def on_flow(self, link: Any) -> None:
        self._route("on_flow", link)

    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        # (valid during this call only: a message waiting for its tenant keeps a copy)
        tenant = self._by_connection.get(delivery.link.connection)
        self._route("on_message", delivery, bytes(data) if tenant is not None and not tenant.up else data)

    def on_delivery_update(self, delivery: Delivery) -> None:
        self._route("on_delivery_update", delivery)

    def on_connection_open(self, connection: Connection) -> None:
        identity = identity_of(connection)
        if self._stopped:
            self.default.on_connection_open(connection)
            return
        if identity.password is None:
            self._refuse_passwordless(connection, identity)
            return
        vhost = vhost_asked(connection.remote_hostname)
        if vhost == getattr(getattr(self.default, "upstream", None), "vhost", None):
            vhost = None  # the upstream URL's own: one tenant whether it was named or not
        key = (identity.user or "", hashlib.sha256(identity.password.encode("utf-8", "surrogatepass")).hexdigest(),
               vhost)
        tenant = self._tenants.get(key)
        if tenant is None:
            tenant = self._open_tenant(key, identity.user or "", identity.password)
        if tenant.idle_timer is not None:
            tenant.idle_timer.cancel()
            tenant.idle_timer = None
        tenant.connections.add(connection)
        self._by_connection[connection] = tenant
        if tenant.up:
            tenant.server.on_connection_open(connection)
        else:
            tenant.waiting.append(("on_connection_open", connection, ()))

    def on_disconnected(self, connection: Connection, error: Any) -> None:
        if connection in self._refused:
            self._refused.discard(connection)
            return
        tenant = self._by_connection.pop(connection, None)
        if tenant is None:
            self.default.on_disconnected(connection, error)
            return
        if tenant.up:
            tenant.server.on_disconnected(connection, error)
        else:  # gone before its upstream came up: nothing of it is to be replayed
            tenant.waiting = [w for w in tenant.waiting if _connection_of(w[1]) is not connection]
        tenant.connections.discard(connection)
        if not tenant.connections and tenant.idle_timer is None and self._tenants.get(tenant.key) is tenant:
            tenant.idle_timer = self._call_later(self._idle, lambda: self._idle_out(tenant))

    def _refuse_passwordless(self, connection: Connection, identity: Any) -> None:
        how = f"SASL {identity.mechanism}" if identity.mechanism else "no SASL"
        description = (f"upstream.credentials = pass-through: a client that logged in with {how} gave no password "
                       "to open its own upstream connection with, and is not served with the proxy's own "
                       "account; log in with PLAIN")
        log.warning("pass-through: a client without a password refused", extra={"fields": {
            "peer": identity.peer, "mechanism": identity.mechanism or "none", "user": identity.user}})
        if self._on_login_failure is not None:
            self._on_login_failure("no-upstream-account")
        self._refused.add(connection)
        if connection.local_state == LOCAL_UNINIT:
            connection.open()
        connection.close(Condition("amqp:unauthorized-access", description))

    # tenants

    def _open_tenant(self, key: tuple[str, str, str | None], user: str, password: str) -> _Tenant:
        server, upstream = self._make_server(user, password, next(self._numbers), key[2])
        if self._quiesced:
            server.registry.quiesce()
        tenant = _Tenant(key, user, server, upstream)
        self._tenants[key] = tenant
        log.info("pass-through: opening an upstream connection",
                 extra={"fields": {"user": user, **({"vhost": key[2]} if key[2] is not None else {})}})
        self._start_upstream(upstream, _UpstreamTap(self, tenant))
        self._call_later(self._connect_timeout, lambda: self._give_up(tenant))
        return tenant

    def _give_up(self, tenant: _Tenant) -> None:
        if not tenant.up and self._tenants.get(tenant.key) is tenant:
            self._down(tenant, _Refusal("amqp:connection:forced",
                                        f"the upstream did not accept a connection within {self._connect_timeout:g} s"))

    def _up(self, tenant: _Tenant) -> None:
        tenant.up = True
        tenant.failed = None
        waiting, tenant.waiting = tenant.waiting, []
        for method, subject, rest in waiting:
            getattr(tenant.server, method)(subject, *rest)

    def _down(self, tenant: _Tenant, error: Any) -> None:
        if tenant.up:
            return  # the server detaches its links itself; the upstream reconnects
        # Never came up: the clients waiting for it cannot be served with these credentials.
        tenant.failed = error
        log.warning("pass-through: the upstream connection failed before it opened; its clients are refused: %s",
                    error.description,
                    extra={"fields": {"user": tenant.user, **({"vhost": tenant.key[2]} if tenant.key[2] is not None else {})}})
        condition = Condition(error.condition, error.description)  # (an `upstream.ErrorInfo` or a `_Refusal`)
        aborted = bool(error.aborted) and self._abort is not None
        for connection in list(tenant.connections):
            if aborted and self._abort(connection, condition.name, condition.description):
                # The broker refused the open by closing its socket (RabbitMQ 4: a vhost it does not
                # have): the client's connection goes the same way, as it would directly (RabbitMQ's
                # clients take a close frame for a connection to recover, and retry)
                continue
            state = connection.local_state
            if state != LOCAL_CLOSED:
                if state == LOCAL_UNINIT:
                    connection.open()
                connection.close(condition)
        tenant.waiting.clear()
        self._retire(tenant)

    def _idle_out(self, tenant: _Tenant) -> None:
        tenant.idle_timer = None
        if not tenant.connections:
            self._retire(tenant)

    def _retire(self, tenant: _Tenant) -> None:
        if self._tenants.get(tenant.key) is tenant:
            del self._tenants[tenant.key]
        if self._stopped:
            self._closing.append(tenant.upstream)
        if tenant.up:  # (one that never came up has declared nothing)
            try:
                # the queues its subscriptions' feeds declared go before its upstream connection closes
                tenant.server.registry.end_subscription_queues()
            except Exception:  # noqa: BLE001 - its upstream connection is stopped all the same
                log.exception("pass-through: deleting a tenant's subscription queues failed")
        try:
            tenant.upstream.stop()
        except Exception:  # noqa: BLE001 - stopping one tenant must not affect the others
            log.exception("pass-through: stopping an upstream connection failed")

    # the daemon as a whole

    @property
    def servers(self) -> list:
        return [self.default] + [t.server for t in self._tenants.values()]

    def quiesce(self) -> None:
        """Shutdown begins: every tenant's queue feeds stop starting moves, pulling and sending, as
        the default server's do (`FeedRegistry.quiesce`); tenants opened from now on too."""
        self._quiesced = True
        for tenant in list(self._tenants.values()):
            tenant.server.registry.quiesce()

    def moves_in_flight(self) -> int:
        """Moves to a queue's tail not yet confirmed, over every tenant (the shutdown waits for them)."""
        return sum(t.server.registry.moves_in_flight() for t in list(self._tenants.values()))

    def closing(self) -> bool:
        """A tenant upstream stopped by `stop` still closes: its last outcomes (a move's accepted
        original) are on their way to the broker."""
        self._closing = [u for u in self._closing if u.closing()]
        return bool(self._closing)

    def stop(self) -> None:
        """Stop every tenant's upstream connection (the default upstream is the app's to stop)."""
        self._stopped = True
        for tenant in list(self._tenants.values()):
            if tenant.idle_timer is not None:
                tenant.idle_timer.cancel()
            self._retire(tenant)

    def snapshot(self) -> dict:
        """The default server's snapshot, with every tenant's connections, links, credit and feeds added."""
        total = reports.snapshot(self.default)
        links = dict(total.get("links", {}))
        credit = dict(total.get("credit", {}))
        feeds = list(total.get("feeds", []))
        connections = total.get("connections", 0)
        for tenant in list(self._tenants.values()):
            snap = reports.snapshot(tenant.server)
            connections += snap.get("connections", 0)
            feeds += snap.get("feeds", [])
            for kind, n in snap.get("links", {}).items():
                links[kind] = links.get(kind, 0) + n
            for address, n in snap.get("credit", {}).items():
                credit[address] = credit.get(address, 0) + n
        total.update(connections=connections, links=links, credit=credit, feeds=feeds,
                     held=sum(f["held"] for f in feeds), starved=sum(f["starved"] for f in feeds))
        return total
