"""The embedded broker: addresses, queues, subscriptions, limits and dead letters, in memory.

Theory of operation
-------------------
Sans-I/O: the daemon feeds in what clients do (publish, subscribe, credit, outcomes, detach) and
asks `dispatch()` which stored messages go to which consumer now; it never touches a socket, a
clock or a thread, so every rule here is tested without a network.

Addresses follow the AMQ model (`addresses`): an address has routing types; anycast routes each
message to one of its anycast queues (round robin; normally the one queue named like the address),
multicast to every subscription queue of the address plus every wildcard subscription whose pattern
matches (`wildcards`: the trie maps each pattern to its address, whose queues are the pattern's
subscriptions).  Addresses and queues are created on first use when `auto_create` is on.

Filters: on a queue (anycast) a consumer's filter picks messages out of the shared queue without
taking the others (`queue`); on a subscription (multicast) the filter is the subscription queue's
own filter, applied when a message is routed, so a subscription only ever holds what it selects.
Each address keeps a `SubscriptionIndex` of its multicast queues' filters, so a publish evaluates
only the filters that may select the message (`broker_filter.filters.index`).
No-local is a filter like any other: the receiver identity is handed to `Filter.evaluate`.

Limits are per address and count each published message once (queues share it by reference) with
its encoded size; a publish that would exceed them is refused with `amqp:resource-limit-exceeded`,
so memory stays bounded by the limits.  A message is in some queue from the moment `publish`
returns until a consumer accepts it, it is rejected, or its (private or unsubscribed) queue is
deleted: accepted messages are not lost while the process runs.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..filters.errors import LimitError
from ..filters.index import SubscriptionIndex
from .addresses import ANYCAST, MULTICAST, ROUTING_TYPES, AddressError, NodeName, parse_node, subscription_name
from .queue import Consumer, Entry, Queue, Stored
from .wildcards import WildcardTrie, check_pattern, is_wildcard

RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
NOT_FOUND = "amqp:not-found"
RESOURCE_LOCKED = "amqp:resource-locked"
INVALID_FIELD = "amqp:invalid-field"


class BrokerError(Exception):
    """A request the broker refuses; `condition` is the AMQP error condition to send."""

    def __init__(self, condition: str, description: str):
        super().__init__(description)
        self.condition = condition
        self.description = description


@dataclass(frozen=True)
class Limits:
    """Per-address bounds; None is unbounded."""

    max_messages: int | None = None
    max_bytes: int | None = None


@dataclass
class BrokerConfig:
    default_routing_type: str = ANYCAST
    auto_create: bool = True
    limits: Limits = field(default_factory=Limits)  # every address, unless overridden below
    max_total_bytes: int | None = None  # bytes of messages all addresses together may hold (None: unbounded)
    address_limits: dict[str, Limits] = field(default_factory=dict)
    dead_letter_address: str | None = None
    delimiter: str = "."
    dispatch_budget: int = 20_000  # filter evaluations per dispatch() call
    subscription_index: bool = True  # route a publish through each address's subscription index
    index_cache_size: int = 1024  # candidate lists remembered per address (0: none)

    def __post_init__(self) -> None:
        if self.default_routing_type not in ROUTING_TYPES:
            raise ValueError(f"default routing type must be one of {ROUTING_TYPES}, got {self.default_routing_type!r}")


class Address:
    __slots__ = ("name", "routing_types", "anycast", "multicast", "index", "limits", "messages", "bytes", "_rr")

    def __init__(self, name: str, routing_types: Iterable[str], limits: Limits,
                 index: SubscriptionIndex | None = None):
        self.name = name
        self.routing_types = set(routing_types)
        self.anycast: dict[str, Queue] = {}
        self.multicast: dict[str, Queue] = {}
        # The multicast queues' filters, so that a publish evaluates only those that may select it.
        self.index = index if index is not None else SubscriptionIndex()
        self.limits = limits
        self.messages = 0
        self.bytes = 0
        self._rr = 0

    def __repr__(self) -> str:
        return f"<Address {self.name} {sorted(self.routing_types)}>"


class Broker:
    def __init__(self, config: BrokerConfig | None = None, *, decode: Callable[[Any, Any], Any] | None = None):
        self.config = config or BrokerConfig()
        self.decode = decode  # (payload, sections or None for all) -> message as filters see it
        self.addresses: dict[str, Address] = {}
        self.queues: dict[str, Queue] = {}
        self._wildcards = WildcardTrie(self.config.delimiter)
        self._dirty: dict[Queue, None] = {}
        self.total_bytes = 0  # bytes of the messages held, over every address (`BrokerConfig.max_total_bytes`)
        self._private = itertools.count(1)
        self.dead_lettered = 0
        self.dead_letter_dropped = 0

    # ------------------------------------------------------------------ addresses and queues
    def _limits_for(self, name: str) -> Limits:
        return self.config.address_limits.get(name, self.config.limits)

    def declare_address(self, name: str, routing_types: Iterable[str] | str) -> Address:
        if isinstance(routing_types, str):
            routing_types = (routing_types,)
        addr = self.addresses.get(name)
        if addr is None:
            index = SubscriptionIndex(indexed=self.config.subscription_index, cache_size=self.config.index_cache_size)
            addr = self.addresses[name] = Address(name, routing_types, self._limits_for(name), index)
        else:
            addr.routing_types.update(routing_types)
        return addr

    def declare_queue(self, address: str, name: str | None = None, routing_type: str = ANYCAST, **kw: Any) -> Queue:
        if routing_type == MULTICAST and is_wildcard(address, self.config.delimiter):
            try:  # a wildcard subscription's pattern is bounded in words, and so its cost per publish
                check_pattern(address, "wildcard address", delimiter=self.config.delimiter)
            except LimitError as e:
                raise BrokerError(INVALID_FIELD, e.message) from None
        addr = self.declare_address(address, routing_type)
        name = name or address
        queue = self.queues.get(name)
        if queue is not None:
            if queue.address is not addr:
                raise BrokerError(INVALID_FIELD, f"queue {name!r} belongs to address {queue.address.name!r}")
            return queue
        queue = Queue(name, addr, routing_type, on_removed=self._on_removed, **kw)
        self.queues[name] = queue
        (addr.anycast if routing_type == ANYCAST else addr.multicast)[name] = queue
        if routing_type != ANYCAST:
            addr.index.register(queue, queue.filter)
        if routing_type == MULTICAST and is_wildcard(address, self.config.delimiter):
            queue.binding = address
            self._wildcards.add(address, address, addr)  # the pattern's address: its queues and their index
        return queue

    def delete_queue(self, queue: Queue) -> None:
        """Remove a queue and the messages in it (it must have no consumers)."""
        for c in list(queue.consumers):
            queue.remove_consumer(c)
        for entry in queue.entries():
            queue.drop(None, entry)
        self.queues.pop(queue.name, None)
        queue.address.anycast.pop(queue.name, None)
        if queue.address.multicast.pop(queue.name, None) is not None:
            queue.address.index.unregister(queue)
        if queue.binding is not None and not queue.address.multicast:  # the pattern's last subscription
            self._wildcards.remove(queue.binding, queue.binding)
        self._dirty.pop(queue, None)
        addr = queue.address
        if queue.temporary and queue.routing_type == ANYCAST and not addr.anycast and not addr.multicast:
            self.addresses.pop(addr.name, None)  # a dynamic node's address goes with it

    def _on_removed(self, stored: Stored) -> None:
        if stored.refs == 0:
            addr = stored.address
            addr.messages -= 1
            addr.bytes -= stored.size
            self.total_bytes -= stored.size

    def _resolve(self, node: NodeName, *, for_consumer: bool) -> tuple[Address, str]:
        """The address (created if allowed) and the routing type to use on it."""
        addr = self.addresses.get(node.address)
        routing = node.routing_type
        if addr is None:
            if not self.config.auto_create:
                raise BrokerError(NOT_FOUND, f"address {node.address!r} does not exist")
            addr = self.declare_address(node.address, routing or self.config.default_routing_type)
        if routing is None:
            if for_consumer:
                routing = ANYCAST if ANYCAST in addr.routing_types else MULTICAST
        elif routing not in addr.routing_types:
            if not self.config.auto_create:
                raise BrokerError(NOT_FOUND, f"address {node.address!r} has no {routing} routing")
            addr.routing_types.add(routing)
        return addr, routing or ""

    def consumer_routing(self, address: str | None, capabilities: Iterable[str] = ()) -> str | None:
        """The routing type a consumer attaching now to `address` would get, without creating
        anything: ANYCAST for a queue (an FQQN, `anycast://`, capability `queue`, an anycast
        address), MULTICAST for a subscription of its own; None if the name is not usable."""
        if address is None:
            return None
        try:
            node = parse_node(address, capabilities)
        except AddressError:
            return None
        if node.queue is not None:
            return ANYCAST  # one named queue: its consumers compete, whatever the address routes
        if node.routing_type is not None:
            return node.routing_type
        addr = self.addresses.get(node.address)
        if addr is None:
            return self.config.default_routing_type
        return ANYCAST if ANYCAST in addr.routing_types else MULTICAST

    def _named_queue(self, addr: Any, name: str, routing: str) -> Queue:
        """The queue an FQQN `address::name` names (declared if auto-create allows)."""
        queue = self.queues.get(name)
        if queue is None:
            if not self.config.auto_create:
                raise BrokerError(NOT_FOUND, f"queue {name!r} does not exist")
            return self.declare_queue(addr.name, name, routing)
        if queue.address is not addr:
            raise BrokerError(NOT_FOUND, f"queue {name!r} is not on address {addr.name!r}")
        return queue

    # ------------------------------------------------------------------ publishing
    def route(self, address: str, capabilities: Iterable[str] = ()) -> list[Queue]:
        """The queues a message sent to `address` goes to (creating what auto-create allows)."""
        addr, queues, multicast = self._routing(address, capabilities)
        if multicast:
            queues.extend(addr.multicast.values())
            self._add_wildcards(addr, queues, None)
        return queues

    def _routing(self, address: str, capabilities: Iterable[str]) -> tuple[Address, list[Queue], bool]:
        """(address, the anycast or named queue it routes to if any, whether it routes multicast)."""
        try:
            node = parse_node(address, capabilities)
        except AddressError as e:
            raise BrokerError(e.condition, str(e)) from None
        addr, routing = self._resolve(node, for_consumer=False)
        if node.queue is not None:
            return addr, [self._named_queue(addr, node.queue, routing or self.config.default_routing_type)], False
        queues: list[Queue] = []
        if routing in ("", ANYCAST) and ANYCAST in addr.routing_types:
            if not addr.anycast and self.config.auto_create:
                self.declare_queue(addr.name, addr.name, ANYCAST)
            if addr.anycast:
                ring = list(addr.anycast.values())
                queues.append(ring[addr._rr % len(ring)])
                addr._rr += 1
        return addr, queues, routing in ("", MULTICAST) and MULTICAST in addr.routing_types

    def _add_wildcards(self, addr: Address, queues: list[Queue], stored: Stored | None) -> None:
        """Append the wildcard subscriptions whose pattern matches `addr` (those that select `stored`,
        through each pattern address's index, when given)."""
        for pattern in self._wildcards.match(addr.name):
            if pattern is addr or not pattern.multicast:
                continue  # a publish to the pattern's own name already has its queues
            if stored is None:
                queues.extend(pattern.multicast.values())
            else:
                queues.extend(pattern.index.match(stored.message, check=lambda q: q.accepts(stored)))

    def publish(self, address: str, payload: Any, *, size: int | None = None, message: Any = None,
                capabilities: Iterable[str] = (), origin: str | None = None) -> int:
        """Store a message; returns how many queues took it (0: routed nowhere, dropped as for a
        topic without subscribers).  Raises BrokerError when refused (limits, unknown address).

        The address's multicast subscriptions are found through its `SubscriptionIndex`: only the
        filters that may select the message are evaluated, each by the queue (`Queue.accepts`)."""
        addr, queues, multicast = self._routing(address, capabilities)
        if size is None:
            size = len(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else 0
        stored = Stored(payload, size, addr, message, self.decode, origin)
        targets = [q for q in queues if q.accepts(stored)]
        if multicast:
            if addr.multicast:
                targets.extend(addr.index.match(stored.message, check=lambda q: q.accepts(stored)))
            self._add_wildcards(addr, targets, stored)
        if not targets:
            return 0
        self._check_limits(addr, size)
        addr.messages += 1
        addr.bytes += size
        self.total_bytes += size
        for q in targets:
            q.enqueue(stored)
            self._dirty[q] = None
        return len(targets)

    def _check_limits(self, addr: Address, size: int) -> None:
        lim = addr.limits
        if lim.max_messages is not None and addr.messages + 1 > lim.max_messages:
            raise BrokerError(RESOURCE_LIMIT_EXCEEDED,
                              f"address {addr.name!r} is full: {addr.messages} of {lim.max_messages} messages")
        if lim.max_bytes is not None and addr.bytes + size > lim.max_bytes:
            raise BrokerError(RESOURCE_LIMIT_EXCEEDED,
                              f"address {addr.name!r} is full: {addr.bytes} + {size} bytes exceeds {lim.max_bytes}")
        total = self.config.max_total_bytes
        if total is not None and self.total_bytes + size > total:
            raise BrokerError(RESOURCE_LIMIT_EXCEEDED,
                              f"the embedded broker is full: it holds {self.total_bytes} bytes over every address, "
                              f"and {size} more would exceed {total} (embedded.max_total_bytes)")

    # ------------------------------------------------------------------ consuming
    def subscribe(self, address: str | None, *, capabilities: Iterable[str] = (), filter: Any = None,
                  receiver: Any = None, link_name: str | None = None, container_id: str | None = None,
                  durable: bool = False, context: Any = None, browse: bool = False) -> Consumer:
        """Attach a consumer.  Raises BrokerError (not-found, resource-locked, invalid-field)."""
        caps = tuple(str(c) for c in capabilities or ())
        sub = subscription_name(link_name, container_id, caps, durable)
        if address is None:  # JMS unsubscribe / lookup: attach to an existing named subscription
            queue = self._lookup_subscription(link_name, container_id, caps)
            if queue is None:
                raise BrokerError(NOT_FOUND, f"no subscription named {link_name!r}")
            return self._attach(queue, None, receiver, context, link_name)
        try:
            node = parse_node(address, caps)
        except AddressError as e:
            raise BrokerError(e.condition, str(e)) from None
        addr, routing = self._resolve(node, for_consumer=True)
        if node.queue is not None:
            return self._attach(self._named_queue(addr, node.queue, routing), filter, receiver, context, link_name,
                                browse=browse)
        if routing == ANYCAST:
            queue = addr.anycast.get(addr.name) or next(iter(addr.anycast.values()), None)
            if queue is None:
                queue = self.declare_queue(addr.name, addr.name, ANYCAST)
            return self._attach(queue, filter, receiver, context, link_name, browse=browse)
        # multicast: a subscription queue holding what the filter selects
        if sub is None:
            name = f"{addr.name}.{uuid.uuid4().hex}"
            queue = self.declare_queue(addr.name, name, MULTICAST, filter_=filter, filter_receiver=receiver,
                                       shared=False, temporary=True)
            return self._attach(queue, None, receiver, context, link_name)
        queue = self.queues.get(sub.queue_name)
        if queue is not None and (queue.address is not addr or _describe(queue.filter) != _describe(filter)):
            if queue.consumers:
                raise BrokerError(RESOURCE_LOCKED, f"subscription {sub.name!r} is in use with another address or selector")
            self.delete_queue(queue)  # JMS: a changed topic or selector means a new subscription
            queue = None
        if queue is None:
            queue = self.declare_queue(addr.name, sub.queue_name, MULTICAST, filter_=filter, filter_receiver=receiver,
                                       durable=sub.durable, shared=sub.shared, temporary=not sub.durable)
        elif not queue.shared and queue.consumers:
            raise BrokerError(RESOURCE_LOCKED, f"durable subscription {sub.name!r} already has a consumer")
        queue.filter_receiver = receiver
        return self._attach(queue, None, receiver, context, link_name)

    def _lookup_subscription(self, link_name: str | None, container_id: str | None, caps: tuple) -> Queue | None:
        """The named subscription a null-source attach means (Qpid JMS's unsubscribe and reattach:
        the subscription's link name, no source): the source says neither durable nor shared, so
        each form is tried, the one its capabilities name first (durable and the connection's own,
        then shared, then shared and global)."""
        forms = [(True, False, False), (False, True, False), (True, True, False), (False, True, True),
                 (True, True, True)]
        for durable, shared, is_global in forms:
            sub = subscription_name(link_name, None if is_global else container_id,
                                    caps + (("shared",) if shared else ()) + (("global",) if is_global else ()),
                                    durable)
            queue = self.queues.get(sub.queue_name) if sub else None
            if queue is not None:
                return queue
        return None

    def subscribe_temporary(self, *, filter: Any = None, receiver: Any = None, context: Any = None,
                            link_name: str | None = None) -> Consumer:
        """A dynamic node: a new anycast queue (and address) of its own, deleted with its consumer."""
        name = f"temp.{uuid.uuid4().hex}"
        queue = self.declare_queue(name, name, ANYCAST, temporary=True)
        return self._attach(queue, filter, receiver, context, link_name)

    def declare_temporary(self) -> Queue:
        """A dynamic target's node (a JMS temporary queue): a new anycast queue that lasts until
        `release_temporary`, however many consumers come and go."""
        name = f"temp.{uuid.uuid4().hex}"
        queue = self.declare_queue(name, name, ANYCAST, temporary=True)
        queue.pinned = True
        return queue

    def release_temporary(self, name: str) -> None:
        """The dynamic target's link went: its node goes once no consumer is left."""
        queue = self.queues.get(name)
        if queue is None or not queue.pinned:
            return
        queue.pinned = False
        if not queue.consumers:
            self.delete_queue(queue)

    def _attach(self, queue: Queue, filter_: Any, receiver: Any, context: Any, name: str | None,
                browse: bool = False) -> Consumer:
        consumer = Consumer(queue, filter_, receiver, context=context, name=name,
                            browse=browse and queue.routing_type == ANYCAST)
        queue.add_consumer(consumer)
        self._dirty[queue] = None
        return consumer

    def close_consumer(self, consumer: Consumer, *, closed: bool = True) -> None:
        """Detach.  Unsettled messages go back in place.  A private or volatile subscription ends with
        its last consumer; a durable one only when its last link is closed (detach closed=true)."""
        if consumer.closed:
            return
        queue = consumer.queue
        queue.remove_consumer(consumer)
        self._dirty[queue] = None
        if queue.temporary and not queue.consumers and not queue.pinned:
            self.delete_queue(queue)
        elif queue.routing_type == MULTICAST and queue.durable and closed and not queue.consumers:
            self.delete_queue(queue)

    def flow(self, consumer: Consumer, credit: int) -> None:
        """Set the consumer's credit (messages it may be handed by dispatch)."""
        consumer.credit = max(0, int(credit))
        if not consumer.closed:
            self._dirty[consumer.queue] = None

    def settle(self, consumer: Consumer, entry: Entry, outcome: str, *, delivery_failed: bool = False,
               undeliverable_here: bool = False, unacquired: bool = False, annotations: dict | None = None) -> None:
        """Apply a delivery outcome: accepted | rejected | released | modified.  `unacquired`
        (released only): the consumer, a proxy, passed the message to nobody, so this hand-out does
        not count as an acquisition (the next consumer sees first-acquirer true).  `annotations`
        (modified only): message-annotations merged into the message's next deliveries."""
        queue = entry.queue
        if consumer.outstanding.get(entry.seq) is not entry:
            return  # already settled, or returned by a detach
        if outcome == "accepted":
            queue.accept(consumer, entry)
        elif outcome == "rejected":
            queue.drop(consumer, entry)
            self._dead_letter(entry)
        elif outcome == "released":
            if unacquired and entry.acquisitions > 0:
                entry.acquisitions -= 1
            queue.release(consumer, entry)
        elif outcome == "modified":
            if annotations:
                entry.annotations = {**(entry.annotations or {}), **annotations}
            queue.release(consumer, entry, delivery_failed=delivery_failed, undeliverable_here=undeliverable_here)
        else:
            raise ValueError(f"not an AMQP outcome: {outcome!r}")
        self._dirty[queue] = None

    def _dead_letter(self, entry: Entry) -> None:
        dla = self.config.dead_letter_address
        if not dla or entry.queue.address.name == dla:
            return
        try:
            stored = entry.stored
            self.publish(dla, stored.payload, size=stored.size, message=stored._full,
                         capabilities=("queue",), origin=stored.origin)
            self.dead_lettered += 1
        except BrokerError:
            self.dead_letter_dropped += 1

    # ------------------------------------------------------------------ dispatch
    @property
    def pending(self) -> bool:
        """True when dispatch() may have work."""
        return bool(self._dirty)

    def dispatch(self, budget: int | None = None) -> tuple[list[tuple[Consumer, Entry]], bool]:
        """Assign available messages to consumers with credit.  Returns (assignments, more):
        more=True when the evaluation budget ran out and dispatch should be called again soon."""
        budget = self.config.dispatch_budget if budget is None else budget
        out: list[tuple[Consumer, Entry]] = []
        while self._dirty and budget > 0:
            queue = next(iter(self._dirty))
            del self._dirty[queue]
            got, spent, finished = queue.dispatch(budget)
            out.extend(got)
            budget -= spent
            if not finished:
                self._dirty[queue] = None  # to the back: other queues get their turn
        return out, bool(self._dirty)

    # ------------------------------------------------------------------ inspection
    def stats(self) -> dict[str, Any]:
        return {
            "addresses": {
                a.name: {"routing_types": sorted(a.routing_types), "messages": a.messages, "bytes": a.bytes,
                         "queues": sorted([*a.anycast, *a.multicast]),
                         "subscription_index": a.index.stats()}
                for a in self.addresses.values()
            },
            "queues": {q.name: {"depth": len(q), "available": q.available, "consumers": len(q.consumers)}
                       for q in self.queues.values()},
            "dead_lettered": self.dead_lettered,
            "dead_letter_dropped": self.dead_letter_dropped,
        }


def _describe(f: Any) -> Any:
    return None if f is None else getattr(f, "description", repr(f))
