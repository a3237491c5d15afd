"""How a client names a node: routing type, FQQN and subscription identity, as AMQ brokers read them.

Theory of operation: a link's address and terminus capabilities say what the client wants.
`anycast://name` / capability `queue` asks for point-to-point (one queue, competing consumers),
`multicast://name` / capability `topic` for publish-subscribe (a subscription queue per receiver);
with neither, an existing address keeps its routing type and a new one gets the configured default.
`address::queue` (a fully qualified queue name) names one queue of an address.

Subscriptions follow the JMS 2.0 mapping used by Qpid JMS and Artemis: the receiver's link name is
the subscription name, scoped by the connection's container id unless the source carries the
capability `global`; the capability `shared` lets several links consume from one subscription, and
Qpid JMS then numbers the extra links (`sub|2`, `sub|global2`, `sub|volatile1`,
`sub|global-volatile1`), so the part before `|` is the subscription name.  A durable source
(terminus durability > 0 or expiry policy `never`) makes a durable subscription, which outlives its
links; closing the link (detach closed=true) ends it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

ANYCAST = "anycast"
MULTICAST = "multicast"
ROUTING_TYPES = (ANYCAST, MULTICAST)
FQQN_SEPARATOR = "::"
_PREFIXES = {"anycast://": ANYCAST, "multicast://": MULTICAST}
_CAPABILITIES = {"queue": ANYCAST, "topic": MULTICAST}
_SUB_SUFFIX = re.compile(r"^(?:global)?(?:-?volatile)?\d*$")


class AddressError(ValueError):
    """A name the broker cannot use; `condition` is the AMQP error to send."""

    condition = "amqp:invalid-field"


@dataclass(frozen=True)
class NodeName:
    """A parsed link address."""

    address: str
    routing_type: str | None = None  # None: no preference
    queue: str | None = None  # set for an FQQN


def parse_node(text: str | None, capabilities: Iterable[str] = ()) -> NodeName:
    """Parse a link address with its terminus capabilities."""
    if text is None or text == "":
        raise AddressError("an address is required")
    text = str(text)
    routing: str | None = None
    for prefix, kind in _PREFIXES.items():
        if text.startswith(prefix):
            routing = kind
            text = text[len(prefix):]
            break
    if routing is None:
        caps = {str(c) for c in capabilities or ()}
        wanted = {_CAPABILITIES[c] for c in caps if c in _CAPABILITIES}
        if len(wanted) == 1:
            routing = wanted.pop()
    queue = None
    if FQQN_SEPARATOR in text:
        text, queue = text.split(FQQN_SEPARATOR, 1)
        if not text or not queue:
            raise AddressError(f"fully qualified queue name needs 'address::queue', got {text}::{queue}")
    if not text:
        raise AddressError("an address is required")
    return NodeName(text, routing, queue)


@dataclass(frozen=True)
class SubscriptionName:
    """Identity of a named (shared and/or durable) subscription."""

    name: str
    container_id: str | None  # None for a global subscription
    shared: bool
    durable: bool

    @property
    def queue_name(self) -> str:
        base = self.name if self.container_id is None else f"{self.container_id}.{self.name}"
        if not self.durable and self.shared:
            base += ":shared-volatile"
        if self.container_id is None:
            base += ":global"
        return base


def subscription_name(link_name: str | None, container_id: str | None, capabilities: Iterable[str] = (),
                      durable: bool = False) -> SubscriptionName | None:
    """The named subscription a receiver asks for, or None for a private (non-durable, non-shared) one."""
    caps = {str(c) for c in capabilities or ()}
    shared = "shared" in caps
    if not (shared or durable) or not link_name:
        return None
    name = str(link_name)
    is_global = "global" in caps
    if "|" in name:
        base, suffix = name.split("|", 1)
        if _SUB_SUFFIX.match(suffix):
            name = base
            is_global = is_global or suffix.startswith("global")
    return SubscriptionName(name, None if is_global or not container_id else str(container_id), shared, durable)
