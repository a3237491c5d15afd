"""The embedded broker as the proxy's upstream (`broker_filter.proxy.upstream.Upstream`).

Theory of operation: `broker_filter.broker.Broker` holds the addresses in process and makes every
decision; this adapter only translates.  Consumers and publishers map one to one onto broker
consumers and `Broker.publish`; messages stay the raw bytes the client sent and are decoded (by
`broker_filter.amqp`) only when a filter needs them.  All filters the proxy pushes down are
evaluated by the broker with queue semantics (oldest match first, non-matching messages stay for
other consumers), which is why `can_evaluate` accepts every kind except no-local: the receiving
client's identity lives in the proxy, not here.

A message the broker hands out again (after released, modified, or a consumer detaching with it)
goes out with its header rewritten for that delivery only: first-acquirer false and delivery-count
the number of failed attempts (`redelivery_bytes`); the stored bytes never change.

Callbacks are never made from inside a method: everything that follows a call (ready, deliveries,
settlements) is deferred with `Loop.call_soon`.  Dispatch runs on the loop with a bounded number of
filter evaluations per turn (`BrokerConfig.dispatch_budget`), so one consumer scanning a deep queue
never stalls the other connections.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..broker import ANYCAST, MULTICAST, Broker, BrokerConfig, BrokerError, Limits
from ..broker.queue import Consumer as BrokerConsumer
from ..amqp import redelivery_bytes
from ..amqp.sections import set_message_annotation
from ..amqp.types import symbol
from .forwarding import ACCEPTED, Outcome
from .traits import EMBEDDED
from .upstream import (ConsumerHandler, ConsumerInfo, ConsumerSpec, ErrorInfo, Loop, PublisherHandler, UpstreamBase,
                       UpstreamDelivery)

log = logging.getLogger("broker_filter.proxy.embedded")

# Filter kinds the broker evaluates itself (everything but no-local, which needs the client's identity).
PUSHABLE_KINDS = frozenset(
    {"selector", "direct", "topic", "headers", "or", "and", "not", "properties", "application-properties", "sql"}
)
PUBLISHER_CREDIT = 1000


def broker_config(section: Any) -> BrokerConfig:
    """A BrokerConfig from the `[embedded]` section of `broker_filter.config.Config` (0 = unlimited)."""
    return BrokerConfig(
        default_routing_type=section.default_routing_type or ANYCAST,
        limits=Limits(max_messages=section.max_messages or None, max_bytes=section.max_bytes or None),
        max_total_bytes=section.max_total_bytes or None,
        dead_letter_address=section.dead_letter_address or None,
    )


def _decode(data: bytes, reads: Any = None) -> Any:
    from ..amqp import decode_message

    return decode_message(data, reads)


def _is_durable(spec: ConsumerSpec) -> bool:
    return bool(spec.durable) or str(spec.expiry_policy or "") == "never"


class EmbeddedConsumer:
    def __init__(self, upstream: "EmbeddedUpstream", spec: ConsumerSpec, handler: ConsumerHandler):
        self.spec = spec
        self.handler = handler
        self._upstream = upstream
        self._credit = 0
        self._closed = False
        self.broker_consumer: BrokerConsumer | None = None

    @property
    def credit(self) -> int:
        return self.broker_consumer.credit if self.broker_consumer is not None else self._credit

    def probe(self, answer: Any) -> None:
        """The queue's ready count cannot be asked here (the broker is in process: nothing to probe)."""
        return None

    def settle_in_order(self) -> None:
        """(A remote broker merges dispositions settled in order; nothing to do in process.)"""

    def filter_counts(self) -> tuple[int, int]:
        """(evaluations, matches) of the filters pushed down to the broker for this consumer: its
        consumer's on a queue, its subscription queue's on a topic."""
        bc = self.broker_consumer
        if bc is None:
            return 0, 0
        q = bc.queue
        return bc.evaluations + q.evaluations, bc.matches + q.matches

    def _open(self) -> None:
        spec = self.spec
        broker = self._upstream.broker
        try:
            filter_ = None
            if spec.filters:
                from ..filters import FilterSet

                filter_ = FilterSet(tuple(spec.filters))
            if spec.dynamic and not spec.address:
                bc = broker.subscribe_temporary(filter=filter_, context=self, link_name=spec.name)
            else:
                bc = broker.subscribe(
                    spec.address,
                    capabilities=spec.capabilities,
                    filter=filter_,
                    link_name=spec.name,
                    container_id=spec.container_id,
                    durable=_is_durable(spec),
                    context=self,
                    browse=spec.distribution_mode == "copy",
                )
        except BrokerError as e:
            self._refused(ErrorInfo(e.condition, e.description))
            return
        except Exception:  # a bug here must end this link only, with an answer
            log.exception("opening embedded consumer %r failed", spec.address)
            self._refused(ErrorInfo("amqp:internal-error", "embedded broker failure; see the daemon log"))
            return
        self.broker_consumer = bc
        broker.flow(bc, self._credit)
        queue = bc.queue
        info = ConsumerInfo(
            address=spec.address if spec.address is not None else queue.address.name,
            subscription=(queue.routing_type == MULTICAST and not queue.shared) or bc.browse,
            filters_applied=tuple(e.key for e in spec.filters),
            capabilities=("topic",) if queue.routing_type == MULTICAST else ("queue",),
        )
        self._upstream.loop.call_soon(lambda: self._ready(info))
        self._upstream.kick()

    def _refused(self, error: ErrorInfo) -> None:
        self._closed = True
        self._upstream._consumers.discard(self)
        self._upstream.loop.call_soon(lambda: self.handler.on_consumer_closed(self, error))

    def _ready(self, info: ConsumerInfo) -> None:
        if not self._closed:
            self.handler.on_consumer_ready(self, info)

    def flow(self, n: int) -> None:
        if n <= 0 or self._closed:
            return
        if self.broker_consumer is None:
            self._credit += n
            return
        self._upstream.broker.flow(self.broker_consumer, self.broker_consumer.credit + n)
        self._upstream.kick()

    def settle(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        bc = self.broker_consumer
        if bc is None:
            return
        self._upstream.broker.settle(
            bc, delivery.ref, outcome.kind,
            delivery_failed=outcome.delivery_failed, undeliverable_here=outcome.undeliverable_here,
            unacquired=outcome.unacquired, annotations=outcome.annotations,
        )
        self._upstream.kick()

    def close(self, closed: bool | None = None) -> None:
        """Detach.  A durable subscription outlives the link unless `closed` is True (a JMS
        unsubscribe); the interface's plain close() keeps it."""
        if self._closed:
            return
        self._closed = True
        self._upstream._consumers.discard(self)
        if self.broker_consumer is not None:
            self._upstream.broker.close_consumer(self.broker_consumer, closed=bool(closed))
            self.broker_consumer = None  # (it refers back to this one: no cycle left for the collector)
            self._upstream.kick()


class EmbeddedPublisher:
    def __init__(self, upstream: "EmbeddedUpstream", address: str | None, handler: PublisherHandler,
                 capabilities: tuple[str, ...] = ()):
        self.address = address
        self.handler = handler
        self.capabilities = capabilities
        self._upstream = upstream
        self._closed = False

    @property
    def credit(self) -> int:
        return 0 if self._closed else PUBLISHER_CREDIT

    def send(self, data: bytes, on_settled: Callable[[Outcome], None]) -> None:
        if self._closed:
            return
        outcome = self._upstream.publish(self.address, data, self.capabilities)
        self._upstream.loop.call_soon(lambda: None if self._closed else on_settled(outcome))

    def close(self) -> None:
        self._closed = True
        self._upstream._publishers.discard(self)


class EmbeddedUpstream(UpstreamBase):
    """Upstream backed by an in-process `Broker`."""

    name = "embedded"
    # A receiver with a dynamic source gets a temporary queue of its own (`Broker.subscribe_temporary`:
    # address `temp.<uuid>`, deleted when its link goes); its name is the attach reply's address, and
    # a dynamic target (a JMS temporary queue) one from `declare_dynamic_target`.  A null source looks
    # a durable subscription up by link name (Qpid JMS).  A message given back goes out again with its
    # history in the header (the proxy's feeds hand released, modified and a detached link's
    # deliveries back here instead of keeping them).  Copy on a queue browses it.
    traits = EMBEDDED

    def __init__(self, broker: Broker | None = None, config: BrokerConfig | None = None):
        self.broker = broker or Broker(config or BrokerConfig(), decode=_decode)
        if self.broker.decode is None:
            self.broker.decode = _decode
        self.loop: Loop | None = None
        self._listener = None
        self._started = False
        self._kicked = False
        self._consumers: set[EmbeddedConsumer] = set()
        self._publishers: set[EmbeddedPublisher] = set()

    @classmethod
    def from_config(cls, section: Any) -> "EmbeddedUpstream":
        return cls(config=broker_config(section))

    @property
    def connected(self) -> bool:
        return self._started

    def start(self, loop: Loop, listener: Any) -> None:
        self.loop = loop
        self._listener = listener
        self._started = True
        loop.call_soon(lambda: listener.on_upstream_up(self) if self._started else None)

    def stop(self) -> None:
        self._started = False
        for c in list(self._consumers):
            c.close()
        for p in list(self._publishers):
            p.close()

    def can_evaluate(self, entry: Any) -> bool:
        return entry.kind in PUSHABLE_KINDS


    def routing_type(self, address: str | None, capabilities: tuple[str, ...] = ()) -> str | None:
        return self.broker.consumer_routing(address, capabilities)

    def open_consumer(self, spec: ConsumerSpec, handler: ConsumerHandler) -> EmbeddedConsumer:
        consumer = EmbeddedConsumer(self, spec, handler)
        self._consumers.add(consumer)
        self.loop.call_soon(consumer._open)
        return consumer

    def declare_dynamic_target(self) -> str:
        """A dynamic target's node (`Broker.declare_temporary`); its address."""
        return self.broker.declare_temporary().name

    def release_dynamic_target(self, address: str) -> None:
        self.broker.release_temporary(address)
        self.kick()

    def open_publisher(self, address: str | None, handler: PublisherHandler,
                       capabilities: tuple[str, ...] = (), durable: int | None = None) -> EmbeddedPublisher:
        publisher = EmbeddedPublisher(self, address, handler, tuple(str(c) for c in capabilities or ()))
        self._publishers.add(publisher)
        self.loop.call_soon(lambda: None if publisher._closed else handler.on_publisher_ready(publisher))
        return publisher

    # ------------------------------------------------------------------ internals
    def publish(self, address: str | None, data: bytes, capabilities: tuple[str, ...] = ()) -> Outcome:
        """Store one message; the outcome the publishing client gets."""
        if address is None:  # anonymous relay: the message's `to` names the address
            try:
                m = _decode(data, ("properties",))
                address = m.properties.to if m.properties is not None else None
            except Exception:
                address = None
            if not address:
                return Outcome("rejected", error=("amqp:not-found", "message has no 'to' address"))
        try:
            self.broker.publish(address, data, size=len(data), capabilities=capabilities)
        except BrokerError as e:
            return Outcome("rejected", error=(e.condition, e.description))
        except Exception:  # never accept what was not stored
            log.exception("publishing to %r failed", address)
            return Outcome("rejected", error=("amqp:internal-error", "embedded broker failure; see the daemon log"))
        self.kick()
        return ACCEPTED

    def kick(self) -> None:
        """Run dispatch on the loop soon (once, however many changes come first)."""
        if not self._kicked and self.loop is not None and self._started:
            self._kicked = True
            self.loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._kicked = False
        if not self._started:
            return
        try:
            assignments, more = self.broker.dispatch()
        except Exception:  # keep serving: the queues stay marked for another try
            log.exception("embedded dispatch failed")
            self.loop.call_later(0.1, self.kick)
            return
        for bc, entry in assignments:
            consumer: EmbeddedConsumer = bc.context
            data = entry.payload
            if entry.annotations:
                for key, value in entry.annotations.items():
                    data = set_message_annotation(data, symbol(key) if isinstance(key, str) else key, value)
            redelivered = entry.acquisitions > 1 or entry.delivery_count > 0
            if redelivered:
                data = redelivery_bytes(data, entry.delivery_count)
            delivery = UpstreamDelivery(data, ref=entry, redelivered=redelivered)
            try:
                consumer.handler.on_delivery(consumer, delivery)
            except Exception:  # one broken link must not lose the message or stop dispatch
                log.exception("consumer %r failed to take a delivery", consumer)
                self.broker.settle(bc, entry, "released")
        if more:
            self.kick()
