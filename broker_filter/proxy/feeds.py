"""The feeds of a proxy server: each an upstream consumer (`FeedBinding`) serving the client links that
share it, and the registry that owns them.

Theory of operation
-------------------
A `FeedBinding` is one `forwarding.Feed` (or `fanout.FanoutFeed`) and its upstream consumer: the
feed's I/O (`send`, `settle_upstream`, `flow_upstream`, `recycle`...) on one side, the upstream
consumer's handler (`on_consumer_ready`, `on_delivery`, ...) on the other.  The `FeedRegistry`
owns every feed of the server by its key (`sharing.feed_key`) and by address, the aliases of queue
feeds whose upstream turned offered filters down, the feeds whose offers await an answer, the
feeds draining their moves after their last link went, the durable subscriptions kept for
detached subscribers, and the publishers of moved copies (`Recycler`).  A feed changes state only
through the registry's methods (`register`, `unregister`, `unshare`, `fail_feed`, `end_feed`,
`finish_feed`), each named for the event that calls it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any, Callable

from . import fanout, introspect, reports, sharing, topology
from .custody import FeedIO
from .forwarding import Feed, Outcome, Outlet
from .records import link_state
from .refusal import close_link
from .upstream import ConsumerHandler, ConsumerInfo, ConsumerSpec, ErrorInfo, PublisherHandler, UpstreamDelivery
from .wire import send
from ..engine import heap
from ..engine.endpoints import LOCAL_UNINIT

log = logging.getLogger("broker_filter.proxy")

# A feed consuming through a queue's owner (`[replicas]`) holds up to this many times
# `limits.upstream_window` beyond its clients' credit.
VIA_WINDOW = 4


class FeedBinding(FeedIO, ConsumerHandler):
    """One Feed and its upstream consumer: `FeedIO` for the feed, `ConsumerHandler` for the upstream."""

    def __init__(self, server: Any, key: Any, spec: ConsumerSpec, subscription: bool,
                 upstream: Any = None, via: str | None = None):
        self.server = server
        self.key = key
        self.spec = spec
        self.upstream = upstream if upstream is not None else server.upstream
        self.via = via  # the replica owning the queue, through which this feed consumes (None: here)
        if key[0] == "fanout":  # the address's shared upstream subscription (proxy/fanout.py)
            limits = server.config.limits
            self.feed = fanout.FanoutFeed(self, window=server.window, buffer=server.window, max_credit=server.max_credit,
                                          log=log.warning,
                                          indexed=limits.subscription_index,
                                          cache_size=limits.index_cache_size,
                                          counters=server.metrics.shared(spec.address) if server.metrics else None)
        else:
            # Through the owner (replicas): a deeper window, so the owner's link for it runs out of
            # credit less often while the grants cross two hops (a link without credit there gets
            # its messages held, and past the owner's window moved)
            window = server.window * (VIA_WINDOW if via is not None else 1)
            self.feed = Feed(self, subscription=subscription, window=window, max_credit=server.max_credit,
                             recycle=server.recycle and not subscription, token=server.feed_token(),
                             custody=not self.upstream.traits.redelivers_in_place,
                             log=log.warning)
            # A queue that turns out to be a stream: no link joins this consumer any more (each
            # stream consumer reads every message at an offset of its own)
            self.feed.on_stream = lambda: server.registry.unshare(self, [])
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
        # the queue the daemon declared for this subscription (RabbitMQ 4's `/exchanges/X/KEY`,
        # `topology.declare_subscription`): kept while the feed is suspended (`resume`), deleted when it ends
        self.own_queue: str | None = None
        self.consumer = None
        self.info: ConsumerInfo | None = None
        self.evaluated: frozenset = frozenset()  # `offer_identity` of each offered filter the upstream evaluates
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
        """The client delivery's pointer is its tag in the feed (valid until settled in `_outcome`)."""
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
        if self.consumer is None:
            return False
        return False if self.closed else self.consumer.probe(answer)

    def recycle(self, delivery: UpstreamDelivery, data: bytes, done: Callable[[bool], None]) -> bool:
        def moved(ok: bool) -> None:
            if not self.closed:
                done(ok)
                if self.draining and self.feed.moving == 0:
                    self.server.registry.finish_feed(self)

        return self.server.registry.recycle_message(self, data, moved)

    def open_own(self, outlet: Outlet, handler: Any) -> Any:
        """FanoutIO: an upstream subscription for one slow link of a shared subscription: on a queue
        of its own that the daemon declares when this feed consumes one (`OwnQueueConsumer`), else
        the address's, which the broker makes."""
        spec = dataclasses.replace(self.spec, name=f"{self.spec.name}|own-{next(self.server._sub_ids)}")
        if self.own_queue is not None:
            return OwnQueueConsumer(self, spec, handler)
        return self.server.upstream.open_consumer(spec, handler)

    @property
    def upstream_address(self) -> str | None:
        """Where its upstream consumer reads: the queue the daemon declared for it, else its links' address."""
        return self.spec.address if self.own_queue is None else topology.consume_address(self.upstream, self.own_queue)

    def declare_queue(self, pair: Any, gone: Callable[[], bool],
                      done: Callable[[str, tuple[str, str] | None], None]) -> None:
        """Declare and bind a new queue for this feed's subscription (`topology.declare_subscription`
        over `pair`, expiring after `upstream.subscription_expiry`); `done(queue, failure)` once it is
        ready (failure None) or refused, unless `gone()` by then: what it was for went meanwhile, and
        a queue declared for it is deleted."""
        queue = topology.subscription_queue()

        def declared(failure: tuple[str, str] | None) -> None:
            if gone():
                if failure is None:
                    topology.end_subscription(self.upstream, queue)
                return
            done(queue, failure)

        topology.declare_subscription(pair, queue, topology.exchange_binding(self.spec.address),
                                      self.server.config.upstream.subscription_expiry, declared)

    def consume_own_queue(self, queue: str) -> None:
        """The subscription's queue the daemon declared (`topology.declare_subscription`) is ready:
        the upstream consumer is opened on it (`own_queue`: kept while the feed is suspended by an
        upstream reconnect, deleted when the feed ends).  `spec` keeps the address the links
        subscribed to (the metrics' label; a slow member's own subscription, `open_own`)."""
        self.own_queue = queue
        self.consumer = self.upstream.open_consumer(own_queue_spec(self.upstream, self.spec, queue), self)

    def lost_outlet(self, outlet: Outlet, condition: str, description: str) -> None:
        outlet.io_owner = None
        close_link(outlet.io_ref, condition, description)

    # ConsumerHandler ----------------------------------------------------------
    def on_consumer_ready(self, consumer, info: ConsumerInfo) -> None:
        try:
            self.ready = True
            self.info = info
            if self.spec.offered:
                self.server.registry.offers_decided(self, info.evaluated)
            if isinstance(self.feed, Feed):
                self.feed.whole_grants = bool(self.upstream.traits.over_delivers)
                self.feed.dead_letters = bool(self.upstream.traits.dead_letters_undeliverable)
            if info.subscription is False and self.feed.subscription:
                # The upstream says this source is shared: never consume a non-match on it.
                self.feed.subscription = False
                self.feed.custody = not self.upstream.traits.redelivers_in_place
            pending, self.pending = self.pending, []
            if info.subscription is True and not self.feed.subscription and self.key[0] == "queue":
                # A subscription taken for a queue (sharing.decide had no word for it): the first
                # link keeps this consumer, the others get subscriptions of their own.
                self.pending = pending[:1]
                self.server.registry.unshare(self, pending[1:])
                pending, self.pending = self.pending, []
            for outlet in pending:
                self.server.receivers.complete(self, outlet)
            if self.feed.subscription:
                # every delivery of a subscription is decided within the feed's window
                consumer.settle_in_order()
        except Exception:
            log.exception("consumer ready handling failed")
            self.server.registry.fail_feed(self, ErrorInfo("amqp:internal-error", "proxy failure attaching upstream"))

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
            self.server.registry.fail_feed(self, ErrorInfo("amqp:internal-error", "proxy failure forwarding a message"))

    def on_consumer_credit(self, consumer, credit: int) -> None:
        if consumer is self.consumer:
            self.feed.on_upstream_credit(credit)

    def on_consumer_closed(self, consumer, error: ErrorInfo | None) -> None:
        try:
            if self.via is not None and consumer is self.consumer and self.server.rehoming.replica_lost(self, error):
                return  # its links are served elsewhere now
            if error is not None and error.transient and self.server.resumption.resumable(self):
                self.server.resumption.suspend_feed(self)  # the upstream connection went: its links wait
                return
            if (error is not None and error.transient and self.feed.subscription and self.via is None
                    and self.server.replicas is None):
                error = dataclasses.replace(error, description=(
                    f"{error.description or 'upstream connection lost'}: this subscription's queue on the "
                    "broker was made and named by the broker, so it cannot be consumed again, and what was "
                    "routed to it meanwhile is lost (in front of RabbitMQ 3.x, upstream.management_url lets "
                    "the daemon declare a queue that outlives a reconnect); subscribe again"))
            self.server.registry.fail_feed(self, error or ErrorInfo("amqp:link:detach-forced", "upstream detached"))
        except Exception:
            log.exception("consumer close handling failed")


class OwnQueueConsumer(ConsumerHandler):
    """A slow member's own subscription (`FeedBinding.open_own`) when its feed consumes a queue the
    daemon declared: a queue of the member's own is declared and bound the same way
    (`topology.declare_subscription`) and then consumed, so that it is deleted when the member's
    subscription ends (RabbitMQ 4 keeps the `amq.gen-` queue it makes for a topic after the link
    goes).  Until the queue is consumed this stands in for the consumer (the fan-out feed knows its
    member's subscription by this object: every event reaches `handler` with it); it is the
    consumer's handler too.  Messages routed to the queue from its binding on are in it: the
    member's switch from the group (`fanout`) holds as with a subscription made at once."""

    __slots__ = ("binding", "spec", "handler", "queue", "consumer", "closed")

    def __init__(self, binding: FeedBinding, spec: ConsumerSpec, handler: Any):
        self.binding, self.spec, self.handler = binding, spec, handler
        self.queue: str | None = None
        self.consumer = None
        self.closed = False
        upstream = binding.upstream
        pair = topology.topology(upstream)
        if pair is None:
            upstream.loop.call_soon(lambda: self._end(ErrorInfo(
                "amqp:connection:forced", f"upstream {upstream.name} is not connected", transient=True)))
            return
        binding.declare_queue(pair, lambda: self.closed, self._declared)  # (ended meanwhile: the queue goes)

    def _declared(self, queue: str, failure: tuple[str, str] | None) -> None:
        upstream = self.binding.upstream
        self.queue = queue
        if failure is not None:
            self._end(ErrorInfo(failure[0], f"the link's own subscription: {failure[1]}",
                                transient=not upstream.connected))
            return
        self.consumer = upstream.open_consumer(own_queue_spec(upstream, self.spec, self.queue), self)

    def _end(self, error: ErrorInfo) -> None:
        if not self.closed:
            self.closed = True
            self.handler.on_consumer_closed(self, error)

    # the consumer, as the fan-out feed uses it (it grants credit only once told it is ready)
    def flow(self, n: int) -> None:
        if self.consumer is not None:
            self.consumer.flow(n)

    def settle(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        if self.consumer is not None:
            self.consumer.settle(delivery, outcome)

    def close(self) -> None:
        """The member's subscription ends: its consumer closes (what it had not settled goes back to
        its queue) and its queue is deleted, with what it held."""
        if self.closed:
            return
        self.closed = True
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
            topology.end_subscription(self.binding.upstream, self.queue)

    # ConsumerHandler of the consumer on the queue: every event goes on, with this object
    def on_consumer_ready(self, consumer: Any, info: ConsumerInfo) -> None:
        if not self.closed:
            self.handler.on_consumer_ready(self, info)

    def on_delivery(self, consumer: Any, delivery: UpstreamDelivery) -> None:
        if not self.closed:
            self.handler.on_delivery(self, delivery)

    def on_consumer_credit(self, consumer: Any, credit: int) -> None:
        if not self.closed:
            self.handler.on_consumer_credit(self, credit)

    def on_consumer_closed(self, consumer: Any, error: ErrorInfo | None) -> None:
        if self.closed:
            return
        self.consumer = None
        # (the queue outlives a lost connection; x-expires deletes it: the member is detached at a
        # reconnect, `resume`, and its queue is not consumed again)
        if error is None or not error.transient:
            topology.end_subscription(self.binding.upstream, self.queue)
        self._end(error or ErrorInfo("amqp:link:detach-forced", "upstream detached"))


class _Done(FeedIO):
    """The I/O of a feed that is done: nothing to send, settle or ask (see `FeedRegistry._release`)."""

    def send(self, outlet: Outlet, delivery: UpstreamDelivery, data: bytes) -> Any:
        return None

    def settle_upstream(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        pass

    def flow_upstream(self, n: int) -> None:
        pass

    def recycle(self, delivery: UpstreamDelivery, data: bytes, done: Callable[[bool], None]) -> bool:
        return False


_DONE = _Done()


class Recycler(PublisherHandler):
    """The publisher of moved copies to one address.  A move whose publisher goes before the broker
    settled it counts as not done (its original is held again)."""

    def __init__(self, registry: "FeedRegistry", address: str):
        self.registry = registry
        self.address = address
        self.publisher = None
        self.ready = False
        self.closed = False
        self.pending: dict[int, Callable[[bool], None]] = {}
        self._ids = itertools.count(1)

    def publishing_client(self) -> tuple[Any, str | None]:
        return None, self.address  # (the daemon's own publisher)

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
        for b in self.registry.feeds_at(self.address):
            if not b.closed and b.feed.held:
                b.feed.pump()

    def on_publisher_closed(self, publisher, error) -> None:
        self.closed = True
        pending, self.pending = self.pending, {}
        for done in pending.values():
            done(False)


class FeedRegistry:
    """Every feed of one server (see the module's docstring)."""

    def __init__(self, server: Any):
        self.server = server
        self._trim_due = False  # a `heap.trim` is scheduled (`_release`)
        self.feeds: dict[Any, FeedBinding] = {}
        self._at_address: dict[str | None, set[FeedBinding]] = {}  # the feeds in `feeds` by address
        # queue feeds whose upstream turned their offered filter expressions down, under the key of
        # the same feed without them: any link of the queue may join (its filters stay local)
        self.feed_aliases: dict[Any, FeedBinding] = {}
        self.deciding: dict[Any, FeedBinding] = {}  # queue base key -> the feed whose offers await an answer
        self._recyclers: dict[str, Any] = {}
        self.draining: set[FeedBinding] = set()  # feeds whose last link went, finishing their moves
        # durable subscriptions kept while their subscriber is detached (an upstream without named
        # subscriptions: RabbitMQ), by name: their upstream consumer stays attached, holding what they
        # select; with the attached ones at most `limits.kept_subscriptions` (`durable.beyond_kept_limit`)
        self.kept: dict[str, FeedBinding] = {}

    def forget_recyclers(self) -> None:
        """The upstream connection changed: its publishers of moved copies are gone."""
        self._recyclers.clear()

    def feeds_at(self, address: str | None) -> list[FeedBinding]:
        """The registered feeds of `address` (a copy: what is done with them may change them)."""
        return list(self._at_address.get(address, ()))

    def register(self, binding: FeedBinding) -> None:
        self.feeds[binding.key] = binding
        self._at_address.setdefault(binding.spec.address, set()).add(binding)

    def unregister(self, binding: FeedBinding) -> None:
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
        binding.evaluated = frozenset(offer_identity(e) for e in evaluated)
        kept = [e for e in binding.spec.offered if offer_identity(e) not in binding.evaluated]
        if self.server.metrics is not None:
            for e in evaluated:
                self.server.metrics.filter_pushdown.labels(kind=e.kind, result="upstream").inc()
            for e in kept:
                self.server.metrics.filter_pushdown.labels(kind=e.kind, result="local").inc()
        log.info("upstream %s evaluates %s on %s; %s evaluated here", self.server.upstream.name,
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
                self.open_feed(key, spec, False, outlet, binding.upstream, binding.via)

    def unshare(self, binding: FeedBinding, outlets: list[Outlet]) -> None:
        """The upstream says `binding`'s source is a subscription the proxy took for a queue: no
        link may join it any more, and the links that were waiting for it get feeds of their own."""
        self.unregister(binding)
        binding.key = ("subscription", next(self.server._sub_ids))
        self.register(binding)
        binding.feed.subscription = True
        binding.feed.recycle = False
        binding.feed.custody = False
        for outlet in binding.pending:
            link_state(outlet.io_ref).subscription = True
        for outlet in outlets:
            link = outlet.io_ref
            link_state(link).subscription = True
            spec = dataclasses.replace(binding.spec, name=link.name)
            self.open_feed(("subscription", next(self.server._sub_ids)), spec, True, outlet)

    def suspend(self, binding: FeedBinding) -> list:
        """The upstream connection under a queue feed went (`resume.Resumption.suspend_feed`): the feed
        closes (what it held, and what its clients had not settled, stay on the broker) and its links,
        still attached, are returned to be placed again when the upstream is back."""
        if binding.closed:
            return []
        outlets = self._take_down(binding)
        for o in outlets:
            o.io_owner = None
            o.in_flight.clear()
            o.waiting_since = None
        self._release(binding)
        return outlets

    def _release(self, binding: FeedBinding) -> None:
        """A binding that is done (its feed closed, its consumer closed) lets go of what it shares
        references with, so that it, its feed, its consumer and their filters (a compiled 4 KB
        selector is ~85 KiB) are freed by reference counting when its last link goes, not at the
        garbage collector's next full pass (1,000 closed links with maximal selectors held +90 MiB
        until then).  A late call from either side finds nothing to act on."""
        binding.feed.io = _DONE
        binding.feed.on_stream = None
        binding.consumer = None
        if not self._trim_due:  # and the freed pages go back to the system, once a second at most
            self._trim_due = True
            self.server.upstream.loop.call_later(1.0, self._trim)

    def _trim(self) -> None:
        self._trim_due = False
        heap.trim()

    def _take_down(self, binding: FeedBinding) -> list:
        """Close `binding` and forget it everywhere (no link may join it); its links (attached and
        waiting), for the caller to detach or keep."""
        binding.closed = True
        self.draining.discard(binding)
        self.unregister(binding)
        if binding.deciding_key is not None and self.deciding.get(binding.deciding_key) is binding:
            del self.deciding[binding.deciding_key]
        outlets = list(binding.feed.outlets) + binding.pending
        binding.pending = []
        binding.feed.close()
        self._forget_recycler(binding.spec.address)
        return outlets

    def fail_feed(self, binding: FeedBinding, error: ErrorInfo) -> None:
        if binding.closed:
            return
        if binding.kept_name is not None and self.kept.get(binding.kept_name) is binding:
            del self.kept[binding.kept_name]
            log.warning("durable subscription %r kept for a detached subscriber is lost: %s", binding.kept_name,
                        error.description)
        outlets = self._take_down(binding)
        if binding.consumer is not None:
            binding.consumer.close()
        if binding.own_queue is not None:
            topology.end_subscription(binding.upstream, binding.own_queue)
        self._release(binding)
        metrics = self.server.metrics
        if error.transient and outlets and metrics is not None:
            metrics.links_detached_by_reconnect.inc(len(outlets))
        for o in outlets:
            link = o.io_ref
            o.io_owner = None
            if link.local_state == LOCAL_UNINIT:
                self.server._refuse(link, error.condition, error.description or "upstream refused", error.info)
            else:
                close_link(link, error.condition, error.description, error.info)

    def recycle_message(self, binding: FeedBinding, data: bytes, done: Callable[[bool], None]) -> bool:
        """Publish a moved copy (see forwarding) to the tail of its queue; False if the publisher
        has no credit yet (its credit pumps the address's feeds)."""
        address = binding.spec.address
        rec = self._recyclers.get(address)
        if rec is None or rec.closed:
            rec = Recycler(self, address)
            self._recyclers[address] = rec
            rec.publisher = self.server.upstream.open_publisher(address, rec, durable=binding.spec.durable)
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
            counts = reports.in_process_counts(binding)
            if counts is not None:
                self.server.filter_totals.retire_feed(binding.spec.address, introspect.entries_kind(binding.spec.filters),
                                               counts)
        if binding.closed:
            return
        if binding.feed.moving:
            log.warning("shutdown grace over with %d moves to %s in flight: their originals go back to the queue "
                        "beside copies the broker may accept", binding.feed.moving, binding.spec.address)
        binding.closed = True
        returns = binding.feed.returns()
        binding.feed.close()
        if binding.consumer is not None:
            for delivery, outcome in returns:  # unacquired (3.2.1), or modified with a client's annotations
                binding.consumer.settle(delivery, outcome)
            binding.consumer.close(closed=binding.draining_closed)
        if binding.own_queue is not None:
            topology.end_subscription(binding.upstream, binding.own_queue)
        self._forget_recycler(binding.spec.address)
        self._release(binding)

    def end_feed(self, binding: FeedBinding, closed: bool) -> None:
        """The last link of `binding` went: no move starts; the ones in flight finish (their
        originals are accepted), bounded by the shutdown grace; then what is held goes back."""
        self.unregister(binding)
        binding.feed.stop()
        binding.draining = True
        binding.draining_closed = closed
        if binding.feed.moving == 0:
            self.finish_feed(binding)
        else:
            self.draining.add(binding)
            self.server.upstream.loop.call_later(self.server.grace, lambda b=binding: self.finish_feed(b))

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

    def open_feed(self, key: Any, spec: ConsumerSpec, subscription: bool, outlet: Outlet,
                   upstream: Any = None, via: str | None = None) -> FeedBinding:
        binding = self.declare_feed(key, spec, subscription, outlet, upstream, via)
        binding.consumer = binding.upstream.open_consumer(spec, binding)
        return binding

    def declare_feed(self, key: Any, spec: ConsumerSpec, subscription: bool, outlet: Outlet,
                     upstream: Any = None, via: str | None = None) -> FeedBinding:
        """A feed registered under `key` with `outlet` waiting, whose upstream consumer is opened
        later (`FeedBinding.consume_own_queue`, once its queue is declared): the links that come
        meanwhile join it and wait too."""
        binding = FeedBinding(self.server, key, spec, subscription, upstream, via)
        if self.server.stopping:
            binding.feed.stop()
        self.register(binding)
        binding.pending.append(outlet)
        outlet.io_owner = binding
        return binding

    def end_subscription_queues(self) -> None:
        """The daemon stops (its client links are closed): the queues it declared for subscriptions
        (`FeedBinding.own_queue`) are deleted before its upstream connection closes."""
        queues = []
        for b in self.feeds.values():
            if b.own_queue is not None and not b.closed:
                queues.append(b.own_queue)
                b.own_queue = None
        topology.end_subscriptions(self.server.upstream, queues)

    def moves_in_flight(self) -> int:
        return sum(b.feed.moving for b in list(self.feeds.values())) + sum(b.feed.moving for b in self.draining)

    def quiesce(self) -> None:
        """Shutdown begins: every feed stops starting moves, pulling and sending (moves in flight
        finish; `moves_in_flight` tells the shutdown when)."""
        self.server.stopping = True
        for b in list(self.feeds.values()):
            b.feed.stop()

    def tick(self) -> None:
        """Once a second: queue feeds whose search is over look again after a while (forwarding),
        shared subscriptions publish their index counts (fanout)."""
        try:
            for b in list(self.feeds.values()):
                if not b.closed:
                    b.feed.tick()
        except Exception:
            log.exception("search tick failed")
        if not self.server.stopping:
            self.server.upstream.loop.call_later(1.0, self.tick)


def own_queue_spec(upstream: Any, spec: ConsumerSpec, queue: str) -> ConsumerSpec:
    """The upstream consumer of a subscription's queue the daemon declared: the queue's address on
    `upstream` (`topology.consume_address`), the link's filters and name, no subscription terms."""
    return dataclasses.replace(spec, address=topology.consume_address(upstream, queue), capabilities=(),
                               distribution_mode=None, durable=None, expiry_policy=None)


def offer_identity(entry: Any) -> tuple:
    """An offered filter as the links of one feed all have it (their entries are objects of their own)."""
    return (entry.kind, str(entry.key), repr(entry.value))
