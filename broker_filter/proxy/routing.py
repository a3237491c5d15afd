"""Where a client's address goes: the `[[address_rules]]` and `[virtual_addresses.NAME]` settings applied.

Theory of operation.  The configuration keeps the rules and virtual addresses as they were written
and checked (`broker_filter.config.AddressRule`, `VirtualAddress`); `Routing.from_config(config)`
compiles each virtual address's filter once, under the configured limits, and resolves the address
a client attaches to: a virtual address first (its upstream address then goes through the rules
too), else the first rule whose AMQ wildcard pattern (`*` one word, `#` zero or more) matches, else
the address as it is.

    routing = Routing.from_config(config)
    route = routing.route("orders.red")     # Route(address, upstream, routing_type, virtual, rule)
    route.virtual.combine(client_filter_set) if route.virtual else client_filter_set

The compiled filter lives here, not on the configuration: the configuration's `VirtualAddress`
stays the setting as written (`VirtualAddress.compile` is the one way to compile it, which loading
the configuration also runs, to refuse a filter that does not compile).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..config import AddressRule, Config, Limits, VirtualAddress
from ..filters import FilterSet
from ..filters.wildcards import wildcard_matcher


@functools.lru_cache(maxsize=1024)
def _matcher(pattern: str) -> Callable[[str], bool]:
    return wildcard_matcher(pattern)


def rule_matches(rule: AddressRule, address: str) -> bool:
    """Whether `address` matches the rule's AMQ wildcard pattern."""
    return _matcher(rule.pattern)(address)


def rewrite(rule: AddressRule, address: str) -> str:
    """The upstream address of `address` under the rule (`{address}` replaced)."""
    return rule.upstream.replace("{address}", address)


@dataclass(frozen=True)
class Virtual:
    """A virtual address with its filter compiled: the messages of `upstream` that pass `filter_set`."""

    settings: VirtualAddress
    filter_set: FilterSet

    @property
    def name(self) -> str:
        return self.settings.name

    def combine(self, client: FilterSet) -> FilterSet:
        """This address's filter AND a client's FilterSet (echo only the client's own `applied`)."""
        return FilterSet(tuple(self.filter_set.entries) + tuple(client.entries), tuple(client.ignored))


@dataclass(frozen=True)
class Route:
    """What an address attached by a client resolves to."""

    address: str  # as the client sent it
    upstream: str  # the address used upstream
    routing_type: str  # "" | anycast | multicast
    virtual: Virtual | None = None
    rule: AddressRule | None = None


class Routing:
    """The address rules in order and the virtual addresses by name, their filters compiled."""

    def __init__(self, rules: Iterable[AddressRule] = (), virtual: Mapping[str, VirtualAddress] | None = None,
                 limits: Limits | None = None):
        self.rules = tuple(rules)
        limits = limits or Limits()
        self.virtual = {name: Virtual(v, v.compile(limits)) for name, v in (virtual or {}).items()}

    @classmethod
    def from_config(cls, config: Config) -> Routing:
        return cls(config.address_rules, config.virtual_addresses, config.limits)

    def route(self, address: str) -> Route:
        """Resolve a client's address: a virtual address first, then the first matching address rule."""
        virtual = self.virtual.get(address)
        if virtual is not None:
            upstream = virtual.settings.upstream
            rule = self.rule_for(upstream)
            routing = virtual.settings.routing_type or (rule.routing_type if rule else "")
            return Route(address, rewrite(rule, upstream) if rule else upstream, routing, virtual, rule)
        rule = self.rule_for(address)
        if rule is None:
            return Route(address, address, "")
        return Route(address, rewrite(rule, address), rule.routing_type, None, rule)

    def rule_for(self, address: str) -> AddressRule | None:
        """The first rule matching `address` (None: none does)."""
        for rule in self.rules:
            if rule_matches(rule, address):
                return rule
        return None


def vhost_asked(hostname: str | None) -> str | None:
    """The vhost a client's open frame asks for in its hostname (`vhost:NAME`, RabbitMQ's form; an
    empty name is `/`), or None when it names none (then the upstream URL's vhost is served)."""
    if hostname and hostname.startswith("vhost:"):
        return hostname[len("vhost:"):] or "/"
    return None
