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

import collections
import dataclasses
import functools
import itertools
import logging
import re
import time
from typing import Any, Callable


from ..amqp import types as t
from ..amqp import CodecError, decode_message, set_message_annotation
from ..amqp.sections import MESSAGE_ANNOTATIONS, encode_section
from ..filters import ORIGIN_ANNOTATION, FilterError, FilterSet, compile_filter_set
from ..security import SaslClientExchange
from .forwarding import RELEASED, Feed, FeedStats, Outcome, Outlet, filter_identity
from . import admission, fanout, introspect, management, sharing, topology
from .refusal import close_link, refuse_link
from .routing import Routing, vhost_asked
from .replicas import PROPERTY as REPLICA_PROPERTY
from ..engine._cproton import lib
from ..engine.container import Typed
from ..engine.splice import splice_target
from ..engine.endpoints import (LOCAL_ACTIVE, LOCAL_CLOSED, LOCAL_UNINIT, REMOTE_CLOSED, Condition, Connection,
                                Delivery, Handler, Link, Session, Terminus)
from .wire import discard, receive, remote_outcome, send, settle_with
from .management import ManagementPair, is_management, refusal
from .upstream import FILTEX_KINDS, ConsumerInfo, ConsumerSpec, ErrorInfo, Passthrough, Upstream, UpstreamDelivery

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
# Offered in the open frame besides the filter capabilities: a sender may attach with a null target
# and address each message by its `properties.to` (see `Relay`).
RELAY_CAPABILITY = "ANONYMOUS-RELAY"
_OFFERED = FILTER_CAPABILITIES + (RELAY_CAPABILITY,)
# At most this many upstream publishers per anonymous-relay link, one per `to` address (an LRU:
# the least recently used idle one is closed when a new address needs one over the limit).
RELAY_PUBLISHERS = 16
# A feed consuming through a queue's owner (`[replicas]`) holds up to this many times
# `limits.upstream_window` beyond its clients' credit.
VIA_WINDOW = 4
RELAY_WINDOW = 1000  # credit an anonymous-relay link keeps granted (messages not yet settled count)
_COORDINATOR = lib.PN_COORDINATOR  # a transaction coordinator target
_FIELD_FILTER = {t.symbol("field"): t.symbol("filter")}  # the error info naming the source filter
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
    if m and getattr(upstream, "binds_exchange_keys", False):
        exchange = m.group(1)
        bindings = [e for e in fs.entries if e.kind in ("direct", "topic") and isinstance(e.text, str)]
        if len(bindings) == 1 and "/" not in bindings[0].text:
            # The exchange applies its own binding semantics, which is what a legacy binding asks for.
            address = f"/exchange/{exchange}/{bindings[0].text}"
            taken.add(id(bindings[0]))
    can_offer = getattr(upstream, "can_offer", None)
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
        if can_offer is not None and can_offer(e):
            offered.append(e)
            keys.add(str(e.key))
    local = fs.subset(lambda e: id(e) not in taken)
    return address, tuple(pushed), local, tuple(offered)


class _Conn:
    """What the proxy keeps on each client connection (`Connection.context`)."""

    __slots__ = ("id", "links", "producers", "closed", "peer", "connection", "management_calls")

    def __init__(self, id: str, connection: Any = None):
        self.id = id
        self.links: set = set()
        self.producers: set = set()  # the links of `links` a client sends on (an inlet or a relay)
        self.closed = False
        self.peer: str | None = None  # the replica that opened it (`[replicas]`), else None
        self.connection = connection
        self.management_calls: Any = None  # its /management requests in flight (`management._Calls`)


class _ClientLink:
    """What the proxy keeps on each client link (`Link.context`)."""

    __slots__ = ("outlet", "inlet", "relay", "place", "fs", "subscription", "unsubscribe", "unsubscribe_queue",
                 "pair", "peer", "unsettled")

    def __init__(self) -> None:
        self.outlet: Outlet | None = None  # a receiving link's place on its feed
        self.inlet: Inlet | None = None  # a sending link's upstream publisher
        self.relay: Relay | None = None  # ... or its anonymous relay
        self.place: _Placement | None = None
        self.fs: FilterSet | None = None  # its filter-set as attached
        self.subscription = False
        self.unsubscribe: str | None = None  # the kept durable subscription a null-source attach names
        self.unsubscribe_queue: str | None = None  # ... or the queue on the broker holding it (`topology`)
        self.pair: Any = None  # a /management link: its `management.ManagementPair`
        self.peer: Any = None  # ... and its upstream link
        self.unsettled: dict | None = None  # ... and the deliveries relayed on it -> their origins


_NO_STATE = _ClientLink()  # what a link the proxy keeps nothing on reads as


def link_state(link: Link) -> _ClientLink:
    """The proxy's record of a client link (made on first use)."""
    state = link.context
    if state is None:
        state = link.context = _ClientLink()
    return state


def _state(link: Link | None) -> _ClientLink:
    """The proxy's record of a client link, or an empty one (never made here)."""
    state = link.context if link is not None else None
    return state if state is not None else _NO_STATE


class _Placement:
    """What a client's receiving link asked for, kept to serve it again on another upstream (a
    queue whose owner changed, see `ProxyServer.rehome`)."""

    __slots__ = ("routed", "wanted", "decision", "caps", "routing_type", "browse", "owned")

    def __init__(self, routed, wanted, decision, caps, routing_type, browse, owned):
        self.routed = routed
        self.wanted = wanted
        self.decision = decision
        self.caps = caps
        self.routing_type = routing_type
        self.browse = browse
        self.owned = owned  # a queue link served by the queue's owner (`[replicas]`)


class FeedBinding:
    """One Feed and its upstream consumer: `FeedIO` for the feed, `ConsumerHandler` for the upstream."""

    def __init__(self, server: "ProxyServer", key: Any, spec: ConsumerSpec, subscription: bool,
                 upstream: Any = None, via: str | None = None):
        self.server = server
        self.key = key
        self.spec = spec
        self.upstream = upstream if upstream is not None else server.upstream
        self.via = via  # the replica owning the queue, through which this feed consumes (None: here)
        if key[0] == "fanout":  # the address's shared upstream subscription (proxy/fanout.py)
            limits = getattr(server.config, "limits", None)
            self.feed = fanout.FanoutFeed(self, window=server.window, buffer=server.window, max_credit=server.max_credit,
                                          log=log.warning,
                                          indexed=getattr(limits, "subscription_index", True),
                                          cache_size=getattr(limits, "index_cache_size", 1024),
                                          counters=server.metrics.shared(spec.address) if server.metrics else None)
        else:
            # Through the owner (replicas): a deeper window, so the owner's link for it runs out of
            # credit less often while the grants cross two hops (a link without credit there gets
            # its messages held, and past the owner's window moved)
            window = server.window * (VIA_WINDOW if via is not None else 1)
            self.feed = Feed(self, subscription=subscription, window=window, max_credit=server.max_credit,
                             recycle=server.recycle and not subscription, token=server.feed_token(),
                             custody=not getattr(self.upstream, "redelivers_in_place", False),
                             log=log.warning)
            # A queue that turns out to be a stream: no link joins this consumer any more (each
            # stream consumer reads every message at an offset of its own)
            self.feed.on_stream = lambda: server.unshare(self, [])
        self.pending: list[Outlet] = []  # attached by clients, waiting for the upstream consumer
        self.ready = False
        self.closed = False
        self.draining = False  # the last link went: waiting for moves in flight before closing
        self.draining_closed = False  # ... and it was closed (not only detached)
        # a durable subscription the proxy keeps across its subscriber's detaches (its name), and the
        # address its subscriber attached to (the source a null-source lookup is answered with)
        self.kept_name: str | None = None
        self.kept_address: str | None = None
        # the queue on the broker (RabbitMQ 4) that holds the durable subscription (`topology`): the
        # subscription outlives this feed, which consumes the queue while its subscriber is attached
        self.broker_queue: str | None = None
        self.consumer = None
        self.info: ConsumerInfo | None = None
        self.evaluated: frozenset = frozenset()  # `_offer_identity` of each offered filter the upstream evaluates
        self.aliases: list = []  # keys of `ProxyServer.feed_aliases` naming this feed
        # Queue links that came while this feed's offered filters awaited the upstream's answer, and
        # would have opened a second upstream consumer on the queue: outlet -> (key, spec); they join
        # this feed if the upstream turns the offers down, else get feeds of their own.
        self.awaiting: dict[Outlet, tuple] = {}
        self.deciding_key: Any = None  # its key in `ProxyServer.deciding` while the answer is awaited
        metrics = server.metrics
        self.counters = metrics.address(spec.address) if metrics is not None else None

    # FeedIO -------------------------------------------------------------
    def send(self, outlet: Outlet, delivery: UpstreamDelivery, data: bytes) -> Any:
        """The client delivery's pointer is its tag in the feed (valid until settled in `_client_outcome`)."""
        if self.counters is not None:
            self.counters.forwarded.inc()
        return send(outlet.io_ref.ptr, self.server.next_tag(), data, outlet.presettled)

    def settle_upstream(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        if self.consumer is not None:
            self.consumer.settle(delivery, outcome)

    def flow_upstream(self, n: int) -> None:
        if self.consumer is not None:
            self.consumer.flow(n)

    def probe(self, answer: Callable[[int | None], None]) -> bool | None:
        """The queue's ready count, if the upstream consumer can be asked (see search.QueueSearch.look)."""
        probe = getattr(self.consumer, "probe", None)
        if probe is None:
            return None if self.consumer is not None else False
        return False if self.closed else probe(answer)

    def recycle(self, delivery: UpstreamDelivery, data: bytes, done: Callable[[bool], None]) -> bool:
        def moved(ok: bool) -> None:
            if not self.closed:
                done(ok)
                if self.draining and self.feed.moving == 0:
                    self.server.finish_feed(self)

        return self.server.recycle_message(self, data, moved)

    def open_own(self, outlet: Outlet, handler: Any) -> Any:
        """FanoutIO: an upstream subscription for one slow link of a shared subscription."""
        name = f"{self.spec.name}|own-{next(self.server._sub_ids)}"
        return self.server.upstream.open_consumer(dataclasses.replace(self.spec, name=name), handler)

    def lost_outlet(self, outlet: Outlet, condition: str, description: str) -> None:
        outlet.io_owner = None
        close_link(outlet.io_ref, condition, description)

    # ConsumerHandler ----------------------------------------------------------
    def on_consumer_ready(self, consumer, info: ConsumerInfo) -> None:
        try:
            self.ready = True
            self.info = info
            if self.spec.offered:
                self.server.offers_decided(self, info.evaluated)
            if isinstance(self.feed, Feed):
                self.feed.whole_grants = bool(getattr(self.upstream, "over_delivers", False))
                self.feed.dead_letters = bool(getattr(self.upstream, "dead_letters_undeliverable", False))
            if info.subscription is False and self.feed.subscription:
                # The upstream says this source is shared: never consume a non-match on it.
                self.feed.subscription = False
                self.feed.custody = not getattr(self.upstream, "redelivers_in_place", False)
            pending, self.pending = self.pending, []
            if info.subscription is True and not self.feed.subscription and self.key[0] == "queue":
                # A subscription taken for a queue (sharing.decide had no word for it): the first
                # link keeps this consumer, the others get subscriptions of their own.
                self.pending = pending[:1]
                self.server.unshare(self, pending[1:])
                pending, self.pending = self.pending, []
            for outlet in pending:
                self.server.complete_outlet(self, outlet)
            if self.feed.subscription and hasattr(consumer, "settle_in_order"):
                # every delivery of a subscription is decided within the feed's window
                consumer.settle_in_order()
        except Exception:
            log.exception("consumer ready handling failed")
            self.server.fail_feed(self, ErrorInfo("amqp:internal-error", "proxy failure attaching upstream"))

    def on_delivery(self, consumer, delivery: UpstreamDelivery) -> None:
        try:
            counters = self.counters
            if counters is None:
                self.feed.on_upstream_delivery(delivery)
                return
            counters.received.inc()
            filtered = self.feed.stats.filtered
            self.feed.on_upstream_delivery(delivery)
            if self.feed.stats.filtered != filtered:
                counters.filtered_out.inc(self.feed.stats.filtered - filtered)
        except Exception:
            log.exception("forwarding a delivery failed")
            self.server.fail_feed(self, ErrorInfo("amqp:internal-error", "proxy failure forwarding a message"))

    def on_consumer_credit(self, consumer, credit: int) -> None:
        if consumer is self.consumer:
            self.feed.on_upstream_credit(credit)

    def on_consumer_closed(self, consumer, error: ErrorInfo | None) -> None:
        try:
            if self.via is not None and consumer is self.consumer and self.server.replica_lost(self, error):
                return  # its links are served elsewhere now
            self.server.fail_feed(self, error or ErrorInfo("amqp:link:detach-forced", "upstream detached"))
        except Exception:
            log.exception("consumer close handling failed")


class Inlet:
    """A client sending link and its upstream publisher."""

    __slots__ = ("link", "ptr", "publisher", "address", "ready", "closed", "conn", "unsettled", "counters",
                 "oversize", "origin", "dynamic")

    def __init__(self, link, address: str, conn: _Conn, counters: Any = None):
        self.counters = counters
        self.link = link
        self.ptr = link.ptr  # its pn_link_t (per message: no property)
        self.address = address
        self.conn = conn
        self.publisher = None
        self.ready = False
        self.closed = False
        self.unsettled = 0
        self.oversize: set = set()  # partial deliveries already over the size limit (pointers)
        self.dynamic: str | None = None  # the node made for a dynamic target (gone with the link)
        # the message-annotations section a message without any gets: the origin annotation alone
        self.origin = encode_section(MESSAGE_ANNOTATIONS, {ORIGIN_ANNOTATION: conn.id})

    # PublisherHandler
    def on_publisher_ready(self, publisher) -> None:
        self.ready = True
        if not self.closed:
            link = self.link
            if self.dynamic is not None:  # the node made for it (gone with the link)
                link.set_target(dataclasses.replace(link.remote_target, address=self.dynamic, dynamic=True))
            else:  # the client's address, even when routed
                link.set_target(Terminus(address=link.remote_target.address))
            link.copy_remote_source()
            link.open()
            self.top_up()

    def on_publisher_credit(self, publisher) -> None:
        self.top_up()

    def on_publisher_closed(self, publisher, error: ErrorInfo | None) -> None:
        if self.closed:
            return
        err = error or ErrorInfo("amqp:link:detach-forced", "upstream detached")
        self.closed = True
        if not self.ready:
            self.link.set_target(Terminus(null=True))
            self.link.open()
        loop = getattr(getattr(publisher, "upstream", None), "loop", None)
        if err.condition == "amqp:resource-deleted" and loop is not None:
            # (the broker removed the node, maybe by a management call of this client's, whose
            # answer the client must see first, as directly: see management.py, Order)
            management.after_calls(self.link.connection, lambda: self._detach(err), loop.call_later)
        else:
            self._detach(err)

    def _detach(self, err: ErrorInfo) -> None:
        if self.link.local_state != LOCAL_CLOSED:
            close_link(self.link, err.condition, err.description)

    def top_up(self) -> None:
        if self.closed or not self.ready or self.publisher is None:
            return
        limit = min(self.publisher.credit, 1000)
        credit = lib.pn_link_credit(self.ptr)
        want = limit - credit - self.unsettled
        # In batches (a flow frame per message would cost an event on both sides per message).
        if want > 0 and (want * 4 >= limit or credit == 0):
            lib.pn_link_flow(self.ptr, want)


class _RelayTarget:
    """One `to` address of an anonymous-relay link and its upstream publisher."""

    __slots__ = ("relay", "address", "publisher", "ready", "closed", "waiting", "in_flight")

    def __init__(self, relay: "Relay", address: str):
        self.relay = relay
        self.address = address
        self.publisher = None
        self.ready = False
        self.closed = False
        self.waiting: list = []  # (data, dlv or None) not yet sent: no publisher / credit yet
        self.in_flight: set = set()  # client deliveries sent upstream, not yet settled

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.in_flight

    def on_publisher_ready(self, publisher) -> None:
        self.ready = True
        self.flush()

    def on_publisher_credit(self, publisher) -> None:
        self.flush()

    def on_publisher_closed(self, publisher, error: ErrorInfo | None) -> None:
        self.closed = True
        self.relay.forget(self)
        err = error or ErrorInfo("amqp:link:detach-forced", "upstream detached")
        description = f"{self.address}: {err.description}" if err.description else self.address
        rejected = Outcome("rejected", error=(err.condition, description))
        pending = [d for _, d in self.waiting] + list(self.in_flight)
        self.waiting.clear()
        self.in_flight.clear()
        for dlv in pending:
            if dlv is not None:
                self.relay.settled(dlv, rejected if not self.ready else RELEASED)

    def send(self, data: bytes, dlv) -> None:
        self.waiting.append((data, dlv))
        self.flush()

    def flush(self) -> None:
        if self.closed or not self.ready or self.publisher is None:
            return
        server = self.relay.server
        while self.waiting and self.publisher.credit > 0:
            data, dlv = self.waiting.pop(0)
            if dlv is None:
                self.publisher.send(data, lambda outcome, a=self.address: server.poke(a))
                continue
            self.in_flight.add(dlv)

            def settled(outcome: Outcome, dlv=dlv) -> None:
                self.in_flight.discard(dlv)
                if outcome.kind == "accepted":
                    server.poke(self.address)
                self.relay.settled(dlv, outcome)

            self.publisher.send(data, settled)


class Relay:
    """A client sending link with a null target (anonymous relay): each message is published to
    its `properties.to` through an upstream publisher kept per address, at most `RELAY_PUBLISHERS`
    of them (least recently used closed first), and settled with the outcome that address gave."""

    def __init__(self, server: "ProxyServer", link, conn: "_Conn"):
        self.server = server
        self.link = link
        self.ptr = link.ptr
        self.conn = conn
        self.closed = False
        self.unsettled = 0
        self.targets: "collections.OrderedDict[str, _RelayTarget]" = collections.OrderedDict()
        self.oversize: set = set()
        self.origin = encode_section(MESSAGE_ANNOTATIONS, {ORIGIN_ANNOTATION: conn.id})

    def top_up(self) -> None:
        if self.closed:
            return
        want = RELAY_WINDOW - lib.pn_link_credit(self.ptr) - self.unsettled
        if want > 0 and (want * 4 >= RELAY_WINDOW or lib.pn_link_credit(self.ptr) == 0):
            lib.pn_link_flow(self.ptr, want)

    def settled(self, dlv, outcome: Outcome) -> None:
        self.unsettled -= 1
        if not self.closed:
            settle_with(dlv, outcome)
            self.top_up()

    def forget(self, target: _RelayTarget) -> None:
        if self.targets.get(target.address) is target:
            del self.targets[target.address]

    def close(self) -> None:
        """The client link went: every publisher closes (no callbacks follow)."""
        self.closed = True
        for target in list(self.targets.values()):
            target.closed = True
            if target.publisher is not None:
                target.publisher.close()
        self.targets.clear()

    def target(self, address: str) -> _RelayTarget:
        target = self.targets.get(address)
        if target is not None:
            self.targets.move_to_end(address)
            return target
        while len(self.targets) >= RELAY_PUBLISHERS:
            victim = next((t for t in self.targets.values() if t.idle), None)
            if victim is None:
                break  # all busy: over the limit for a moment rather than lose messages
            del self.targets[victim.address]
            victim.closed = True
            victim.publisher.close()
        target = _RelayTarget(self, address)
        self.targets[address] = target
        server = self.server
        route = server._route(address)
        upstream_address = route.upstream if route is not None else address
        caps = sharing.upstream_capabilities((), route.routing_type if route is not None else "")
        target.publisher = server.upstream.open_publisher(upstream_address, target, caps)
        return target

    def on_transfer(self, link, dlv) -> None:
        server = self.server
        if not lib.pn_delivery_readable(dlv):
            return
        limit = server._max_message_size
        if lib.pn_delivery_partial(dlv):
            if limit and lib.pn_delivery_pending(dlv) > limit:
                discard(self.ptr)
                self.oversize.add(dlv)
            return
        size = lib.pn_delivery_pending(dlv)
        data = receive(self.ptr, dlv)
        if lib.pn_delivery_aborted(dlv):
            self.oversize.discard(dlv)
            lib.pn_delivery_settle(dlv)
            return
        presettled = bool(lib.pn_delivery_settled(dlv))
        if limit and (dlv in self.oversize or size > limit):
            self.oversize.discard(dlv)
            return self._refuse(dlv, "amqp:resource-limit-exceeded",
                                f"message larger than the {limit} bytes allowed (limits.max_message_size)")
        if self.closed or not server.upstream_up:
            settle_with(dlv, RELEASED)
            return
        try:
            m = decode_message(data, ("properties",))
            to = m.properties.to if m.properties is not None else None
        except Exception as e:
            return self._refuse(dlv, "amqp:decode-error", f"message not decodable: {e}")
        if not to:
            return self._refuse(dlv, "amqp:invalid-field",
                                "properties.to is required on an anonymous-relay link (null target)")
        to = str(to)
        try:
            data = set_message_annotation(data, ORIGIN_ANNOTATION, self.conn.id, self.origin)
        except CodecError as e:
            return self._refuse(dlv, "amqp:decode-error", f"message not decodable: {e}")
        refused = admission.refused(server.upstream, data)  # what would break the shared upstream connection
        if refused is not None:
            return self._refuse(dlv, *refused)
        if presettled:
            lib.pn_delivery_settle(dlv)
            self.target(to).send(data, None)
        else:
            self.unsettled += 1
            self.target(to).send(data, dlv)
        self.top_up()

    def _refuse(self, dlv, condition: str, description: str) -> None:
        settle_with(dlv, Outcome("rejected", error=(condition, description)))
        self.top_up()


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
        self.config = config  # broker_filter.config.Config: address rules, virtual addresses, limits
        self.routing = Routing.from_config(config) if config is not None else None
        self.upstream = upstream
        self.instance = instance
        self.dialect = dialect
        self.window = window
        self.max_credit = max_credit
        self.recycle = recycle
        self.feeds: dict[Any, FeedBinding] = {}
        self._at_address: dict[str | None, set[FeedBinding]] = {}  # the feeds in `feeds` by address
        # queue feeds whose upstream turned their offered filter expressions down, under the key of
        # the same feed without them: any link of the queue may join (its filters stay local)
        self.feed_aliases: dict[Any, FeedBinding] = {}
        self.deciding: dict[Any, FeedBinding] = {}  # queue base key -> the feed whose offers await an answer
        self.connections: dict[str, _Conn] = {}
        self._conn_ids = itertools.count(1)
        self._tags = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._recyclers: dict[str, Any] = {}
        self._feed_ids = itertools.count(1)
        self.draining: set[FeedBinding] = set()  # feeds whose last link went, finishing their moves
        # durable subscriptions kept while their subscriber is detached (an upstream without named
        # subscriptions: RabbitMQ), by name: their upstream consumer stays attached, holding what they
        # select; with the attached ones at most `limits.kept_subscriptions` (`_beyond_kept_limit`)
        self.kept: dict[str, FeedBinding] = {}
        # how long a feed whose last link went waits for its moves in flight
        self.grace = float(getattr(getattr(config, "shutdown", None), "grace_period", 10.0))
        self.stopping = False
        self.refused = 0
        self.upstream_up = False
        self._was_up = False
        self.filter_totals = introspect.FilterTotals()  # the filter counts of links that are gone
        limits = getattr(config, "limits", None)
        self._max_message_size = getattr(limits, "max_message_size", 0) or 0
        self.replicas: Any = None  # proxy.replicas.Replicas when `[replicas]` is configured

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
    def quiesce(self) -> None:
        """Shutdown begins: every feed stops starting moves, pulling and sending (moves in flight
        finish; `moves_in_flight` tells the shutdown when)."""
        self.stopping = True
        for b in list(self.feeds.values()):
            b.feed.stop()

    def _tick(self) -> None:
        """Once a second: queue feeds whose search is over look again after a while (forwarding),
        shared subscriptions publish their index counts (fanout)."""
        try:
            for b in list(self.feeds.values()):
                if not b.closed:
                    b.feed.tick()
        except Exception:
            log.exception("search tick failed")
        if not self.stopping:
            self.upstream.loop.call_later(1.0, self._tick)

    def moves_in_flight(self) -> int:
        return sum(b.feed.moving for b in list(self.feeds.values())) + sum(b.feed.moving for b in self.draining)

    # ---------------------------------------------------------------- stats
    def live_outlets(self) -> list[tuple[str | None, Outlet]]:
        """(address, outlet) of every client link a feed serves, their filter counts up to date."""
        out = []
        for b in list(self.feeds.values()):
            count = getattr(b.feed, "count_filters", None)
            if count is not None:
                count()
            out.extend((b.spec.address, o) for o in b.feed.outlets)
        return out

    def in_process_counts(self, binding: FeedBinding) -> tuple[int, int] | None:
        """(evaluations, matches) of the filters `binding` pushed down to an in-process upstream
        (the embedded broker evaluates them as the proxy's own), or None."""
        counts = getattr(binding.consumer, "filter_counts", None)
        return counts() if counts is not None and binding.spec.filters else None

    def filter_stats(self, top: int) -> tuple[dict, list]:
        """The filter counters by (address, kind), and the `top` costliest filters of live links."""
        live = self.live_outlets()
        feeds = []
        for b in list(self.feeds.values()):
            counts = self.in_process_counts(b)
            if counts is not None:
                feeds.append((b.spec.address, introspect.entries_kind(b.spec.filters), counts))
        return self.filter_totals.totals(live, feeds), introspect.costliest(live, top)

    def links_report(self, limit: int = introspect.LINKS_LIMIT) -> dict:
        """Every client link: its connection, address, filters (where each is evaluated), credit,
        counts and feed (`GET /links`)."""
        now = time.monotonic()
        records: list[dict] = []
        truncated = False
        seen = set()
        for b in list(self.feeds.values()):
            count = getattr(b.feed, "count_filters", None)
            if count is not None:
                count()
            mode = b.key[0]
            feed = {"kind": {"fanout": "shared subscription", "named": "shared named subscription"}.get(
                        mode, "queue" if mode == "queue" and not b.feed.subscription else "own subscription"),
                    "upstream_address": b.spec.address,
                    "links": len(b.feed.outlets),
                    "held": b.feed.stats.held}
            for o in list(b.feed.outlets) + list(b.pending):
                if len(records) >= limit:
                    truncated = True
                    break
                seen.add(o)
                records.append(self._link_record(o, b, feed, now))
        for c in list(self.connections.values()):
            for link in list(c.links):
                state = _state(link)
                inlet, relay = state.inlet, state.relay
                if inlet is None and relay is None:
                    continue
                if len(records) >= limit:
                    truncated = True
                    break
                records.append({"connection": c.id, "container": link.connection.remote_container,
                                "link": link.name, "direction": "publisher",
                                "address": inlet.address if inlet is not None else None,
                                "anonymous_relay": relay is not None, "filters": []})
        return {"links": records, "truncated": truncated, "upstream": self.upstream.name,
                "upstream_connected": self.upstream_up}

    def _link_record(self, o: Outlet, b: FeedBinding, feed: dict, now: float) -> dict:
        link = o.io_ref
        conn = _conn_state(link.connection) if link is not None else None
        fs = _state(link).fs
        local = {id(e) for e in getattr(o.filter, "entries", ())}
        pushed = "embedded broker" if getattr(b.consumer, "filter_counts", None) is not None else "upstream"
        filters = [{"key": str(e.key), "kind": e.kind, "text": e.filter.description,
                    "evaluated": "here" if id(e) in local else pushed}
                   for e in getattr(fs, "entries", ())]
        evaluated, matched = o.evaluated, o.matched
        counts = self.in_process_counts(b)
        if counts is not None and not local and len(b.feed.outlets) <= 1:
            evaluated, matched = counts  # the link's own consumer in the embedded broker
        waiting = now - o.waiting_since if o.waiting_since is not None and o.credit > 0 else 0.0
        return {"connection": conn.id if conn is not None else None,
                "container": link.connection.remote_container if link is not None else None,
                "link": link.name if link is not None else o.name, "direction": "consumer",
                "address": link.remote_source.address if link is not None else b.spec.address,
                "filters": filters, "credit": o.credit, "unsettled": len(o.in_flight),
                "delivered": o.delivered, "evaluated": evaluated, "matched": matched,
                "evaluation_seconds": round(o.eval_ns / 1e9, 6), "waiting_with_credit_seconds": round(waiting, 3),
                "attached": o not in b.pending, "feed": feed}

    def snapshot(self) -> dict:
        """Plain numbers for metrics: per-feed held / starved counts and totals."""
        feeds = []
        for b in list(self.feeds.values()):
            s: FeedStats = b.feed.stats
            feeds.append({
                "address": b.spec.address,
                "mode": "subscription" if b.feed.subscription else "queue",
                "outlets": len(b.feed.outlets),
                "held": s.held,
                "held_peak": s.held_peak,
                "starved": s.starved,
                "blocked": s.blocked,
                "delivered": s.delivered,
                "filtered": s.filtered,
                "recycled": s.recycled,
                "moving": s.moving,
                "passes": s.passes,
                "handed_back": s.handed_back,
                "redelivered": s.redelivered,
                "waited": b.feed.longest_wait(),
                "undecodable": s.undecodable,
                "too_large": s.too_large,
            })
        links = {"consumer": 0, "producer": 0}
        credit: dict[str, int] = {}
        for b in self.feeds.values():
            links["consumer"] += len(b.feed.outlets)
            a = b.spec.address or ""
            credit[a] = credit.get(a, 0) + sum(o.credit for o in b.feed.outlets)
        links["upstream-consumer"] = len(self.feeds)
        for c in self.connections.values():  # (once a second with metrics on: no walk over every link)
            links["producer"] += len(c.producers)
        links["upstream-producer"] = links["producer"]
        return {
            "links": links,
            "credit": credit,
            "connections": len(self.connections),
            "upstream_connected": self.upstream_up,
            "feeds": feeds,
            "held": sum(f["held"] for f in feeds),
            "starved": sum(f["starved"] for f in feeds),
            "moving": self.moves_in_flight(),
            "refused": self.refused,
        }

    # ---------------------------------------------------------------- upstream listener
    def on_upstream_up(self, upstream) -> None:
        if self.metrics is not None and self._was_up:
            self.metrics.upstream_reconnected(getattr(upstream, "lost_cause", None))
        if not self._was_up:
            self.upstream.loop.call_later(1.0, self._tick)
        self._was_up = True
        self.upstream_up = True
        self._recyclers.clear()

    def on_upstream_down(self, upstream, error: ErrorInfo) -> None:
        self.upstream_up = False
        self._recyclers.clear()
        if self.replicas is not None:
            # A replica without its upstream owns nothing: the others see it gone and take over.
            for c in list(self.connections.values()):
                if c.peer is not None and c.connection is not None:
                    c.connection.close(Condition("amqp:connection:forced",
                                                 f"upstream {self.upstream.name} is not connected"))
        for b in list(self.feeds.values()):
            if b.via is None:  # a feed consuming through a queue's owner does not use this upstream
                self.fail_feed(b, error)

    # ---------------------------------------------------------------- connections
    @boundary
    def on_connection_open(self, conn: Connection) -> None:
        limits = getattr(self.config, "limits", None)
        if limits is not None and len(self.connections) >= limits.connections:
            conn.open()
            conn.close(Condition("amqp:resource-limit-exceeded",
                                 f"the proxy accepts at most {limits.connections} connections"))
            if self.metrics is not None:
                self.metrics.refuse_connection("limit")
            return
        asked = vhost_asked(conn.remote_hostname)
        served = getattr(self.upstream, "vhost", None)
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
        if self.replicas is not None:
            props = conn.remote_properties
            peer = props.get(REPLICA_PROPERTY) if isinstance(props, dict) else None
            if peer is not None and not self.upstream_up:
                # not a live replica while its upstream is down: the peer asks again a second later
                conn.open()
                conn.close(Condition("amqp:connection:forced", f"upstream {self.upstream.name} is not connected"))
                return
        if self.metrics is not None:
            self.metrics.connections_accepted.inc()
        cid = f"{self.instance}/{next(self._conn_ids)}"
        state = conn.context = _Conn(cid, conn)
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
        c = _conn_state(conn)
        if c is None or c.closed:
            return
        c.closed = True
        for link in _links(conn):
            self._drop_link(link)
        self.connections.pop(c.id, None)

    # ---------------------------------------------------------------- links
    @boundary
    def on_link_open(self, link: Link) -> None:
        if link.local_state != LOCAL_UNINIT:
            return
        conn = _conn_state(link.connection)
        if conn is None:
            self._refuse(link, "amqp:resource-limit-exceeded", "connection not accepted")
            return
        limits = getattr(self.config, "limits", None)
        if limits is not None and len(conn.links) >= limits.links_per_connection:
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
            ManagementPair.serve(self.upstream, link, self._route_link)
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
        state = _state(link)
        if state.pair is not None:
            state.pair._client_credit(link)
        elif link.is_sender:
            self._outlet_credit(link)

    def _outlet_credit(self, link: Link) -> None:
        outlet = _state(link).outlet
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
        # (the proxy's links are routed: their transfers go to `_outcome`, `_publish` and the
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

    def _refuse(self, link, condition: str, description: str, info: dict | None = None, *,
                reason: str | None = None, level: int = logging.INFO) -> None:
        """Refuse `link`'s attach, counted under `reason` (by default the condition's)."""
        self.refused += 1
        if self.metrics is not None:
            self.metrics.refuse_attach(reason or _REFUSAL_REASONS.get(condition, "other"))
        refuse_link(link, condition, description, info)
        log.log(level, "refused link %r: %s: %s", link.name, condition, description)

    # ---------------------------------------------------------------- receiving (outlets)
    def _attach_outlet(self, link, conn: _Conn) -> None:
        src = link.remote_source
        address = src.address
        raw = src.filter  # (one proton could not read was refused in `on_link_open`)
        if raw is not None and not isinstance(raw, dict):
            self._refuse(link, "amqp:invalid-field", "the source filter must be a map (a filter-set)", _FIELD_FILTER)
            return
        if src.dynamic and not address and not getattr(self.upstream, "dynamic_sources", False):
            # (RabbitMQ 3.10 and 4.0 answer a dynamic source by ending the whole session.)
            self._refuse(link, "amqp:not-implemented",
                         f"dynamic sources are not supported by upstream {self.upstream.name}")
            return
        if src.null and not getattr(self.upstream, "named_subscriptions", False):
            # Qpid JMS's unsubscribe (a null source, the subscription's link name): the durable
            # subscription the proxy keeps under that name, if any.
            self._look_up_kept(link, conn)
            return
        route = self._route(address)
        caps = src.capabilities
        routed = route.upstream if route is not None else address
        copy = src.distribution_mode == "copy"
        decision = sharing.decide(address=routed, capabilities=caps, copy=copy,
                                  rule_routing_type=route.routing_type if route is not None else "",
                                  upstream=self.upstream)
        subscription = decision.subscription
        # A browser: copy on a queue (Qpid JMS QueueBrowser: copy and the `queue` capability); copy
        # with `topic` is a subscription (Qpid JMS durable subscribers ask for copy too)
        browse = copy and "topic" not in caps and (
            "queue" in caps
            or sharing.ANYCAST in (sharing.address_form_routing(routed), self.upstream.routing_type(routed, caps)))
        owned = (self.replicas is not None and conn.peer is None and routed is not None and not subscription
                 and not browse and not src.dynamic)
        if owned and self.upstream_up and self._splicing(conn) and self._splice(link, routed):
            return  # (its filter is the owner's to compile, or to refuse)
        try:
            if self.config is not None:
                fs = compile_filter_set(raw or {}, dialect=self.dialect, limits=self.config.limits.filter_limits(),
                                        max_depth=self.config.limits.nesting_depth)
            else:
                fs = compile_filter_set(raw or {}, dialect=self.dialect)
            # A virtual address's filter (compiled once, by the routing) AND the
            # client's own: one filter-set, pushed down as far as the upstream filters.
            wanted = route.virtual.combine(fs) if route is not None and route.virtual else fs
        except FilterError as e:
            self._refuse(link, e.condition, e.describe(), _FIELD_FILTER)
            return
        if not self.upstream_up:
            self._refuse(link, "amqp:connection:forced", f"upstream {self.upstream.name} is not connected; retry later")
            return
        if browse and not getattr(self.upstream, "browses_queues", False):
            self._refuse(link, "amqp:not-implemented",
                         f"browsing a queue (distribution-mode copy) is not supported in front of {self.upstream.name}: "
                         "attach without distribution-mode copy to consume from it")
            return
        state = link_state(link)
        state.fs = fs
        state.subscription = subscription
        outlet = Outlet(f"{conn.id}:{link.name}", wanted, conn.id, io_ref=link,
                        max_size=link.remote_max_message_size)
        state.outlet = outlet
        conn.links.add(link)
        self._route_link(link, functools.partial(self._outcome, outlet))
        if outlet_presettled_requested(link):
            link.set_snd_settle_mode(True)
            outlet.presettled = True
        state.place = _Placement(routed, wanted, decision, caps, route.routing_type if route is not None else "",
                                 browse, owned)
        self._place(link, outlet)

    def _splicing(self, conn: _Conn) -> bool:
        """Whether a client connection's first link may splice it (`replicas.splice`)."""
        return (self.replicas is not None and conn.peer is None
                and bool(getattr(getattr(self.config, "replicas", None), "splice", False)))

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

    def _look_up_kept(self, link, conn: _Conn) -> None:
        """A null-source attach names a durable subscription (Qpid JMS's unsubscribe): answered with
        the kept subscription's source (Qpid JMS requires one); closing the link ends it.  In front
        of RabbitMQ 4 the subscription is looked for on the broker as well (`_hold_on_broker`)."""
        name = sharing.kept_name(link.name, link.connection.remote_container)
        binding = self.kept.get(name) if name is not None else None
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

    def _answer_lookup(self, link, conn: _Conn, name: str, address: str | None) -> None:
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
        state = _state(link)
        p: _Placement = state.place
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
        if fs.ignored and getattr(upstream, "passes_unknown_filters", False):
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
            container_id=link.connection.remote_container,
            offered=offered,
            passthrough=passthrough,
        )
        # The offered filters are in the key: links on one upstream consumer ask it the same.
        # A durable subscription (shared or not) in front of an upstream without named
        # subscriptions: the proxy keeps it across its subscribers' detaches, as a queue on the
        # broker (RabbitMQ 4, `_hold_on_broker`), else with its upstream consumer left attached.
        kept = (subscription and via is None and not browse and not spec.dynamic
                and not getattr(upstream, "named_subscriptions", False))
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
                existing = self.feeds.get(key)
                if existing is None or existing.closed:
                    self._hold_on_broker(pair, link, outlet, key, spec, kept_name, held, up_address, local)
                    return
                kept_name = None  # (attached already: the link joins that feed, below)
        if kept_name is not None:
            if self._beyond_kept_limit(link, kept_name):
                return
            old = self.kept.pop(kept_name, None)
            if old is not None and old.key != key:
                # JMS: subscribing again under the name with another selector or topic replaces it
                log.info("durable subscription %r resubscribed with another address or selector: the "
                         "one kept is ended", kept_name)
                self._end_feed(old, closed=True)
        if browse:  # a browser reads the queue from its head on an upstream consumer of its own
            key = ("subscription", next(self._sub_ids))
        if via is not None:  # consuming through the queue's owner: not the feed of one consuming here
            key = key + (("via", via),)
        binding = self.feeds.get(key)
        base = None
        if (binding is None or binding.closed) and not decision.subscription:
            # A feed whose upstream turned the offered filters down serves every link of its queue.
            base = sharing.feed_key(decision, address=up_address, pushed=pushed, local=local, serial=0)
            if via is not None:
                base = base + (("via", via),)
            binding = self.feeds.get(base) or self.feed_aliases.get(base)
            if binding is None or binding.closed:
                # One whose answer is not in yet: wait for it rather than open a second upstream
                # consumer on the queue, which would hold a share of its messages out of reach.
                deciding = self.deciding.get(base)
                if deciding is not None and not deciding.closed:
                    outlet.io_owner = deciding
                    deciding.pending.append(outlet)
                    deciding.awaiting[outlet] = (key, spec)
                    return
        if binding is None or binding.closed:
            opened = self._open_feed(key, spec, subscription, outlet, upstream, via)
            opened.kept_name, opened.kept_address = kept_name, src.address
            if offered and base is not None and base not in self.deciding:
                self.deciding[base] = opened
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
        for k, b in self.feeds.items():
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
        state = _state(link)
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
            binding = self.feeds.get(key)
            if binding is not None and not binding.closed:
                self._join(binding, outlet)
                return
            consumed = dataclasses.replace(spec, address=topology.consume_address(self.upstream, queue), capabilities=(),
                                           distribution_mode=None, durable=None, expiry_policy=None)
            opened = self._open_feed(key, consumed, True, outlet, self.upstream)
            opened.kept_name, opened.kept_address, opened.broker_queue = kept_name, address, queue

        topology.ensure_subscription_queue(pair, queue, binding_key, arguments, ready)

    def _beyond_kept_limit(self, link, name: str) -> bool:
        """A new durable subscription the daemon would keep (`name`: not attached nor kept now) while
        it already has `limits.kept_subscriptions` of them, attached or kept: refused at its attach,
        so that no subscriber's detach ever needs one more kept than the limit and none kept is
        dropped.  True if refused."""
        limit = getattr(getattr(self.config, "limits", None), "kept_subscriptions", 0) or 0
        if not limit or name in self.kept:
            return False
        names = {b.kept_name for b in self.feeds.values()
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

    def _open_feed(self, key: Any, spec: ConsumerSpec, subscription: bool, outlet: Outlet,
                   upstream: Any = None, via: str | None = None) -> FeedBinding:
        binding = FeedBinding(self, key, spec, subscription, upstream, via)
        if self.stopping:
            binding.feed.stop()
        self._register(binding)
        binding.pending.append(outlet)
        outlet.io_owner = binding
        binding.consumer = binding.upstream.open_consumer(spec, binding)
        return binding

    # ---------------------------------------------------------------- replicas
    def owners_changed(self) -> None:
        """The live replicas changed (`proxy.replicas`): queue links whose queue has another owner
        now are served there."""
        if self.stopping or self.replicas is None:
            return
        seen: set[int] = set()
        for b in list(self.feeds.values()) + list(self.feed_aliases.values()):
            if id(b) in seen or b.closed:
                continue
            seen.add(id(b))
            moving = [o for o in list(b.feed.outlets) + list(b.pending) if self._moves(o, b)]
            if moving:
                self.rehome(b, moving)

    def _moves(self, outlet: Outlet, binding: FeedBinding) -> bool:
        p = _state(outlet.io_ref).place
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
                 self.replicas.owner(_state(outlets[0].io_ref).place.routed) or "nobody")
        for o in outlets:
            if o in binding.pending:
                binding.pending.remove(o)
            binding.feed.remove_outlet(o)
            o.io_owner = None
        if not binding.feed.outlets and not binding.pending:
            self._unregister(binding)
            binding.feed.stop()
            binding.draining = True
            if binding.feed.moving == 0:
                self.finish_feed(binding)
            else:
                self.draining.add(binding)
                self.upstream.loop.call_later(self.grace, lambda b=binding: self.finish_feed(b))
        for o in outlets:
            link = o.io_ref
            if link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED or _state(link).outlet is not o:
                continue
            o.in_flight.clear()
            o.waiting_since = None
            self._place(link, o)

    def feeds_at(self, address: str | None) -> list[FeedBinding]:
        """The registered feeds of `address` (a copy: what is done with them may change them)."""
        return list(self._at_address.get(address, ()))

    def _register(self, binding: FeedBinding) -> None:
        self.feeds[binding.key] = binding
        self._at_address.setdefault(binding.spec.address, set()).add(binding)

    def _unregister(self, binding: FeedBinding) -> None:
        """No link may join `binding` any more."""
        if self.feeds.get(binding.key) is binding:
            del self.feeds[binding.key]
            same = self._at_address.get(binding.spec.address)
            if same is not None:
                same.discard(binding)
                if not same:
                    del self._at_address[binding.spec.address]
        for key in binding.aliases:
            if self.feed_aliases.get(key) is binding:
                del self.feed_aliases[key]
        binding.aliases = []

    def offers_decided(self, binding: FeedBinding, evaluated: tuple) -> None:
        """The attach reply of a feed that offered filter expressions: the ones it evaluates are no
        longer evaluated here (for every link of the feed: they share its key, so its filters); when
        it evaluates none, the feed serves every link of its queue (an alias key without them)."""
        binding.evaluated = frozenset(_offer_identity(e) for e in evaluated)
        kept = [e for e in binding.spec.offered if _offer_identity(e) not in binding.evaluated]
        if self.metrics is not None:
            for e in evaluated:
                self.metrics.filter_pushdown.labels(kind=e.kind, result="upstream").inc()
            for e in kept:
                self.metrics.filter_pushdown.labels(kind=e.kind, result="local").inc()
        log.info("upstream %s evaluates %s on %s; %s evaluated here", self.upstream.name,
                 ", ".join(f"{e.kind} filter {e.key!s}" for e in evaluated) or "no filter expression",
                 binding.spec.address, ", ".join(f"{e.kind} filter {e.key!s}" for e in kept) or "none offered")
        serves_all = False
        if not evaluated and binding.key[0] == "queue" and binding.via is None:
            base = sharing.feed_key(sharing.Decision(sharing.QUEUE, "offers turned down"), address=binding.spec.address,
                                    pushed=binding.spec.filters, local=None, serial=0)
            if self.feeds.get(base) is None and self.feed_aliases.get(base) is None:
                self.feed_aliases[base] = binding
                binding.aliases.append(base)
            serves_all = self.feed_aliases.get(base) is binding
        self._decided(binding, serves_all)

    def _decided(self, binding: FeedBinding, joins: bool) -> None:
        """The links that waited for `binding`'s answer (`FeedBinding.awaiting`) stay with it when it
        serves every link of its queue (`joins`), else get feeds of their own."""
        if binding.deciding_key is not None and self.deciding.get(binding.deciding_key) is binding:
            del self.deciding[binding.deciding_key]
        binding.deciding_key = None
        awaiting, binding.awaiting = binding.awaiting, {}
        if joins:
            return
        for outlet, (key, spec) in awaiting.items():
            if outlet in binding.pending:
                binding.pending.remove(outlet)
                self._open_feed(key, spec, False, outlet, binding.upstream, binding.via)

    def unshare(self, binding: FeedBinding, outlets: list[Outlet]) -> None:
        """The upstream says `binding`'s source is a subscription the proxy took for a queue: no
        link may join it any more, and the links that were waiting for it get feeds of their own."""
        self._unregister(binding)
        binding.key = ("subscription", next(self._sub_ids))
        self._register(binding)
        binding.feed.subscription = True
        binding.feed.recycle = False
        binding.feed.custody = False
        for outlet in binding.pending:
            link_state(outlet.io_ref).subscription = True
        for outlet in outlets:
            link = outlet.io_ref
            link_state(link).subscription = True
            spec = dataclasses.replace(binding.spec, name=link.name)
            self._open_feed(("subscription", next(self._sub_ids)), spec, True, outlet)

    def complete_outlet(self, binding: FeedBinding, outlet: Outlet) -> None:
        link = outlet.io_ref
        if link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED:
            return
        if binding.evaluated:
            # What the upstream evaluates for this feed is not evaluated again here.
            outlet.filter = outlet.filter.subset(lambda e: _offer_identity(e) not in binding.evaluated)
            outlet.identity = filter_identity(outlet.filter, outlet.receiver)
        if link.local_state == LOCAL_ACTIVE:  # attached before: moved to its queue's new owner
            binding.feed.add_outlet(outlet)
            self._outlet_credit(link)
            return
        state = _state(link)
        fs: FilterSet = state.fs
        src = link.remote_source
        address, dynamic = src.address, False
        if src.dynamic and not src.address:
            info = getattr(binding, "info", None)
            address = info.address if info is not None else None
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

    def fail_feed(self, binding: FeedBinding, error: ErrorInfo) -> None:
        if binding.closed:
            return
        binding.closed = True
        if binding.kept_name is not None and self.kept.get(binding.kept_name) is binding:
            del self.kept[binding.kept_name]
            log.warning("durable subscription %r kept for a detached subscriber is lost: %s", binding.kept_name,
                        error.description)
        self.draining.discard(binding)
        self._unregister(binding)
        if binding.deciding_key is not None and self.deciding.get(binding.deciding_key) is binding:
            del self.deciding[binding.deciding_key]
        outlets = list(binding.feed.outlets) + binding.pending
        binding.pending = []
        binding.feed.close()
        if binding.consumer is not None:
            binding.consumer.close()
        self._forget_recycler(binding.spec.address)
        for o in outlets:
            link = o.io_ref
            o.io_owner = None
            if link.local_state == LOCAL_UNINIT:
                self._refuse(link, error.condition, error.description or "upstream refused", error.info)
            else:
                close_link(link, error.condition, error.description, error.info)

    def _client_outcome(self, link, dlv) -> None:
        """A client's disposition of a delivery (a pointer) sent on an outlet, not routed (see
        `_route_link`)."""
        self._outcome(_state(link).outlet, link, dlv)

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
    def _attach_inlet(self, link, conn: _Conn) -> None:
        if link.remote_target_type == _COORDINATOR:
            self._refuse(link, "amqp:not-implemented", "transactions are not supported")
            return
        address = link.remote_target.address
        dynamic = None
        if address is None and link.remote_target.dynamic:
            # A dynamic target (Qpid JMS's temporary queue: capability temporary-queue): a node of
            # its own, named in the reply, gone with this link.
            if not getattr(self.upstream, "dynamic_sources", False) or not self.upstream_up:
                self._refuse(link, "amqp:not-implemented",
                             f"dynamic targets (temporary queues) are not supported by upstream {self.upstream.name}")
                return
            address = dynamic = self.upstream.declare_dynamic_target()
        elif address is None:
            self._attach_relay(link, conn)
            return
        route = self._route(address)
        if route is not None:
            address = route.upstream
        caps = sharing.upstream_capabilities(link.remote_target.capabilities,
                                             route.routing_type if route is not None else "")
        if not self.upstream_up:
            self._refuse(link, "amqp:connection:forced", f"upstream {self.upstream.name} is not connected; retry later")
            return
        if (dynamic is None and self._splicing(conn)
                and not sharing.decide(address=address, capabilities=link.remote_target.capabilities,
                                       rule_routing_type=route.routing_type if route is not None else "",
                                       upstream=self.upstream).subscription
                and self._splice(link, address)):
            return  # (a producer on a queue: its publishes are the owner's, who consumes the queue)
        inlet = Inlet(link, address, conn, self.metrics.address(address) if self.metrics is not None else None)
        inlet.dynamic = dynamic
        link_state(link).inlet = inlet
        if self.max_message_size:
            link.set_max_message_size(self.max_message_size)  # advertised in the attach reply
        conn.links.add(link)
        conn.producers.add(link)
        self._route_link(link, functools.partial(self._publish, inlet))
        inlet.publisher = self.upstream.open_publisher(address, inlet, caps, durable=link.remote_target.durability)

    def _attach_relay(self, link, conn: _Conn) -> None:
        """A sending link with a null target: each message goes to its `properties.to`."""
        if not self.upstream_up:
            self._refuse(link, "amqp:connection:forced", f"upstream {self.upstream.name} is not connected; retry later")
            return
        relay = Relay(self, link, conn)
        link_state(link).relay = relay
        if self.max_message_size:
            link.set_max_message_size(self.max_message_size)
        conn.links.add(link)
        conn.producers.add(link)
        self._route_link(link, relay.on_transfer)
        link.set_target(Terminus())  # a target without an address: the anonymous relay
        link.copy_remote_source()
        link.open()
        relay.top_up()

    @property
    def max_message_size(self) -> int:
        return self._max_message_size

    def _client_publish(self, link, dlv) -> None:
        """A client's transfer (a delivery pointer) on an inlet, not routed (see `_route_link`)."""
        state = _state(link)
        if state.relay is not None:
            state.relay.on_transfer(link, dlv)
            return
        self._publish(state.inlet, link, dlv)

    def _publish(self, inlet: Inlet | None, link, dlv) -> None:
        """A client's transfer (a delivery pointer) on `inlet`'s link."""
        if not lib.pn_delivery_readable(dlv):
            return
        limit = self._max_message_size
        if lib.pn_delivery_partial(dlv):
            if limit and lib.pn_delivery_pending(dlv) > limit:
                # Too large already: drop what arrived (memory stays bounded), refuse once complete.
                discard(link.ptr)
                if inlet is not None:
                    inlet.oversize.add(dlv)
            return
        size = lib.pn_delivery_pending(dlv)
        data = receive(link.ptr, dlv)
        if lib.pn_delivery_aborted(dlv):
            if inlet is not None:
                inlet.oversize.discard(dlv)
            lib.pn_delivery_settle(dlv)
            return
        if limit and ((inlet is not None and dlv in inlet.oversize) or size > limit):
            if inlet is not None:
                inlet.oversize.discard(dlv)
            settle_with(dlv, Outcome("rejected", error=(
                "amqp:resource-limit-exceeded",
                f"message larger than the {limit} bytes allowed (limits.max_message_size)")))
            if inlet is not None:
                inlet.top_up()
            return
        if inlet is None or inlet.closed or inlet.publisher is None:
            settle_with(dlv, RELEASED)
            return
        try:
            data = set_message_annotation(data, ORIGIN_ANNOTATION, inlet.conn.id, inlet.origin)
        except CodecError as e:
            settle_with(dlv, Outcome("rejected", error=("amqp:decode-error", f"message not decodable: {e}")))
            inlet.top_up()
            return
        refused = admission.refused(self.upstream, data)  # what would break the shared upstream connection
        if refused is not None:
            settle_with(dlv, Outcome("rejected", error=refused))
            inlet.top_up()
            return
        if inlet.counters is not None:
            inlet.counters.published.inc()
        if lib.pn_delivery_settled(dlv):  # sent pre-settled: at most once, nothing to report
            lib.pn_delivery_settle(dlv)
            inlet.publisher.send(data, lambda outcome, address=inlet.address: self.poke(address))
        else:
            inlet.unsettled += 1

            def settled(outcome: Outcome, dlv=dlv, inlet=inlet) -> None:
                inlet.unsettled -= 1
                if outcome.kind == "accepted":
                    self.poke(inlet.address)
                if not inlet.closed:  # (else the link, and the delivery with it, may be gone)
                    settle_with(dlv, outcome)
                    inlet.top_up()

            inlet.publisher.send(data, settled)
        inlet.top_up()

    def _route(self, address: str | None) -> Any:
        if self.routing is None or address is None:
            return None
        return self.routing.route(address)

    # ---------------------------------------------------------------- recycling
    def recycle_message(self, binding: FeedBinding, data: bytes, done: Callable[[bool], None]) -> bool:
        """Publish a moved copy (see forwarding) to the tail of its queue; False if the publisher
        has no credit yet (its credit pumps the address's feeds)."""
        address = binding.spec.address
        rec = self._recyclers.get(address)
        if rec is None or rec.closed:
            rec = _Recycler(self, address)
            self._recyclers[address] = rec
            rec.publisher = self.upstream.open_publisher(address, rec, durable=binding.spec.durable)
        if not rec.ready or rec.publisher.credit <= 0:
            return False
        rec.send(data, done)
        return True

    def poke(self, address: str) -> None:
        """A client published to `address` through the proxy: its queue feeds search once more."""
        for b in self.feeds_at(address):
            if not b.closed:
                b.feed.poke()

    def finish_feed(self, binding: FeedBinding) -> None:
        """The moves of a feed whose last link went are done (or the grace is over): return what it
        holds by ending its upstream consumer."""
        if binding in self.draining:
            self.draining.discard(binding)
        if not binding.closed:
            counts = self.in_process_counts(binding)
            if counts is not None:
                self.filter_totals.retire_feed(binding.spec.address, introspect.entries_kind(binding.spec.filters),
                                               counts)
        if binding.closed:
            return
        if binding.feed.moving:
            log.warning("shutdown grace over with %d moves to %s in flight: their originals go back to the queue "
                        "beside copies the broker may accept", binding.feed.moving, binding.spec.address)
        binding.closed = True
        returns = getattr(binding.feed, "returns", None)
        returns = returns() if returns is not None else ()
        binding.feed.close()
        if binding.consumer is not None:
            for delivery, outcome in returns:  # unacquired (3.2.1), or modified with a client's annotations
                binding.consumer.settle(delivery, outcome)
            binding.consumer.close(closed=binding.draining_closed)
        self._forget_recycler(binding.spec.address)

    def _end_feed(self, binding: FeedBinding, closed: bool) -> None:
        """The last link of `binding` went: no move starts; the ones in flight finish (their
        originals are accepted), bounded by the shutdown grace; then what is held goes back."""
        self._unregister(binding)
        binding.feed.stop()
        binding.draining = True
        binding.draining_closed = closed
        if binding.feed.moving == 0:
            self.finish_feed(binding)
        else:
            self.draining.add(binding)
            self.upstream.loop.call_later(self.grace, lambda b=binding: self.finish_feed(b))

    def _forget_recycler(self, address: str | None) -> None:
        """Close the recycling publisher of an address no feed uses any more."""
        if self._at_address.get(address):
            return
        if any(b.spec.address == address for b in self.draining):
            return
        rec = self._recyclers.pop(address, None)
        if rec is not None and rec.publisher is not None:
            rec.closed = True
            rec.publisher.close()

    # ---------------------------------------------------------------- cleanup
    def _drop_link(self, link, closed: bool = False) -> None:
        c = _conn_state(link.connection)
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
                        self._end_feed(binding, closed)
                        if closed:
                            self._unsubscribe_on_broker(binding.kept_name, binding.broker_queue)
                    elif binding.kept_name is not None and not closed and not self.stopping and self.upstream_up:
                        # A durable subscriber detached without closing (JMS consumer.close()): the
                        # subscription stays, its upstream consumer attached, until it comes back,
                        # unsubscribes, or the upstream connection goes.
                        self.kept[binding.kept_name] = binding
                        log.info("durable subscription %r kept while its subscriber is detached (%s)",
                                 binding.kept_name, binding.spec.address)
                    else:
                        self._end_feed(binding, closed)
        unsubscribing = state.unsubscribe
        if state.unsubscribe_queue is not None:
            queue, state.unsubscribe_queue = state.unsubscribe_queue, None
            if closed and unsubscribing is not None:  # (answered: found on the broker)
                self._unsubscribe_on_broker(unsubscribing, queue)
        if unsubscribing is not None:
            state.unsubscribe = None
            binding = self.kept.get(unsubscribing)
            if closed and binding is not None:
                del self.kept[unsubscribing]
                log.info("durable subscription %r unsubscribed", unsubscribing)
                self._end_feed(binding, closed=True)
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


class _Recycler:
    """The publisher of moved copies to one address.  A move whose publisher goes before the broker
    settled it counts as not done (its original is held again)."""

    def __init__(self, server: ProxyServer, address: str):
        self.server = server
        self.address = address
        self.publisher = None
        self.ready = False
        self.closed = False
        self.pending: dict[int, Callable[[bool], None]] = {}
        self._ids = itertools.count(1)

    def send(self, data: bytes, done: Callable[[bool], None]) -> None:
        n = next(self._ids)
        self.pending[n] = done

        def settled(outcome: Outcome) -> None:
            cb = self.pending.pop(n, None)
            if cb is not None:
                cb(outcome.kind == "accepted")

        self.publisher.send(data, settled)

    def on_publisher_ready(self, publisher) -> None:
        self.ready = True

    def on_publisher_credit(self, publisher) -> None:
        for b in self.server.feeds_at(self.address):
            if not b.closed and b.feed.held:
                b.feed.pump()

    def on_publisher_closed(self, publisher, error) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for done in pending.values():
            done(False)


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

    product = getattr(upstream, "product", None)
    if product == "RabbitMQ":
        return {t.symbol("product"): product, t.symbol("version"): getattr(upstream, "version", None) or "",
                t.symbol("broker-filter"): __version__}
    return {t.symbol("product"): "broker-filter", t.symbol("broker-filter"): __version__}


def _offer_identity(entry: Any) -> tuple:
    """An offered filter as the links of one feed all have it (their entries are objects of their own)."""
    return (entry.kind, str(entry.key), repr(entry.value))


def outlet_presettled_requested(link: Link) -> bool:
    return link.remote_settled_mode


def _conn_state(conn: Connection | None) -> _Conn | None:
    return conn.context if conn is not None else None


def _links(conn: Connection) -> list[Link]:
    return [link for session in list(conn.sessions) for link in list(session.links)]
