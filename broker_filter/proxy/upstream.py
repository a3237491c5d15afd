"""The interface between the client-facing side of the proxy and an upstream (where addresses live).

Theory of operation
-------------------
The proxy accepts client links and serves them from an `Upstream`: a remote AMQP 1.0 broker
(`broker_filter.proxy.remote.RemoteUpstream`) or the in-process embedded broker
(`broker_filter.proxy.embedded`).  The client side never sees which one it talks to.

Threading: everything runs on the proxy's single event-loop thread.  Methods are called on that
thread and callbacks are made on it.  **An upstream never calls a handler from inside one of its own
methods**: it defers the callback through `Loop.call_soon`, so the caller's state is consistent when
the callback runs (no re-entrancy).  Methods never raise for a runtime condition (a lost
connection, an unknown address); they report it through the handler's `*_closed` callback.

Messages cross this interface as raw encoded bytes (the concatenated AMQP sections of one message,
exactly as on the wire).  The proxy decodes only what its filters read and forwards the bytes
unchanged; an upstream stores and returns them unchanged.

Consuming
    consumer = upstream.open_consumer(ConsumerSpec(address, filters=..., ...), handler)
    handler.on_consumer_ready(consumer, info)          # attached; info says what the upstream applied
    consumer.flow(n)                                   # grant n more credit (never more than asked)
    handler.on_delivery(consumer, delivery)            # one per credit; delivery.data is the bytes
    consumer.settle(delivery, outcome)                 # exactly once per delivery
    consumer.close()                                   # unsettled deliveries go back to the source
    handler.on_consumer_closed(consumer, error)        # upstream ended it (not called after close())

Publishing
    publisher = upstream.open_publisher(address, handler)
    handler.on_publisher_ready(publisher)
    handler.on_publisher_credit(publisher)             # publisher.credit > 0 again
    publisher.send(data, on_settled)                   # on_settled(outcome) once the upstream settled
    publisher.close()
    handler.on_publisher_closed(publisher, error)      # pending sends are then never settled

Push-down: `Upstream.can_evaluate(entry)` tells which applied filter entries the upstream really
evaluates itself.  The proxy passes those in `ConsumerSpec.filters` and evaluates only the rest
locally.  An upstream answers True only when it is known to filter (it offers `APACHE.ORG:SELECTOR`
in its open frame, the configuration says so, or it is the embedded broker); an echo alone is no
proof.  `ConsumerSpec.address` may already be rewritten for push-down (e.g. a legacy binding key
appended to an `/exchange/X` address).

Filter expressions (OASIS filtex: the property filters and the SQL filter) are decided per link, by
the attach reply: an upstream that may evaluate them (`Upstream.can_offer`) gets them in
`ConsumerSpec.offered`, beside the pushed filters, and the proxy keeps evaluating them until the
reply says otherwise.  `ConsumerInfo.evaluated` names the offered entries the upstream evaluates:
those whose capability (`AMQP_FILTEX_PROP_V1_0`, `AMQP_FILTEX_SQL_V1_0`) the reply offers — on the
attach or on its source, never one the proxy asked for itself — AND which the reply's source echoes
under the client's key.  RabbitMQ 4.1+ does that on streams only; on classic and quorum queues (and
RabbitMQ 3.10 and 4.0 everywhere) it echoes the filter without the capability and applies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from .forwarding import ACCEPTED, RELEASED, Outcome
from .traits import Traits

__all__ = [
    "ACCEPTED",
    "RELEASED",
    "Cancellable",
    "Consumer",
    "ConsumerHandler",
    "ConsumerInfo",
    "ConsumerSpec",
    "ErrorInfo",
    "Loop",
    "Outcome",
    "Publisher",
    "PublisherHandler",
    "Upstream",
    "UpstreamBase",
    "UpstreamDelivery",
    "UpstreamListener",
]


# ---------------------------------------------------------------------------- values
@dataclass(frozen=True)
class ErrorInfo:
    """Why something ended: an AMQP error condition.

    `transient` is True when the cause is the upstream connection going away (the upstream is
    reconnecting); False when the upstream refused or ended this link for good.  `aborted`: the
    upstream connection went without a close frame (the socket closed: RabbitMQ 4 refuses an open
    for a vhost it does not have so).
    """

    condition: str
    description: str | None = None
    transient: bool = False
    info: dict[Any, Any] | None = None
    aborted: bool = False


@dataclass(frozen=True)
class ConsumerSpec:
    """What to consume.

    address:       upstream address, as the client gave it (or rewritten for push-down).
    filters:       applied filter entries (`broker_filter.filters.FilterEntry`) pushed down to the
                   upstream; only ones `Upstream.can_evaluate` accepted.  Empty: no filtering upstream.
    capabilities:  the client's source capabilities (e.g. "topic", "queue", "shared"), as symbols/strings.
    distribution_mode: the client's requested "move" / "copy", or None.
    durable / expiry_policy / dynamic: passed through from the client's source where the upstream
                   supports them (durable: 0/1/2; expiry_policy: "link-detach", "session-end",
                   "connection-close", "never"; None = unspecified).
    name:          the client's link name (names shared and durable subscriptions, JMS style).
    container_id:  the client connection's container id (scopes non-global subscription names).
    offered:       filter expressions (filtex entries) put on the upstream attach beside `filters`,
                   which the upstream may or may not evaluate: `ConsumerInfo.evaluated` tells.
    passthrough:   filters the proxy does not know (`Passthrough`: RabbitMQ's stream offsets and
                   `rabbitmq:stream-*` filters, anything else), for an upstream that takes them
                   (`passes_unknown_filters`); the echo for their keys is the upstream's.
    """

    address: str | None
    filters: tuple[Any, ...] = ()
    capabilities: tuple[str, ...] = ()
    distribution_mode: str | None = None
    durable: int | None = None
    expiry_policy: str | None = None
    dynamic: bool = False
    name: str | None = None
    container_id: str | None = None
    offered: tuple[Any, ...] = ()
    passthrough: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Passthrough:
    """A filter the proxy does not evaluate, given to the upstream as the client sent it."""

    key: Any
    value: Any
    kind: str = "passthrough"


@dataclass(frozen=True)
class ConsumerInfo:
    """What the upstream reported when the consumer attached.

    address:       the upstream's source address (may differ, e.g. a dynamic or server-named node).
    subscription:  True if this consumer has its own copy of the messages (topic / exchange binding /
                   copy distribution): a non-matching message may be settled as consumed for it.
                   False for a shared queue, where a non-match must be left for others.
                   None when the upstream cannot tell (the proxy then decides from the address).
    filters_applied: keys of `ConsumerSpec.filters` the upstream says it applies.
    capabilities:  the upstream source's capabilities.
    evaluated:     the entries of `ConsumerSpec.offered` the upstream evaluates (capability offered
                   and filter echoed under its key); the proxy stops evaluating those.
    echoed:        the upstream's echo of `ConsumerSpec.passthrough` keys (key -> value).
    """

    address: str | None = None
    subscription: bool | None = None
    filters_applied: tuple[Any, ...] = ()
    capabilities: tuple[str, ...] = ()
    evaluated: tuple[Any, ...] = ()
    echoed: Any = None


class UpstreamDelivery:
    """One message from the upstream.  `data` is the raw encoded message; `ref` belongs to the upstream.

    `redelivered` is True when the upstream says another consumer may have seen it before
    (AMQP first-acquirer false or delivery-count > 0), when known.
    """

    __slots__ = ("data", "ref", "redelivered", "__weakref__")

    def __init__(self, data: bytes, ref: Any = None, redelivered: bool = False):
        self.data = data
        self.ref = ref
        self.redelivered = redelivered

    def __repr__(self) -> str:
        return f"<UpstreamDelivery {len(self.data)} bytes>"


# ---------------------------------------------------------------------------- event loop
class Cancellable(Protocol):
    def cancel(self) -> None: ...


@runtime_checkable
class Loop(Protocol):
    """The proxy's event loop, as an upstream sees it."""

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run fn on the loop thread after the current callback returns (FIFO)."""

    def call_later(self, delay: float, fn: Callable[[], None]) -> Cancellable:
        """Run fn on the loop thread after `delay` seconds."""


# ---------------------------------------------------------------------------- callbacks
# Base classes, not protocols: what is optional is declared here with its default, so an upstream
# calls it without asking whether the handler has it.
class ConsumerHandler:
    __slots__ = ()

    def on_consumer_ready(self, consumer: "Consumer", info: ConsumerInfo) -> None: ...

    def on_delivery(self, consumer: "Consumer", delivery: UpstreamDelivery) -> None: ...

    def on_consumer_closed(self, consumer: "Consumer", error: ErrorInfo | None) -> None: ...

    def on_consumer_credit(self, consumer: "Consumer", credit: int) -> None:
        """The link's credit as a flow from the broker left it (lower than granted when the broker
        used credit up without delivering).  Optional."""


class PublisherHandler:
    __slots__ = ()

    def on_publisher_ready(self, publisher: "Publisher") -> None: ...

    def on_publisher_credit(self, publisher: "Publisher") -> None: ...

    def on_publisher_closed(self, publisher: "Publisher", error: ErrorInfo | None) -> None: ...

    def publishing_client(self) -> tuple[Any, str | None]:
        """(the client connection record publishing through this handler, None for the daemon's own
        publisher; the address it publishes to, None: the publisher's): named in the log when the
        broker drops the connection with publishes in flight."""
        return None, None


class UpstreamListener:
    """Connection-level events of the upstream as a whole."""

    __slots__ = ()

    def on_upstream_failed(self, upstream: "Upstream", error: ErrorInfo) -> None:
        """An attempt that never opened (optional): a listener that would rather give up than wait
        for the next attempt (a pass-through client whose vhost or login the broker refuses)."""

    def on_upstream_up(self, upstream: "Upstream") -> None:
        """Connected (again).  Consumers/publishers opened before are gone; open new ones."""

    def on_upstream_down(self, upstream: "Upstream", error: ErrorInfo) -> None:
        """Connection lost; every open consumer and publisher was closed with a transient error
        (their `*_closed` callbacks ran first).  The upstream reconnects with backoff by itself."""


# ---------------------------------------------------------------------------- endpoints
class Consumer(Protocol):
    spec: ConsumerSpec

    @property
    def credit(self) -> int:
        """Credit granted and not yet used by a delivery."""

    def flow(self, n: int) -> None:
        """Grant n (> 0) more credit.  The upstream sends at most this many more deliveries."""

    def settle(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        """Apply the outcome to the delivery and settle it.  Exactly once per delivery.
        accepted: consumed.  rejected: dead (broker policy).  released: back to the source, not
        counted as a failed attempt.  modified: per the spec (delivery_failed counts an attempt,
        undeliverable_here keeps it from this consumer); an upstream that cannot apply modified
        as asked (RabbitMQ 3.10 ends the session) degrades it to `released`."""

    def probe(self, answer: Callable[[int | None], None]) -> bool | None:
        """Ask how many messages the queue has ready (`search.QueueSearch.look`); None: never asked here."""

    def settle_in_order(self) -> None:
        """Every delivery is decided within the feed's window: settle in delivery order (merged dispositions)."""

    def filter_counts(self) -> tuple[int, int] | None:
        """(evaluations, matches) of the filters the upstream evaluates for this consumer, when it knows them
        (the embedded broker), else None."""

    def close(self, closed: bool | None = None) -> None:
        """Detach.  Deliveries not yet settled go back to the source for other consumers.
        `closed`: True when the client closed its link (a durable subscription ends), False when it
        only detached or its connection went (a durable subscription stays), None: unspecified
        (treated as a detach).  Idempotent; no callbacks follow."""


class Publisher(Protocol):
    address: str | None

    @property
    def credit(self) -> int:
        """How many more messages `send` may take now."""

    def send(self, data: bytes, on_settled: Callable[[Outcome], None]) -> None:
        """Publish one raw encoded message.  on_settled(outcome) runs once the upstream settled it:
        accepted means the upstream has it.  Not called if the publisher closes first."""

    def close(self) -> None:
        """Detach; idempotent; no callbacks follow."""


class Upstream(Protocol):
    """Where addresses live.  One instance per proxy process."""

    name: str  # for logs, e.g. "amqp://127.0.0.1:5672" or "embedded"

    @property
    def connected(self) -> bool:
        """True between on_upstream_up and on_upstream_down."""

    def start(self, loop: Loop, listener: UpstreamListener) -> None:
        """Begin connecting (or, embedded, become ready) and report through listener.on_upstream_up."""

    def stop(self) -> None:
        """Close everything; no callbacks follow."""

    def can_evaluate(self, entry: Any) -> bool:
        """True if this upstream evaluates the applied filter entry (a `FilterEntry`) itself."""

    # Optional: `can_offer(entry) -> bool`, True when the filtex entry may go on the upstream attach
    # for the reply to decide (`ConsumerSpec.offered`); an upstream without it is offered nothing.
    # Optional: `closing() -> bool`, True after `stop()` while the upstream still closes its
    # connection (the shutdown waits for it, so outcomes written before the close reach the broker).

    def routing_type(self, address: str | None, capabilities: Sequence[str] = ()) -> str | None:
        """What a consumer of `address` gets in this upstream's address model, known before it
        attaches: "anycast" (a queue its consumers share), "multicast" (a subscription of its own),
        or None when the address alone does not tell (see `broker_filter.proxy.sharing`)."""

    def open_consumer(self, spec: ConsumerSpec, handler: ConsumerHandler) -> Consumer: ...

    def open_publisher(self, address: str | None, handler: PublisherHandler,
                       capabilities: Sequence[str] = (), durable: int | None = None) -> Publisher:
        """`capabilities`: the target capabilities asked for (`topic` / `queue` state a routing type);
        `durable`: the target's durability, for an upstream that declares a node from it (RabbitMQ
        3.10 declares `/queue/q` so, and refuses an existing queue declared otherwise)."""


class UpstreamBase:
    """What every upstream declares, with the defaults of one that offers nothing optional: the
    proxy reads these, never probes for them.  `traits` says what the upstream does (`proxy.traits`,
    filled from a remote broker's open frame, fixed for the embedded one)."""

    name: str = "upstream"
    traits: Traits = Traits()
    vhost: str | None = None  # the vhost every upstream connection opens (a remote broker's URL path)
    answer_timeout: float = 5.0  # longest wait for the upstream to answer a begin, attach or request
    management_url: str = ""  # RabbitMQ 3.x's HTTP API, when configured (`topology.HttpTopology`)
    product: str | None = None  # the open frame's `product` and `version` (None: not known)
    version: str | None = None
    lost_cause: str | None = None  # why the upstream connection was last lost (a reconnect's metric label)
    connected: bool = False  # between `on_upstream_up` and `on_upstream_down`
    topology_pair: Any = None  # RabbitMQ 4: the daemon's own /management pair (`topology.Topology`)
    topology_http: Any = None  # RabbitMQ 3.x: the daemon's client of its HTTP API (`topology.HttpTopology`)

    def can_offer(self, entry: Any) -> bool:
        """True when the filtex entry may go on the upstream attach for its reply to decide."""
        return False

    def closing(self) -> bool:
        """True after `stop()` while the upstream still closes its connection."""
        return False

    def routing_type(self, address: str | None, capabilities: Sequence[str] = ()) -> str | None:
        return None

    def declare_dynamic_target(self) -> str:
        """A node of its own for a dynamic target (only where `traits.dynamic_sources`)."""
        raise NotImplementedError("dynamic nodes are not supported by this upstream")

    def release_dynamic_target(self, address: str) -> None:
        """The node `declare_dynamic_target` made is no longer used."""


def pushable(upstream: Upstream, entries: Sequence[Any]) -> tuple[Any, ...]:
    """The entries `upstream` evaluates itself."""
    return tuple(e for e in entries if upstream.can_evaluate(e))


FILTEX_KINDS = frozenset({"properties", "application-properties", "sql"})
FILTEX_CAPABILITY = {"properties": "AMQP_FILTEX_PROP_V1_0", "application-properties": "AMQP_FILTEX_PROP_V1_0",
                     "sql": "AMQP_FILTEX_SQL_V1_0"}


def evaluated_offers(offered: Sequence[Any], capabilities: Any, echoed: Any) -> tuple[Any, ...]:
    """The offered filtex entries an attach reply shows evaluated: the reply offers the entry's
    capability (`capabilities`: the reply's, none the proxy asked for) and echoes the entry under its
    key with its value (`echoed`: the reply source's filter map).  The echo alone proves nothing."""
    if not isinstance(echoed, dict):
        return ()
    caps = {str(c) for c in capabilities or ()}
    by_key = {str(k): v for k, v in echoed.items()}
    out = []
    for e in offered:
        if FILTEX_CAPABILITY.get(e.kind) not in caps or str(e.key) not in by_key:
            continue
        if by_key[str(e.key)] == e.value or repr(by_key[str(e.key)]) == repr(e.value):
            out.append(e)
    return tuple(out)
