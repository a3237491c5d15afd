"""The client-facing side of the proxy: the engine handler of accepted client connections.

Theory of operation
-------------------
Every client receiving link becomes an `Outlet` on a `Feed` (see `broker_filter.proxy.forwarding`), and
every feed is one upstream consumer.  Which links share a feed is one rule, in
`broker_filter.proxy.sharing`: the plain subscription links of one address share one upstream
subscription (`broker_filter.proxy.fanout`), durable and dynamic ones get a feed of their own (a
named shared subscription one per name); links on the same queue (and the same pushed-down filters)
share one.
The attach reply is sent only once the upstream consumer is attached, so an upstream refusal
reaches the client as an attach refusal.

Every client sending link becomes an `Inlet` with one upstream publisher to the same address.  The
client gets credit only as far as the upstream gives credit, and an accepted delivery
means the upstream accepted it.  Each published message gets the origin annotation
"<instance>/<connection>" spliced in, which is what no-local receivers are compared against.

Refusals follow the wire contract: an attach reply with a null source (or target), then a detach
with closed=true and the error.  Every `on_*` method runs inside an error boundary: a failure closes
the link (or, outside any link, the connection) with `amqp:internal-error` and is logged; nothing
else is affected.

Upstream loss: client links are not re-attached transparently.  Each receiving and sending link
served by the lost upstream is detached with `amqp:connection:forced`; attaches made while the
upstream is down are refused the same way.  The client re-attaches when it wants; deliveries it had
not settled were returned to the queue by the broker and are delivered again (at-least-once).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import re
import time
from typing import Any, Callable


from ..amqp import types as t
from ..config import Config
from ..filters import FilterSet
from ..security import SaslClientExchange, identity_of
from .feeds import FeedBinding, FeedRegistry, offer_identity
from .forwarding import Outcome, Outlet, filter_identity
from . import introspect, sharing, topology
from . import plan, sender
from .grants import Granted
from .sender import RELAY_CAPABILITY
from .records import ClientConnection, Placement, connection_state, link_state, links_of, state_of
from .refusal import close_link, refuse_link
from .routing import Routing, vhost_asked
from .replicas import PROPERTY as REPLICA_PROPERTY
from ..engine._cproton import lib
from ..engine.container import Typed
from ..engine.splice import splice_target
from ..engine.endpoints import (LOCAL_ACTIVE, LOCAL_CLOSED, LOCAL_UNINIT, REMOTE_CLOSED, Condition, Connection,
                                Delivery, Handler, Link, Session, Terminus)
from .wire import remote_outcome
from .management import ManagementPair, is_management, refusal
from .upstream import FILTEX_KINDS, ConsumerSpec, ErrorInfo, Passthrough, Upstream

log = logging.getLogger("broker_filter.proxy")

# A drain (see `ProxyServer._drain`) waits for the upstream's messages until none came for DRAIN_QUIET
# seconds (looking every DRAIN_STEP), at most DRAIN_LIMIT seconds.
DRAIN_QUIET = 0.15
DRAIN_STEP = 0.05
DRAIN_LIMIT = 2.0

FILTER_CAPABILITIES = (
    "APACHE.ORG:LEGACY_AMQP_EXCHANGE_FILTERS",
    "APACHE.ORG:JMS_FILTERS",
    "APACHE.ORG:LOGIC_FILTERS",
    "APACHE.ORG:SELECTOR",
    "APACHE.ORG:NO_LOCAL",
    "AMQP_FILTEX_PROP_V1_0",
    "AMQP_FILTEX_SQL_V1_0",
)
_OFFERED = FILTER_CAPABILITIES + (RELAY_CAPABILITY,)  # (a null target: the anonymous relay, `sender.Relay`)
_COORDINATOR = lib.PN_COORDINATOR  # a transaction coordinator target
_EXCHANGE = re.compile(r"^/exchange/([^/]+)/?$")


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


def push_down(upstream: Upstream, address: str | None, fs: FilterSet,
              dialect: str) -> tuple[str | None, tuple, FilterSet, tuple]:
    """(upstream address, entries the upstream evaluates, filter-set left to evaluate locally,
    filter expressions offered to the upstream).

    The offered entries (filtex: the property and SQL filters, on an upstream that `can_offer` them)
    go on the upstream attach beside the pushed ones and stay in the local filter-set: the attach
    reply decides whether the upstream evaluates them (`FeedBinding.on_consumer_ready`)."""
    pushed: list = []
    offered: list = []
    taken: set[int] = set()
    m = _EXCHANGE.match(address or "")
    if m and upstream.traits.binds_exchange_keys:
        exchange = m.group(1)
        bindings = [e for e in fs.entries if e.kind in ("direct", "topic") and isinstance(e.text, str)]
        if len(bindings) == 1 and "/" not in bindings[0].text:
            # The exchange applies its own binding semantics, which is what a legacy binding asks for.
            address = f"/exchange/{exchange}/{bindings[0].text}"
            taken.add(id(bindings[0]))
    keys: set = set()
    for e in fs.entries:
        # One entry per key upstream (a filter-set is a map); a clashing key stays local.
        if id(e) in taken or e.kind == "no-local" or str(e.key) in keys:
            continue
        if dialect == "jms" or e.kind in FILTEX_KINDS:
            if upstream.can_evaluate(e):
                pushed.append(e)
                taken.add(id(e))
                keys.add(str(e.key))
                continue
        if upstream.can_offer(e):
            offered.append(e)
            keys.add(str(e.key))
    local = fs.subset(lambda e: id(e) not in taken)
    return address, tuple(pushed), local, tuple(offered)


class ProxyServer(Handler):
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
        self.feeds = self.registry.feeds  # (the same dict, for the reports)
        self.connections: dict[str, ClientConnection] = {}
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

    def _route_link(self, link: Link, transfer: Callable) -> None:
        """The link's deliveries go to `transfer(link, delivery pointer)` straight from the engine's
        event loop (`engine.container.route`); its flow comes to `on_flow`."""
        self.upstream.loop.container.route(link, Typed(functools.partial(transfer, link),
                                                       functools.partial(self._typed_failed, link)))

    def _typed_failed(self, link) -> None:
        self._drop_link(link)
        close_link(link, "amqp:internal-error", "proxy failure on this link; see the proxy log")

    def feed_token(self) -> str:
        """Names a feed in the marks on the copies it moves: unique among daemons on one broker."""
        return f"{self.instance}/{next(self._feed_ids)}"

    # ---------------------------------------------------------------- stopping

    # ---------------------------------------------------------------- upstream listener
    def on_upstream_up(self, upstream) -> None:
        if self.metrics is not None and self._was_up:
            self.metrics.upstream_reconnects.inc()
        if not self._was_up:
            self.upstream.loop.call_later(1.0, self.registry.tick)
        self._was_up = True
        self.upstream_up = True
        self.registry.forget_recyclers()

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
            if b.via is None:  # a feed consuming through a queue's owner does not use this upstream
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
        if self.metrics is not None:
            self.metrics.connections_accepted.inc()
        cid = f"{self.instance}/{next(self._conn_ids)}"
        state = conn.context = ClientConnection(cid, conn, identity)
        state.peer = str(peer) if peer is not None else None
        if peer is not None:
            # the peer's link to this replica ends after the same silence as this one's to the peer:
            # what this replica delivered on it and was not settled goes back (custody), not held
            # for a replica cut off
            conn.set_idle_timeout(self.replicas.heartbeat)
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
            ManagementPair.serve(self.upstream, link, self._route_link, self._manage_check(conn))
            return
        if link.is_sender:
            self._attach_outlet(link, conn)
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

    @boundary
    def on_flow(self, link: Link) -> None:
        state = state_of(link)
        if state.pair is not None:
            state.pair._client_credit(link)
        elif link.is_sender:
            self._outlet_credit(link)

    def _outlet_credit(self, link: Link) -> None:
        outlet = state_of(link).outlet
        if outlet is None:
            return
        pointer = link.ptr
        credit = lib.pn_link_credit(pointer)
        binding = outlet.io_owner
        if binding is None or binding.closed or outlet not in binding.feed.outlets:
            if binding is not None and not binding.closed and outlet in binding.pending:
                return  # the feed is not ready: its credit (and drain) is taken when it is (`complete_outlet`)
            if credit > 0 and lib.pn_link_get_drain(pointer):
                lib.pn_link_drained(pointer)
            return
        binding.feed.set_credit(outlet, credit)
        if credit > 0 and lib.pn_link_get_drain(pointer):
            self._drain(link, outlet, binding)
        elif outlet.draining is not None:
            outlet.draining = None  # a flow without drain ends a drain under way

    def _drain(self, link, outlet: Outlet, binding) -> None:
        """The client asked to drain (AMQP 1.0 2.6.7): the feed was just given the link's credit, so it
        offered what it holds and asked its upstream for more.  Messages the upstream had ready come
        within moments: once none came for `DRAIN_QUIET` s (at most `DRAIN_LIMIT` s), or the credit is
        used up, the link is drained (its delivery-count advanced past the unused credit, credit 0).
        Only a link with drain set pays for this: the per-message path does not change."""
        token = outlet.draining = object()
        loop = self.upstream.loop
        clock = time.monotonic
        started = clock()
        state = {"seen": binding.feed._upstream_received(), "quiet_since": started}

        def check() -> None:
            if outlet.draining is not token:
                return  # a later flow took over (a new drain, or drain cleared)
            if outlet.io_owner is not binding or binding.closed or outlet not in binding.feed.outlets:
                outlet.draining = None
                return
            now = clock()
            received = binding.feed._upstream_received()
            if received != state["seen"]:
                state["seen"], state["quiet_since"] = received, now
            if (outlet.credit > 0 and now - state["quiet_since"] < DRAIN_QUIET and now - started < DRAIN_LIMIT):
                loop.call_later(DRAIN_STEP, check)
                return
            outlet.draining = None
            pointer = link.ptr
            if pointer is not None and lib.pn_link_get_drain(pointer):
                lib.pn_link_drained(pointer)
            binding.feed.set_credit(outlet, 0)

        if outlet.credit <= 0:
            check()
        else:
            loop.call_later(DRAIN_STEP, check)

    @boundary
    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        # (the proxy's links are routed: their transfers go to `_outcome`, `Inlet.on_transfer` and the
        # relays straight from the engine; this is a link it keeps nothing on, e.g. one refused)
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
            conn = subject if isinstance(subject, Connection) else getattr(subject, "connection", None)
            if conn is not None:
                self._drop_connection(conn)
                if conn.local_state != LOCAL_CLOSED:
                    conn.close(Condition("amqp:internal-error", "proxy failure; see the proxy log"))
        except Exception:
            log.exception("failure handling a failure")

    def subscriber(self, conn: ClientConnection | None, link: Link) -> str | None:
        """Who a named (JMS durable or shared) subscription belongs to: the client's container id, and,
        with `[security]` settings, its user too, so that a subscription belongs to the user who
        made it (another user with the same client id and name has one of its own)."""
        container = link.connection.remote_container
        if self.permissions is plan.OPEN or conn is None or conn.peer is not None:
            return container
        return f"{container}@{conn.user or 'anonymous'}"

    def _manage_check(self, conn: ClientConnection) -> Callable[[list | None, str], str | None]:
        """What a `/management` request of `conn`'s needs: `manage` on every node it names (with no
        settings, every request passes)."""

        def check(addresses: list | None, request: str) -> str | None:
            if self.permissions is plan.OPEN:
                return None
            if addresses is None:
                why = f"{request}: not a request the daemon can check permissions for"
                self.audit(conn, plan.MANAGE, None, why)
                return why
            for address in addresses:
                why = self.permissions.refusal(conn.user, plan.MANAGE, address)
                if why is not None:
                    self.audit(conn, plan.MANAGE, address, why)
                    return why
            return None

        return check

    def reconfigure(self, config: Any) -> int:
        """New security settings (SIGHUP): every client link is checked again as it was attached, and
        one no longer permitted is detached with `amqp:unauthorized-access` (its connection and other
        links carry on); the number detached."""
        self.config = config
        self.permissions = Granted.of(config, self.upstream)
        detached = 0
        for conn in list(self.connections.values()):
            if conn.peer is not None or conn.connection is None:
                continue  # (a replica's links were checked where their client logged in)
            for link in links_of(conn.connection):
                state = link.context
                if state is None or state.operation is None or link.local_state == LOCAL_CLOSED:
                    continue
                why = self.permissions.refusal(conn.user, state.operation, state.address)
                if why is None:
                    continue
                self.audit(conn, state.operation, state.address, why)
                self._drop_link(link)
                close_link(link, "amqp:unauthorized-access", why)
                detached += 1
        return detached

    def _refuse_planned(self, link, conn: ClientConnection, refusal: plan.Refuse) -> None:
        if refusal.condition == "amqp:unauthorized-access":
            self.audit(conn, refusal.operation, refusal.address, refusal.description)
        self._refuse(link, refusal.condition, refusal.description, refusal.info, reason=refusal.reason)

    def audit(self, conn: ClientConnection, operation: str | None, address: str | None, why: str) -> None:
        """An operation refused by the permissions: one log line (who, from where, what, where) and
        a count by operation."""
        identity = conn.identity
        log.warning("authorization: refused %s on %r for user %r from %s: %s", operation, address,
                    conn.user, identity.peer if identity is not None else "?", why)
        if self.metrics is not None:
            self.metrics.authorization_refused(operation or "other")

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
                            permissions=self.permissions, dialect=self.dialect, filter_limits=limits.filter_limits(),
                            max_depth=limits.nesting_depth, replicas=self.replicas is not None,
                            splicing=self._splicing(conn))

    def _attach_outlet(self, link, conn: ClientConnection) -> None:
        src = link.remote_source
        request = plan.ReceiverRequest(address=src.address, filter=src.filter, capabilities=src.capabilities,
                                       copy=src.distribution_mode == "copy", dynamic=bool(src.dynamic), null=src.null,
                                       durable=bool(src.durability) or src.expiry_policy == "never",
                                       user=conn.user, peer=conn.peer is not None)
        context = self.plan_context(conn)
        decided = plan.plan_receiver(request, context)
        if isinstance(decided, plan.Splice):
            if self._splice(link, decided.address):
                return
            decided = plan.plan_receiver(request, dataclasses.replace(context, splicing=False))
        if isinstance(decided, plan.Refuse):
            self._refuse_planned(link, conn, decided)
            return
        if isinstance(decided, plan.LookUpKept):
            # Qpid JMS's unsubscribe (a null source, the subscription's link name): the durable
            # subscription the proxy keeps under that name, if any.
            self._look_up_kept(link, conn)
            return
        fs, wanted = decided.fs, decided.wanted
        state = link_state(link)
        state.fs = fs
        state.subscription = decided.decision.subscription
        state.operation, state.address = plan.BROWSE if decided.browse else plan.CONSUME, src.address
        outlet = Outlet(f"{conn.id}:{link.name}", wanted, conn.id, io_ref=link,
                        max_size=link.remote_max_message_size)
        state.outlet = outlet
        conn.links.add(link)
        self._route_link(link, functools.partial(self._outcome, outlet))
        if outlet_presettled_requested(link):
            link.set_snd_settle_mode(True)
            outlet.presettled = True
        state.place = Placement(decided.routed, wanted, decided.decision, src.capabilities, decided.routing_type,
                                decided.browse, decided.owned)
        self._place(link, outlet)

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

    def _look_up_kept(self, link, conn: ClientConnection) -> None:
        """A null-source attach names a durable subscription (Qpid JMS's unsubscribe): answered with
        the kept subscription's source (Qpid JMS requires one); closing the link ends it.  In front
        of RabbitMQ 4 the subscription is looked for on the broker as well (`_hold_on_broker`)."""
        name = sharing.kept_name(link.name, self.subscriber(conn, link))
        binding = self.registry.kept.get(name) if name is not None else None
        if binding is not None:
            self._answer_lookup(link, conn, name, binding.kept_address)
            return
        pair = topology.topology(self.upstream) if name is not None else None
        if pair is None:
            self._refuse(link, "amqp:not-found",
                         f"no durable subscription named {link.name!r} is kept for a detached subscriber here "
                         f"(in front of upstream {self.upstream.name} the proxy keeps one from its subscriber's "
                         "detach until the upstream connection goes)")
            return
        queue = topology.durable_queue(name)
        state = link_state(link)
        state.unsubscribe_queue = queue  # (set while the broker is asked: a detach meanwhile clears it)

        def found(arguments: dict | None, failure: tuple[str, str] | None) -> None:
            if state.unsubscribe_queue != queue or link.local_state != LOCAL_UNINIT:
                return  # the client went meanwhile
            if arguments is None:
                state.unsubscribe_queue = None
                self._refuse(link, failure[0] if failure else "amqp:not-found",
                             f"durable subscription {link.name!r}: {failure[1]}" if failure else
                             f"no durable subscription named {link.name!r} of client "
                             f"{link.connection.remote_container!r} exists on upstream {self.upstream.name} "
                             f"(no queue {queue!r})")
                return
            self._answer_lookup(link, conn, name, str(arguments.get(topology.ARG_ADDRESS) or "") or None)

        topology.find_subscription_queue(pair, queue, found)

    def _answer_lookup(self, link, conn: ClientConnection, name: str, address: str | None) -> None:
        why = self.permissions.refusal(conn.user, plan.DURABLE, address) if address is not None else None
        if why is not None:  # (its own subscription, but no longer allowed to keep or remove one there)
            self.audit(conn, plan.DURABLE, address, why)
            self._refuse(link, "amqp:unauthorized-access", why, reason="unauthorized")
            return
        link.set_source(_kept_source(address))
        link.copy_remote_target()
        link_state(link).unsubscribe = name
        conn.links.add(link)
        link.open()

    def _unsubscribe_on_broker(self, name: str | None, queue: str) -> None:
        pair = topology.topology(self.upstream)
        if pair is None:
            log.warning("durable subscription %r could not be unsubscribed: upstream %s is not connected; its "
                        "queue %s stays on the broker", name, self.upstream.name, queue)
            return
        log.info("durable subscription %r unsubscribed: deleting its queue %s", name, queue)
        topology.delete_subscription_queue(pair, queue)

    def _place(self, link, outlet: Outlet) -> None:
        """Serve a client's receiving link: join the feed of its kind on its upstream, or open one
        (a queue link under `[replicas]`: on the upstream of the queue's owner)."""
        state = state_of(link)
        p: Placement = state.place
        src = link.remote_source
        fs: FilterSet = state.fs
        routed, wanted, decision, caps, browse = p.routed, p.wanted, p.decision, p.caps, p.browse
        subscription = decision.subscription
        upstream, via = self.upstream, None
        if p.owned:
            via, peer_upstream = self.replicas.upstream_for(routed)
            if via is not None:
                upstream = peer_upstream
        up_address, pushed, local, offered = push_down(upstream, routed, wanted, self.dialect)
        outlet.filter = local
        outlet.identity = filter_identity(local, outlet.receiver)
        passthrough = ()
        if fs.ignored and upstream.traits.passes_unknown_filters:
            # Filters the proxy does not know (a stream offset, a broker's own filter): the upstream
            # may (RabbitMQ's `rabbitmq:stream-offset-spec`); its echo says what it applied.
            passthrough = tuple(Passthrough(i.key, i.value) for i in fs.ignored)
        spec = ConsumerSpec(
            address=up_address,
            filters=pushed,
            capabilities=sharing.upstream_capabilities(caps, p.routing_type),
            distribution_mode="copy" if src.distribution_mode == "copy" else None,
            durable=src.durability,
            expiry_policy=src.expiry_policy,
            dynamic=bool(src.dynamic),
            name=link.name,
            container_id=self.subscriber(connection_state(link.connection), link),
            offered=offered,
            passthrough=passthrough,
        )
        # The offered filters are in the key: links on one upstream consumer ask it the same.
        # A durable subscription (shared or not) in front of an upstream without named
        # subscriptions: the proxy keeps it across its subscribers' detaches, as a queue on the
        # broker (RabbitMQ 4, `_hold_on_broker`), else with its upstream consumer left attached.
        kept = (subscription and via is None and not browse and not spec.dynamic
                and not upstream.traits.named_subscriptions)
        durable = bool(src.durability) or spec.expiry_policy == "never"
        key = sharing.feed_key(decision, address=up_address, pushed=pushed + offered + passthrough, local=local,
                               serial=next(self._sub_ids), link_name=link.name,
                               container_id=spec.container_id, capabilities=caps,
                               durable=durable, dynamic=spec.dynamic, kept=kept)
        kept_name = key[2] if key[0] == sharing.KEPT or (key[0] == sharing.NAMED and durable and kept) else None
        if kept_name is not None and key[0] == sharing.NAMED and self._in_use_otherwise(link, kept_name, key):
            return
        if kept_name is not None and not (pushed or offered or passthrough):
            held = topology.exchange_binding(up_address)
            pair = topology.topology(upstream) if held is not None else None
            if pair is not None:
                # RabbitMQ 4 (or 3.x with `upstream.management_url`): the subscription is a durable
                # queue of its own on the broker
                existing = self.registry.feeds.get(key)
                if existing is None or existing.closed:
                    self._hold_on_broker(pair, link, outlet, key, spec, kept_name, held, up_address, local)
                    return
                kept_name = None  # (attached already: the link joins that feed, below)
        if kept_name is not None:
            if self._beyond_kept_limit(link, kept_name):
                return
            old = self.registry.kept.pop(kept_name, None)
            if old is not None and old.key != key:
                # JMS: subscribing again under the name with another selector or topic replaces it
                log.info("durable subscription %r resubscribed with another address or selector: the "
                         "one kept is ended", kept_name)
                self.registry.end_feed(old, closed=True)
        if browse:  # a browser reads the queue from its head on an upstream consumer of its own
            key = ("subscription", next(self._sub_ids))
        if via is not None:  # consuming through the queue's owner: not the feed of one consuming here
            key = key + (("via", via),)
        binding = self.registry.feeds.get(key)
        base = None
        if (binding is None or binding.closed) and not decision.subscription:
            # A feed whose upstream turned the offered filters down serves every link of its queue.
            base = sharing.feed_key(decision, address=up_address, pushed=pushed, local=local, serial=0)
            if via is not None:
                base = base + (("via", via),)
            binding = self.registry.feeds.get(base) or self.registry.feed_aliases.get(base)
            if binding is None or binding.closed:
                # One whose answer is not in yet: wait for it rather than open a second upstream
                # consumer on the queue, which would hold a share of its messages out of reach.
                deciding = self.registry.deciding.get(base)
                if deciding is not None and not deciding.closed:
                    outlet.io_owner = deciding
                    deciding.pending.append(outlet)
                    deciding.awaiting[outlet] = (key, spec)
                    return
        if binding is None or binding.closed:
            opened = self.registry.open_feed(key, spec, subscription, outlet, upstream, via)
            opened.kept_name, opened.kept_address = kept_name, src.address
            if offered and base is not None and base not in self.registry.deciding:
                self.registry.deciding[base] = opened
                opened.deciding_key = base
            return
        self._join(binding, outlet)

    def _join(self, binding: FeedBinding, outlet: Outlet) -> None:
        """The outlet is served by an open feed: at once if its upstream consumer is ready."""
        outlet.io_owner = binding
        if binding.ready:
            self.complete_outlet(binding, outlet)
        else:
            binding.pending.append(outlet)

    def _in_use_otherwise(self, link, name: str, key: Any) -> bool:
        """A shared durable subscription asked for with another address or selector while links are
        attached to it as it is: refused (JMS: its selector cannot change while it has consumers).
        True if refused."""
        for k, b in self.registry.feeds.items():
            if k[0] == sharing.NAMED and k[2] == name and k != key and not b.closed and (b.feed.outlets or b.pending):
                self._drop_link(link)
                self._refuse(link, "amqp:resource-locked",
                             f"shared durable subscription {link.name!r} has subscribers attached with another "
                             "address or selector: detach them before subscribing with this one")
                return True
        return False

    def _hold_on_broker(self, pair: Any, link, outlet: Outlet, key: Any, spec: ConsumerSpec, kept_name: str,
                        binding_key: tuple[str, str], address: str, local: FilterSet) -> None:
        """A durable subscription in front of RabbitMQ 4 (or 3.x given its HTTP API): its queue on the
        broker is found or declared (and bound) over `pair` (`topology`), then consumed by a
        subscription feed (what the link's filters do not select is accepted and dropped).  The
        queue, not the daemon, keeps the subscription while its subscriber is detached, across
        daemon restarts and upstream reconnects; an unsubscribe deletes it."""
        state = state_of(link)
        queue = topology.durable_queue(kept_name)
        arguments = {"x-queue-type": "classic", topology.ARG_ADDRESS: address, topology.ARG_FILTER: local.description,
                     topology.ARG_CLIENT: spec.container_id or "", topology.ARG_NAME: link.name}

        def ready(failure: tuple[str, str] | None, replaced: bool) -> None:
            if state.outlet is not outlet or self.stopping:
                return  # the subscriber went meanwhile (the queue stays, as its detach asks)
            if failure is not None:
                self._drop_link(link)
                self._refuse(link, failure[0], f"durable subscription {link.name!r}: {failure[1]}")
                return
            if replaced:
                log.info("durable subscription %r resubscribed with another address or selector: its queue "
                         "%s was replaced", kept_name, queue)
            binding = self.registry.feeds.get(key)
            if binding is not None and not binding.closed:
                self._join(binding, outlet)
                return
            consumed = dataclasses.replace(spec, address=topology.consume_address(self.upstream, queue), capabilities=(),
                                           distribution_mode=None, durable=None, expiry_policy=None)
            opened = self.registry.open_feed(key, consumed, True, outlet, self.upstream)
            opened.kept_name, opened.kept_address, opened.broker_queue = kept_name, address, queue

        topology.ensure_subscription_queue(pair, queue, binding_key, arguments, ready)

    def _beyond_kept_limit(self, link, name: str) -> bool:
        """A new durable subscription the daemon would keep (`name`: not attached nor kept now) while
        it already has `limits.kept_subscriptions` of them, attached or kept: refused at its attach,
        so that no subscriber's detach ever needs one more kept than the limit and none kept is
        dropped.  True if refused."""
        limit = self.config.limits.kept_subscriptions or 0
        if not limit or name in self.registry.kept:
            return False
        names = {b.kept_name for b in self.registry.feeds.values()
                 if b.kept_name is not None and not b.closed and b.broker_queue is None}
        if name in names or len(names) < limit:
            return False
        self._drop_link(link)
        self._refuse(link, "amqp:resource-limit-exceeded",
                     f"durable subscription {link.name!r} of client {link.connection.remote_container!r} "
                     f"refused: the daemon keeps {len(names)} durable subscriptions in front of upstream "
                     f"{self.upstream.name}, attached or detached (limits.kept_subscriptions = {limit}); "
                     "unsubscribe one, or resume one of them", reason="kept-subscriptions", level=logging.WARNING)
        return True

    # ---------------------------------------------------------------- replicas
    def owners_changed(self) -> None:
        """The live replicas changed (`proxy.replicas`): queue links whose queue has another owner
        now are served there."""
        if self.stopping or self.replicas is None:
            return
        seen: set[int] = set()
        for b in list(self.registry.feeds.values()) + list(self.registry.feed_aliases.values()):
            if id(b) in seen or b.closed:
                continue
            seen.add(id(b))
            moving = [o for o in list(b.feed.outlets) + list(b.pending) if self._moves(o, b)]
            if moving:
                self.rehome(b, moving)

    def _moves(self, outlet: Outlet, binding: FeedBinding) -> bool:
        p = state_of(outlet.io_ref).place
        if p is None or not p.owned:
            return False
        via, _ = self.replicas.upstream_for(p.routed)
        return via != binding.via

    def replica_lost(self, binding: FeedBinding, error: ErrorInfo | None) -> bool:
        """The consumer of a feed served through a replica closed: True when its links moved to
        another owner (the replica went or drains), False to fail them as usual."""
        if self.stopping or self.replicas is None or error is None:
            return False
        if not error.transient and error.condition != "amqp:connection:forced":
            return False  # the owner's own answer (not found, unauthorized...): the client's to see
        if not error.transient:
            self.replicas.peer_leaving(binding.via)  # detached as it drains
        if not binding.closed:
            moving = list(binding.feed.outlets) + list(binding.pending)
            if moving:
                self.rehome(binding, moving)
        return binding.closed or not (binding.feed.outlets or binding.pending)

    def rehome(self, binding: FeedBinding, outlets: list[Outlet]) -> None:
        """Move `outlets` (their links stay attached) from `binding` to the feed of their queue's
        owner.  What the client has unsettled goes back to `binding`'s custody, and what it holds
        goes back to the broker when no link is left on it."""
        log.info("queue %s: %d link(s) move from %s to %s", binding.spec.address, len(outlets),
                 binding.via or "this replica",
                 self.replicas.owner(state_of(outlets[0].io_ref).place.routed) or "nobody")
        for o in outlets:
            if o in binding.pending:
                binding.pending.remove(o)
            binding.feed.remove_outlet(o)
            o.io_owner = None
        if not binding.feed.outlets and not binding.pending:
            self.registry.unregister(binding)
            binding.feed.stop()
            binding.draining = True
            if binding.feed.moving == 0:
                self.registry.finish_feed(binding)
            else:
                self.registry.draining.add(binding)
                self.upstream.loop.call_later(self.grace, lambda b=binding: self.registry.finish_feed(b))
        for o in outlets:
            link = o.io_ref
            if link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED or state_of(link).outlet is not o:
                continue
            o.in_flight.clear()
            o.waiting_since = None
            self._place(link, o)

    def complete_outlet(self, binding: FeedBinding, outlet: Outlet) -> None:
        link = outlet.io_ref
        if link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED:
            return
        if binding.evaluated:
            # What the upstream evaluates for this feed is not evaluated again here.
            outlet.filter = outlet.filter.subset(lambda e: offer_identity(e) not in binding.evaluated)
            outlet.identity = filter_identity(outlet.filter, outlet.receiver)
        if link.local_state == LOCAL_ACTIVE:  # attached before: moved to its queue's new owner
            binding.feed.add_outlet(outlet)
            self._outlet_credit(link)
            return
        state = state_of(link)
        fs: FilterSet = state.fs
        src = link.remote_source
        address, dynamic = src.address, False
        if src.dynamic and not src.address:
            address = binding.info.address if binding.info is not None else None
            if not address:
                self._drop_link(link)
                close_link(link, "amqp:not-implemented",
                           f"dynamic sources are not supported by upstream {self.upstream.name}")
                return
            dynamic = True  # the node made for this link (gone when it closes)
        echoed = binding.info.echoed if binding.info is not None else None
        source = Terminus(address=address, dynamic=dynamic, durability=src.durability, expiry_policy=src.expiry_policy,
                          distribution_mode="copy" if state.subscription else None,
                          filter={**fs.applied, **(echoed or {})} if fs.entries or echoed else None,
                          capabilities=FILTER_CAPABILITIES)
        if src.null and binding.info is not None:
            # A null-source lookup of a named subscription (Qpid JMS unsubscribe and reattach): the
            # reply's source is the subscription found, which Qpid JMS requires to be non-null.
            source = dataclasses.replace(source, address=binding.info.address, durability=_UNSETTLED_STATE,
                                         expiry_policy="never", distribution_mode="copy")
        link.set_source(source)
        link.copy_remote_target()
        link.open()
        binding.feed.add_outlet(outlet)
        self._outlet_credit(link)

    def _outcome(self, outlet: Outlet | None, link, dlv) -> None:
        """A client's disposition of a delivery (a pointer) sent on `outlet`'s link (its binding
        is None once the link was dropped)."""
        if outlet is None:
            lib.pn_delivery_settle(dlv)
            return
        outcome = remote_outcome(dlv)
        if outcome is None:
            if not lib.pn_delivery_settled(dlv):
                return  # not a terminal state yet
            # Settled without an outcome: never treat that as accepted.
            outcome = Outcome("released")
        binding = outlet.io_owner
        if binding is not None and not binding.closed:
            binding.feed.on_client_outcome(outlet, dlv, outcome)
            if binding.counters is not None:
                binding.counters.outcome(outcome.kind)
        lib.pn_delivery_settle(dlv)

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
                            self._unsubscribe_on_broker(binding.kept_name, binding.broker_queue)
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
                self._unsubscribe_on_broker(unsubscribing, queue)
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
        inlet = state.inlet
        if inlet is not None:
            state.inlet = None
            inlet.closed = True
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


_UNSETTLED_STATE = 2  # terminus durability: unsettled-state (what Qpid JMS's durable subscriptions ask)


def _kept_source(address: str | None) -> Terminus:
    """The source of a durable subscription found by its name (a null-source attach)."""
    return Terminus(address=address, durability=_UNSETTLED_STATE, expiry_policy="never", distribution_mode="copy")


def _identity(upstream: Any) -> dict:
    """The open frame's properties.  In front of RabbitMQ, its `product` and `version` (RabbitMQ's own
    AMQP 1.0 clients refuse a server that is not RabbitMQ 4 or later: the proxy stands in for it),
    with `broker-filter` naming this daemon's version beside them; otherwise product broker-filter."""
    from .. import __version__

    product = upstream.product
    if product == "RabbitMQ":
        return {t.symbol("product"): product, t.symbol("version"): upstream.version or "",
                t.symbol("broker-filter"): __version__}
    return {t.symbol("product"): "broker-filter", t.symbol("broker-filter"): __version__}


def outlet_presettled_requested(link: Link) -> bool:
    return link.remote_settled_mode

