"""An in-memory AMQ-style broker without I/O: addresses (anycast / multicast), wildcard and named
subscriptions, queues whose consumers select with filters (oldest match first, no window), outcomes,
per-address limits and dead letters.  `broker_filter.proxy.embedded` drives it from the daemon."""

from .addresses import ANYCAST, MULTICAST, AddressError, NodeName, SubscriptionName, parse_node, subscription_name
from .broker import (NOT_FOUND, RESOURCE_LIMIT_EXCEEDED, RESOURCE_LOCKED, Address, Broker, BrokerConfig,
                     BrokerError, Limits)
from .index import EqualityHint, PropertyIndex, equality_hint
from .queue import Consumer, Entry, Queue, Stored
from .wildcards import WildcardTrie, is_wildcard

__all__ = [
    "ANYCAST", "MULTICAST", "NOT_FOUND", "RESOURCE_LIMIT_EXCEEDED", "RESOURCE_LOCKED",
    "Address", "AddressError", "Broker", "BrokerConfig", "BrokerError", "Consumer", "Entry", "EqualityHint",
    "Limits", "NodeName", "PropertyIndex", "Queue", "Stored", "SubscriptionName", "WildcardTrie",
    "equality_hint", "is_wildcard", "parse_node", "subscription_name",
]
