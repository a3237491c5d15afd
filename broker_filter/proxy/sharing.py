"""Which client receiving links share one upstream consumer: the rule, in one place.

Theory of operation
-------------------
A client receiving link is served by a feed (`broker_filter.proxy.forwarding.Feed`), and a feed is one
upstream consumer.  Whether two links may share a feed follows from what the source *is* in the
address model (AMQ's anycast and multicast; docs/proxy.md has the same table):

* **queue semantics** (anycast): the upstream has one queue whose consumers compete.  Every client
  link on the same queue with the same pushed-down filters shares one feed, which offers each message
  to one link that selects it — what a broker does for consumers with selectors.  A message no link
  selects must stay for others: it is never consumed for not matching.
* **subscription semantics** (multicast): every receiver gets every message its filter selects.
  The daemon's non-durable, unnamed, non-dynamic subscription links on one upstream address (with
  the same pushed-down filters) share one upstream subscription, which gives each link its own copy
  of what its filter selects (`broker_filter.proxy.fanout`: one decode and one index match per
  message, per-link buffers, a slow link moved to a subscription of its own).  Durable and dynamic
  links get an upstream subscription of their own: their identity lives in the broker.
* **named subscriptions** (JMS 2.0 shared subscriptions: capability `shared` on a subscription
  source, named by the link name): the links of one subscription share one feed, because the
  subscription is one queue shared by name.

The first of these that speaks decides (`decide`):

| what says so | queue (one shared consumer) | subscription (one shared upstream subscription, a copy per link) |
|---|---|---|
| an `[[address_rules]]` entry | `routing_type = "anycast"` | `routing_type = "multicast"` |
| the client's source distribution mode | | `copy` |
| the client's source capabilities | `queue` | `topic` |
| the upstream's address model (`Upstream.routing_type`) | anycast, FQQN `a::q`, RabbitMQ `/queue/`, `/amq/queue/`, `/queues/` | multicast, wildcard subscriptions, RabbitMQ `/topic/`, `/exchange/`, `/exchanges/` |
| nothing | every other address | |

Unknown means queue: treating a subscription as a queue splits messages between subscribers
(visible, and corrected below), but treating a queue as a subscription would consume messages another
consumer wants (a loss).  When the upstream's attach reply then says the source is a subscription
(distribution mode `copy`), the proxy stops sharing that feed (`ProxyServer` re-keys it), and when it
says a source the proxy took for a subscription is shared, non-matching messages are no longer
consumed on it (`FeedBinding.on_consumer_ready`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..broker.addresses import subscription_name

QUEUE = "queue"
SUBSCRIPTION = "subscription"
KEPT = "durable"  # the first item of a feed key of a durable subscription the proxy keeps
NAMED = "named"  # ... of a named shared subscription (its links share the feed by name)
ANYCAST = "anycast"
MULTICAST = "multicast"

# Address forms any AMQ-style or RabbitMQ upstream gives a meaning to (first match wins).
ADDRESS_FORMS: tuple[tuple[str, str], ...] = (
    ("anycast://", ANYCAST),
    ("multicast://", MULTICAST),
    ("/amq/queue/", ANYCAST),
    ("/queue/", ANYCAST),
    ("/queues/", ANYCAST),
    ("/topic/", MULTICAST),
    ("/exchange/", MULTICAST),
    ("/exchanges/", MULTICAST),
)
FQQN_SEPARATOR = "::"

# The reply addresses the daemon holds itself (`replies`: a dynamic source in front of an upstream
# that makes no dynamic nodes): RabbitMQ 4's queue form, so that RabbitMQ's clients publish to them,
# under a name no broker queue of the daemon's has.  Never sent upstream.
REPLY_PREFIX = "/queues/broker-filter.reply-to."


def is_reply_address(address: str | None) -> bool:
    """Whether `address` has the form of a reply address the daemon holds (`replies`)."""
    return bool(address) and address.startswith(REPLY_PREFIX)


def exchange_subscription(address: str | None) -> bool:
    """Whether a receiver on `address` subscribes to a RabbitMQ 4 exchange (`/exchanges/X[/KEY]`):
    RabbitMQ 4 consumes only from queues, so in front of it the daemon declares and binds a queue
    of its own for the subscription (`receiver.Receivers.subscribe_on_own_queue`)."""
    return bool(address) and address.startswith("/exchanges/") and len(address) > len("/exchanges/")


@dataclass(frozen=True)
class Decision:
    """How a client link's source is served: `semantics` is QUEUE or SUBSCRIPTION; `reason` says what
    decided it (for logs, the snapshot and tests)."""

    semantics: str
    reason: str

    @property
    def subscription(self) -> bool:
        return self.semantics == SUBSCRIPTION


def address_form_routing(address: str | None) -> str | None:
    """The routing type an address's own form states (prefixes, an FQQN), or None."""
    if not address:
        return None
    for prefix, routing in ADDRESS_FORMS:
        if address.startswith(prefix):
            return routing
    if FQQN_SEPARATOR in address:
        return ANYCAST
    return None


def upstream_capabilities(capabilities: Iterable[str], rule_routing_type: str = "") -> tuple[str, ...]:
    """The terminus capabilities to give the upstream: the client's, with an address rule's routing
    type stated as `topic` / `queue` (so an AMQ-style upstream routes the address the same way)."""
    caps = tuple(str(c) for c in capabilities or ())
    if not rule_routing_type:
        return caps
    wanted = "topic" if rule_routing_type == MULTICAST else "queue"
    return tuple(c for c in caps if c not in ("topic", "queue")) + (wanted,)


def decide(*, address: str | None, capabilities: Iterable[str] = (), copy: bool = False,
           rule_routing_type: str = "", routing_type: Any = None, upstream: Any = None) -> Decision:
    """Queue or subscription semantics for a client receiving link (see the table above).

    address: the upstream address (after address rules); capabilities: the client's source
    capabilities; copy: the client asked for distribution mode `copy`; rule_routing_type: the routing
    type of the address rule that matched ("" for none); routing_type: the upstream's address model
    (`Upstream.routing_type`), or `upstream` whose it is."""
    if rule_routing_type:
        kind = SUBSCRIPTION if rule_routing_type == MULTICAST else QUEUE
        return Decision(kind, f"address rule ({rule_routing_type})")
    if copy:
        return Decision(SUBSCRIPTION, "distribution mode copy")
    caps = {str(c) for c in capabilities or ()}
    if "topic" in caps and "queue" not in caps:
        return Decision(SUBSCRIPTION, "capability topic")
    if "queue" in caps and "topic" not in caps:
        return Decision(QUEUE, "capability queue")
    ask = routing_type if routing_type is not None else upstream.routing_type if upstream is not None else None
    routing = ask(address, tuple(caps)) if ask is not None else None
    if routing == MULTICAST:
        return Decision(SUBSCRIPTION, "upstream address model (multicast)")
    if routing == ANYCAST:
        return Decision(QUEUE, "upstream address model (anycast)")
    return Decision(QUEUE, "unknown address (queue: nothing is consumed for not matching)")


def feed_key(decision: Decision, *, address: str | None, pushed: Iterable[Any], local: Any, serial: int,
             link_name: str | None = None, container_id: str | None = None,
             capabilities: Iterable[str] = (), durable: bool = False, dynamic: bool = False,
             kept: bool = False) -> tuple:
    """The key of the feed a link joins: links with equal keys share one upstream consumer.

    Queues: the upstream address and the pushed-down filters (the upstream applies those, so only
    links asking for the same upstream view can share it).  Subscriptions: a key of their own
    (`serial` is unique per link) when durable, dynamic or named (a JMS subscription: its identity
    lives in the broker), a named shared subscription's links sharing by name (and by their filters:
    a JMS subscription has one selector); every other subscription link joins the address's shared
    upstream subscription (`broker_filter.proxy.fanout`), by the upstream address and pushed-down
    filters.  `kept`: the proxy itself keeps a durable (non-shared) subscription across its
    subscriber's detaches (an upstream without named subscriptions): its key is its name, address and
    filters, so the subscriber's next attach finds the same feed."""
    pushed_key = tuple((str(e.key), repr(e.value)) for e in pushed)
    if dynamic and address is None:
        return ("subscription", serial)  # a dynamic node of its own: never shared
    if not decision.subscription:
        return ("queue", address, pushed_key)
    named = subscription_name(link_name, container_id, capabilities, durable)
    if named is not None and named.shared:
        return (NAMED, address, named.queue_name, pushed_key, _canonical(local))
    if named is not None and kept:
        return (KEPT, address, named.queue_name, pushed_key, _canonical(local))
    if named is None and not durable and not dynamic:
        return ("fanout", address, pushed_key)
    return ("subscription", serial)


def _canonical(filter_set: Any) -> tuple:
    """A key for the filter-set (`FilterSet`) evaluated here: its entries' kinds and values, sorted."""
    return tuple(sorted((e.kind, repr(e.value)) for e in filter_set.entries))


def kept_name(link_name: str | None, container_id: str | None) -> str | None:
    """The name under which the proxy keeps the durable subscription a link names (a null-source
    lookup, which carries no durability or capabilities: Qpid JMS's unsubscribe)."""
    named = subscription_name(link_name, container_id, (), True)
    return None if named is None else named.queue_name
