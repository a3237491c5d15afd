"""The client-facing side of the proxy: the engine handler of accepted client connections.

Theory of operation
-------------------
`ProxyServer` admits connections (limits, per-user and per-address quotas, the vhost asked for,
replicas recognised by their login), dispatches each link's attach to the side that serves it —
`receiver.Receivers` for receiving links, `sender` for sending links, `management` for RabbitMQ 4's
`/management` pair — each deciding the attach with `plan` first, and keeps every `on_*` callback
inside an error boundary: a failure closes the link (or, outside any link, the connection) with
`amqp:internal-error` and is logged; nothing else is affected.  A link it serves becomes one object
(`links`: `ReceiverLink`, `SenderLink`, `Relay`, `ServedLink`), the link's `Link.handler`: its
transfers, flow and detach go there; the server keeps the events of connections, sessions, attaches
and the links it does not serve, and drops a link's state when it goes (`_drop_link`).  Refusals
follow the wire contract (`refusal`): an attach reply with a null source (or target), then a detach
with closed=true and the error.

What it owns besides: the feeds (`feeds.FeedRegistry`), JMS durable subscriptions it keeps
(`durable`), queue links moving with their owner (`rehoming`), links waiting for a lost upstream
connection (`resume`), and the permissions outside a plan (`grants.Guard`).  docs/proxy.md, "How the
proxy is built", follows one attach and one message through these files.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from typing import Any, Callable

from ..amqp import types as t
from ..config import Config
from ..engine._cproton import lib
from ..engine.endpoints import LOCAL_CLOSED, LOCAL_UNINIT, Condition, Connection, Delivery, Handler, Link, Session
from ..engine.splice import splice_target
from ..security import SaslClientExchange, identity_of
from . import introspect, plan, sender
from .durable import DurableSubscriptions
from .feeds import FeedRegistry
from .grants import Granted, Guard
from .links import ClientLinkObject, ServedLink
from .management import ManagementPair, is_management, refusal
from .receiver import FILTER_CAPABILITIES, Receivers
from .records import ClientConnection, connection_state, link_state, links_of
from .quotas import Quotas, Unfinished
from .refusal import close_link, refuse_link
from .rehoming import Rehoming
from .resume import Resumption
from .replicas import PROPERTY as REPLICA_PROPERTY
from .routing import Routing, vhost_asked
from .sender import RELAY_CAPABILITY
from .upstream import ErrorInfo, Upstream, UpstreamListener

log = logging.getLogger("broker_filter.proxy")

_OFFERED = FILTER_CAPABILITIES + (RELAY_CAPABILITY,)  # (a null target: the anonymous relay, `sender.Relay`)
_COORDINATOR = lib.PN_COORDINATOR  # a transaction coordinator target


def boundary(fn: Callable) -> Callable:
    """Error boundary for an engine callback: log, then fail only the link or connection concerned."""

    @functools.wraps(fn)
    def wrapper(self, subject, *rest):
        try:
            fn(self, subject, *rest)
        except Exception:
            log.exception("%s failed", fn.__name__)
            self._fail(subject)

    return wrapper


class ProxyServer(Handler, UpstreamListener):
    """Handler for every client connection accepted by the proxy's listener."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        instance: str,
        dialect: str = "jms",
        window: int = 100,
        max_credit: int = 1000,
        recycle: bool = True,
        config: Any = None,
        metrics: Any = None,
    ):
        super().__init__()
        self.metrics = metrics  # broker_filter.metrics.Metrics, or None
        # broker_filter.config.Config: address rules, virtual addresses, limits (its defaults when None)
        self.config = config = config if config is not None else Config()
        self.routing = Routing.from_config(config)
        self.upstream = upstream
        self.instance = instance
        self.dialect = dialect
        self.window = window
        self.max_credit = max_credit
        self.recycle = recycle
        self.registry = FeedRegistry(self)  # every feed: an upstream consumer and the links it serves
        self.receivers = Receivers(self)  # the client's receiving links: attach, placement, outcomes, credit
        self.durable = DurableSubscriptions(self)  # JMS durable subscriptions the daemon keeps
        self.rehoming = Rehoming(self)  # queue links served through their queue's owner (`[replicas]`)
        self.resumption = Resumption(self)  # links waiting for a lost upstream connection to come back
        self.guard = Guard(self)  # the permissions outside an attach's plan: audit, /management, SIGHUP
        self.feeds = self.registry.feeds  # (the same dict, for the reports)
        self.connections: dict[str, ClientConnection] = {}
        self.quotas = Quotas(config.limits)  # connections and links per user and source address
        self._conn_ids = itertools.count(1)
        self._tags = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._feed_ids = itertools.count(1)
        # how long a feed whose last link went waits for its moves in flight
        self.grace = float(config.shutdown.grace_period)
        self.stopping = False
        self.refused = 0
        self.upstream_up = False
        self._was_up = False
        self.filter_totals = introspect.FilterTotals()  # the filter counts of links that are gone
        self.max_message_size = config.limits.max_message_size or 0  # (0: unlimited)
        self.replicas: Any = None  # proxy.replicas.Replicas when `[replicas]` is configured
        self.permissions: plan.Permissions = Granted.of(config, upstream)  # who may do what (`[security]`)

    def next_tag(self) -> bytes:
        return b"%x" % next(self._tags)

    def feed_token(self) -> str:
        """Names a feed in the marks on the copies it moves: unique among daemons on one broker."""
        return f"{self.instance}/{next(self._feed_ids)}"

    # ---------------------------------------------------------------- stopping

    # ---------------------------------------------------------------- upstream listener
    def on_upstream_up(self, upstream) -> None:
        if self.metrics is not None and self._was_up:
            self.metrics.upstream_reconnected(upstream.lost_cause)
        if not self._was_up:
            self.upstream.loop.call_later(1.0, self.registry.tick)
        self._was_up = True
        self.upstream_up = True
        self.registry.forget_recyclers()
        self.resumption.upstream_up()

    def on_upstream_down(self, upstream, error: ErrorInfo) -> None:
        self.upstream_up = False
        self.registry.forget_recyclers()
        if self.replicas is not None:
            # A replica without its upstream owns nothing: the others see it gone and take over.
            for c in list(self.connections.values()):
                if c.peer is not None and c.connection is not None:
                    c.connection.close(Condition("amqp:connection:forced",
                                                 f"upstream {self.upstream.name} is not connected"))
        for b in list(self.registry.feeds.values()):
            if b.via is not None:  # a feed consuming through a queue's owner does not use this upstream
                continue
            if self.resumption.resumable(b):
                self.resumption.suspend_feed(b)
            else:
                self.registry.fail_feed(b, error)

    # ---------------------------------------------------------------- connections
    @boundary
    def on_connection_open(self, conn: Connection) -> None:
        limits = self.config.limits
        if len(self.connections) >= limits.connections:
            conn.open()
            conn.close(Condition("amqp:resource-limit-exceeded",
                                 f"the proxy accepts at most {limits.connections} connections"))
            if self.metrics is not None:
                self.metrics.refuse_connection("limit")
            return
        asked = vhost_asked(conn.remote_hostname)
        served = self.upstream.vhost
        if asked is not None and served is not None and asked != served:
            # Never another vhost than the one asked for (RabbitMQ's clients name it in the hostname)
            conn.open()
            conn.close(Condition("amqp:not-found",
                                 f"vhost {asked!r} is not served here: this daemon serves vhost {served!r} "
                                 f"of {self.upstream.name}"))
            log.info("refused a connection asking for vhost %r (serving %r)", asked, served)
            if self.metrics is not None:
                self.metrics.refuse_connection("vhost")
            return
        peer = None
        identity = identity_of(conn)
        if self.replicas is not None:
            props = conn.remote_properties
            claimed = props.get(REPLICA_PROPERTY) if isinstance(props, dict) else None
            # A replica is recognised by its login (`replicas.user`; ANONYMOUS on a loopback-only
            # deployment without one), never by the property alone, which any client can send.
            peer = claimed if claimed is not None and self._replica_login(identity) else None
            if peer is not None and not self.upstream_up:
                # not a live replica while its upstream is down: the peer asks again a second later
                conn.open()
                conn.close(Condition("amqp:connection:forced", f"upstream {self.upstream.name} is not connected"))
                return
        why = self.quotas.refusal(identity) if peer is None else None
        if why is not None:
            conn.open()
            conn.close(Condition("amqp:resource-limit-exceeded", why))
            log.warning("refused a connection from %s: %s", identity.peer or "?", why)
            if self.metrics is not None:
                self.metrics.refuse_connection("limit")
            return
        if self.metrics is not None:
            self.metrics.connections_accepted.inc()
        cid = f"{self.instance}/{next(self._conn_ids)}"
        state = conn.context = ClientConnection(cid, conn, identity)
        state.unfinished = Unfinished(self.config.limits.unfinished_bytes)
        if peer is None:
            self.quotas.admitted(state)
        state.peer = str(peer) if peer is not None else None
        if peer is not None:
            # the peer's link to this replica ends after the same silence as this one's to the peer:
            # what this replica delivered on it and was not settled goes back (custody), not held
            # for a replica cut off
            conn.set_idle_timeout(self.replicas.heartbeat)
        elif self.config.limits.idle_timeout:
            # announced in the open frame: a client that sends nothing, not even a heartbeat, for
            # this long has its connection closed, and its place freed
            conn.set_idle_timeout(self.config.limits.idle_timeout)
        self.connections[cid] = state
        conn.open(container_id=self.instance, properties=_identity(self.upstream), offered_capabilities=_OFFERED)

    @boundary
    def on_session_open(self, session: Session) -> None:
        if session.local_state == LOCAL_UNINIT:
            session.open()

    @boundary
    def on_session_close(self, ssn: Session) -> None:
        for link in list(ssn.links):
            self._drop_link(link)
        if ssn.local_state != LOCAL_CLOSED:
            ssn.close()  # ended on both sides: the engine frees it (a long-lived connection keeps no dead sessions)

    @boundary
    def on_connection_close(self, conn: Connection) -> None:
        self._drop_connection(conn)
        if conn.local_state != LOCAL_CLOSED:
            conn.close()

    @boundary
    def on_disconnected(self, conn: Connection, error: Condition | None) -> None:
        self._drop_connection(conn)

    def _drop_connection(self, conn: Connection) -> None:
        c = connection_state(conn)
        if c is None or c.closed:
            return
        c.closed = True
        for link in links_of(conn):
            self._drop_link(link)
        self.connections.pop(c.id, None)
        self.quotas.gone(c)

    # ---------------------------------------------------------------- links
    @boundary
    def on_link_open(self, link: Link) -> None:
        if link.local_state != LOCAL_UNINIT:
            return
        conn = connection_state(link.connection)
        if conn is None:
            self._refuse(link, "amqp:resource-limit-exceeded", "connection not accepted")
            return
        limits = self.config.limits
        if len(conn.links) >= limits.links_per_connection:
            self._refuse(link, "amqp:resource-limit-exceeded",
                         f"at most {limits.links_per_connection} links per connection")
            return
        why = self.quotas.link_refusal(conn) if conn.peer is None else None
        if why is not None:
            self._refuse(link, "amqp:resource-limit-exceeded", why)
            return
        if link.is_sender and link.remote_source.filter_error is not None:
            # A source filter proton could not decode (a map whose size and count disagree) must not
            # read as no filter at all, which would give the consumer every message: refused as
            # the wire contract refuses.
            self._refuse(link, "amqp:decode-error",
                         f"the source filter cannot be read: {link.remote_source.filter_error}")
            return
        if is_management(link):
            why = refusal(self.upstream)
            if why is not None:
                self._refuse(link, "amqp:not-implemented", why)
                return
            conn.links.add(link)
            ManagementPair.serve(self.upstream, link, lambda client, serve: ServedLink(self, client, conn, serve),
                                 self.guard.manage_check(conn))
            return
        if link.is_sender:
            self.receivers.attach(link, conn)
        else:
            self._attach_inlet(link, conn)

    @boundary
    def on_link_close(self, link: Link) -> None:
        # A detach without close (JMS consumer.close() on a durable subscription): it stays upstream.
        self._link_gone(link, closed=link.remote_closed)

    def _link_gone(self, link: Link, closed: bool) -> None:
        self._drop_link(link, closed=closed)
        state = link.local_state
        if state != LOCAL_CLOSED:
            if state == LOCAL_UNINIT:
                link.open()
            if closed:
                link.close()  # closed on both ends: the engine frees it
            else:
                link.detach()
        if not closed:
            # Detached on both ends: free it, so that a new attach under the same name gets a new
            # link (proton would otherwise hand the old, detached one back).
            link.free()

    def on_flow(self, link: Link) -> None:
        """(A link the proxy serves has its flow go to its object, `links`; this one it does not serve
        yet, or at all: its credit is taken when it is served.)"""

    @boundary
    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        # (a link the proxy serves has its transfers go to its object, `links`, straight from the
        # engine; this is a link it keeps nothing on, e.g. one refused)
        delivery.release()

    @boundary
    def on_delivery_update(self, delivery: Delivery) -> None:
        delivery.settle()

    def _fail(self, subject: Any) -> None:
        """After an unexpected exception: close the link concerned, else the connection."""
        try:
            link = subject.link if isinstance(subject, Delivery) else subject if isinstance(subject, Link) else None
            if link is not None:
                self._drop_link(link)
                close_link(link, "amqp:internal-error", "proxy failure on this link; see the proxy log")
                return
            conn = subject if isinstance(subject, Connection) else subject.connection if isinstance(subject, Session) else None
            if conn is not None:
                self._drop_connection(conn)
                if conn.local_state != LOCAL_CLOSED:
                    conn.close(Condition("amqp:internal-error", "proxy failure; see the proxy log"))
        except Exception:
            log.exception("failure handling a failure")

    def _refuse_planned(self, link, conn: ClientConnection, refusal: plan.Refuse) -> None:
        if refusal.condition == "amqp:unauthorized-access":
            self.guard.audit(conn, refusal.operation, refusal.address, refusal.description)
        self._refuse(link, refusal.condition, refusal.description, refusal.info, reason=refusal.reason)

    def _refuse(self, link, condition: str, description: str, info: dict | None = None, *,
                reason: str | None = None, level: int = logging.INFO) -> None:
        """Refuse `link`'s attach, counted under `reason` (by default the condition's)."""
        self.refused += 1
        if self.metrics is not None:
            self.metrics.refuse_attach(reason or _REFUSAL_REASONS.get(condition, "other"))
        refuse_link(link, condition, description, info)
        log.log(level, "refused link %r: %s: %s", link.name, condition, description)

    # ---------------------------------------------------------------- receiving (outlets)
    def plan_context(self, conn: ClientConnection) -> plan.Context:
        """What an attach on `conn` is decided against (`proxy.plan`)."""
        limits = self.config.limits
        return plan.Context(traits=self.upstream.traits, upstream_name=self.upstream.name,
                            upstream_up=self.upstream_up, route=self._route, routing_type=self.upstream.routing_type,
                            reconnecting=(not self.upstream_up and self._was_up and not self.stopping
                                          and self.replicas is None),
                            permissions=self.permissions, dialect=self.dialect, filter_limits=limits.filter_limits(),
                            max_depth=limits.nesting_depth, replicas=self.replicas is not None,
                            splicing=self._splicing(conn))

    def _replica_login(self, identity: Any) -> bool:
        """Whether a connection logged in as the replicas do (`replicas.user`, else ANONYMOUS)."""
        user = self.config.replicas.user
        if user:
            return identity.user == user and identity.mechanism in ("PLAIN", "EXTERNAL")
        return identity.mechanism in ("ANONYMOUS", "")

    def _splicing(self, conn: ClientConnection) -> bool:
        """Whether a client connection's first link may splice it (`replicas.splice`)."""
        return (self.replicas is not None and conn.peer is None
                and self.config.replicas.splice)

    def _splice(self, link, address: str) -> bool:
        """`replicas.splice` (the caller checked `_splicing`): the client's connection goes whole to
        the owner of queue `address` when this link (a consumer's or a producer's) is its first and
        nothing has been answered on it yet (`engine.splice`: the owner answers the client's open,
        begin and attach, and serves it); True if it went."""
        settings = self.config.replicas
        via, _ = self.replicas.upstream_for(address)
        connection = link.connection
        if via is None or sum(len(session.links) for session in connection.sessions) != 1:
            return False
        loop = connection.engine
        if not loop.spliceable(connection):
            return False
        log.info("connection %s attaches to %s, whose owner is replica %s: spliced to it",
                 connection.remote_container, address, via)
        if not loop.splice(connection, splice_target(via),
                           SaslClientExchange(settings.user or None, settings.password or None)):
            return False
        if self.metrics is not None:
            self.metrics.splices.inc()
        return True

    # ---------------------------------------------------------------- replicas

    # ---------------------------------------------------------------- publishing (inlets)
    def _attach_inlet(self, link, conn: ClientConnection) -> None:
        target = link.remote_target
        request = plan.SenderRequest(address=target.address, capabilities=target.capabilities,
                                     dynamic=bool(target.dynamic), coordinator=link.remote_target_type == _COORDINATOR,
                                     user=conn.user, peer=conn.peer is not None)
        context = self.plan_context(conn)
        decided = plan.plan_sender(request, context)
        if isinstance(decided, plan.Splice):
            if self._splice(link, decided.address):
                return
            decided = plan.plan_sender(request, dataclasses.replace(context, splicing=False))
        if isinstance(decided, plan.Refuse):
            self._refuse_planned(link, conn, decided)
            return
        if isinstance(decided, plan.AwaitUpstream):
            self.resumption.await_attach(link, conn, self._attach_inlet)
            return
        if isinstance(decided, plan.Relay):
            sender.open_relay(self, link, conn)
            return
        caps: tuple = ()
        dynamic = None
        if isinstance(decided, plan.DynamicTarget):
            # A dynamic target (Qpid JMS's temporary queue: capability temporary-queue): a node of
            # its own, named in the reply, gone with this link.
            address = dynamic = self.upstream.declare_dynamic_target()
        else:
            address, caps = decided.routed, decided.capabilities
        link_state(link).operation, link_state(link).address = plan.SEND, target.address
        sender.open_inlet(self, link, conn, address, caps, dynamic)

    def _route(self, address: str | None) -> Any:
        if self.routing is None or address is None:
            return None
        return self.routing.route(address)

    # ---------------------------------------------------------------- recycling

    # ---------------------------------------------------------------- cleanup
    def _drop_link(self, link, closed: bool = False) -> None:
        handler = link.handler
        if isinstance(handler, ClientLinkObject):
            handler.gone()
        c = connection_state(link.connection)
        if c is not None:
            c.links.discard(link)
            c.producers.discard(link)
        state = link.context
        if state is None:
            return
        if state.pair is not None:
            state.pair.client_gone(link)
        outlet = state.outlet
        if outlet is not None:
            state.outlet = None
            binding, outlet.io_owner = outlet.io_owner, None
            if binding is not None and not binding.closed:
                if outlet in binding.pending:
                    binding.pending.remove(outlet)
                binding.feed.remove_outlet(outlet)
                self.filter_totals.retire(binding.spec.address, outlet)
                if not binding.feed.outlets and not binding.pending:
                    if binding.broker_queue is not None:
                        # Its queue on the broker keeps the subscription; closing the link ends it.
                        self.registry.end_feed(binding, closed)
                        if closed:
                            self.durable.unsubscribe_on_broker(binding.kept_name, binding.broker_queue)
                    elif binding.kept_name is not None and not closed and not self.stopping and self.upstream_up:
                        # A durable subscriber detached without closing (JMS consumer.close()): the
                        # subscription stays, its upstream consumer attached, until it comes back,
                        # unsubscribes, or the upstream connection goes.
                        self.registry.kept[binding.kept_name] = binding
                        log.info("durable subscription %r kept while its subscriber is detached (%s)",
                                 binding.kept_name, binding.spec.address)
                    else:
                        self.registry.end_feed(binding, closed)
        unsubscribing = state.unsubscribe
        if state.unsubscribe_queue is not None:
            queue, state.unsubscribe_queue = state.unsubscribe_queue, None
            if closed and unsubscribing is not None:  # (answered: found on the broker)
                self.durable.unsubscribe_on_broker(unsubscribing, queue)
        if unsubscribing is not None:
            state.unsubscribe = None
            binding = self.registry.kept.get(unsubscribing)
            if closed and binding is not None:
                del self.registry.kept[unsubscribing]
                log.info("durable subscription %r unsubscribed", unsubscribing)
                self.registry.end_feed(binding, closed=True)
        relay = state.relay
        if relay is not None:
            state.relay = None
            relay.close()
            relay.conn.unfinished.forget(relay)
        inlet = state.inlet
        if inlet is not None:
            state.inlet = None
            if inlet is not handler:  # (a reply address's `replies.ReplyInlet`; a `SenderLink` is gone above)
                inlet.closed = True
            inlet.conn.unfinished.forget(inlet)
            if inlet.publisher is not None:
                inlet.publisher.close()
            if inlet.dynamic is not None:
                self.upstream.release_dynamic_target(inlet.dynamic)


_REFUSAL_REASONS = {
    "amqp:invalid-field": "invalid-filter",
    "amqp:resource-limit-exceeded": "limit",
    "amqp:unauthorized-access": "unauthorized",
    "amqp:not-found": "not-found",
    "amqp:connection:forced": "upstream-unavailable",
    "amqp:internal-error": "internal-error",
}




# The RabbitMQ version presented to clients in front of RabbitMQ 4.0 and 4.1: RabbitMQ's own AMQP 1.0
# clients gate features on the server's `version` (rabbitmq-amqp-python-client 1.0: filters by
# properties and application properties from 4.1.0, SQL filters and direct reply-to from 4.2.0, a
# single active consumer's state from 4.3.0), and the daemon serves those of 4.2.0 on any RabbitMQ 4
# (it evaluates the filters itself and holds reply addresses itself: docs/proxy.md, RabbitMQ 3 and 4).
FEATURE_LEVEL = "4.2.0"
_presented: dict = {}  # upstream name -> the (upstream version, presented version) last logged


def presented_version(version: str | None) -> str:
    """The `version` clients are shown in front of a RabbitMQ whose version is `version`: the
    daemon's feature level in front of 4.0 and 4.1, the upstream's own otherwise (3.x: RabbitMQ's
    clients refuse it, and should, since they speak RabbitMQ 4's address model; 4.2 and later: the
    upstream's features are at least the daemon's)."""
    parts = [int(p) if p.isdigit() else -1 for p in (version or "").split("-")[0].split(".")[:2]]
    if len(parts) == 2 and parts[0] == 4 and 0 <= parts[1] < 2:
        return FEATURE_LEVEL
    return version or ""


def _identity(upstream: Any) -> dict:
    """The open frame's properties.  In front of RabbitMQ, its `product` and a `version` that unlocks
    in RabbitMQ's own clients what the daemon serves (`presented_version`), with `upstream-version`
    the upstream's own and `broker-filter` naming this daemon's version beside them; otherwise
    product broker-filter."""
    from .. import __version__

    product = upstream.product
    if product == "RabbitMQ":
        real = upstream.version or ""
        version = presented_version(real)
        if _presented.get(upstream.name) != (real, version):
            _presented[upstream.name] = (real, version)
            if version != real:
                log.info("clients are shown RabbitMQ %s (what the daemon serves); upstream %s is RabbitMQ %s",
                         version, upstream.name, real)
        return {t.symbol("product"): product, t.symbol("version"): version, t.symbol("upstream-version"): real,
                t.symbol("broker-filter"): __version__}
    return {t.symbol("product"): "broker-filter", t.symbol("broker-filter"): __version__}
