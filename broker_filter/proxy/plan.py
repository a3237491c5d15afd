"""A client's attach, decided before anything is done: pure functions from what the client asked and
what the daemon knows to what the daemon will do.

Theory of operation
-------------------
`plan_receiver(request, context)` and `plan_sender(request, context)` read no socket, open no link
and keep no state: they answer with one of the plans below, which the server carries out
(`ProxyServer._attach_outlet`, `_attach_inlet`).  Every refusal rule of an attach is here, in the
order the client meets them, with its wire condition (the refusal itself is the wire contract's,
`proxy.refusal`); `tests/proxy/test_plan.py` checks them as a table, without sockets.

A receiver (the client's link receives: the proxy's link is a sender):

  | order | when                                                          | plan                          |
  |-------|---------------------------------------------------------------|-------------------------------|
  | 1     | the source filter is not a map                                | Refuse invalid-field          |
  | 2     | a dynamic source, the upstream makes no dynamic nodes: the    | Reply (`replies`), or Refuse  |
  |       | daemon holds the reply address (if the user may consume)      | unauthorized-access           |
  | 2a    | a reply address of the daemon's (`sharing.is_reply_address`)  | Refuse not-allowed (its own   |
  |       |                                                               | link alone receives from it)  |
  | 3     | a null source, the upstream keeps no named subscriptions      | LookUpKept (Qpid JMS unsubscribe) |
  | 4     | the user may not consume (browse, for copy on a queue) there, | Refuse unauthorized-access    |
  |       | or keep a durable subscription there (a durable source)       |                               |
  | 5     | a queue another replica owns, the connection may be spliced   | Splice                        |
  | 6     | the filter does not compile                                   | Refuse invalid-field (its own condition) |
  | 7     | the upstream is not connected (reconnecting: AwaitUpstream)   | Refuse connection:forced      |
  | 8     | copy on a queue the upstream cannot browse                    | Refuse not-implemented        |
  | 9     | otherwise                                                     | Serve                         |

A sender (the client's link sends):

  | order | when                                                          | plan                          |
  |-------|---------------------------------------------------------------|-------------------------------|
  | 1     | the target is a transaction coordinator                       | Refuse not-implemented        |
  | 2     | a dynamic target, no dynamic nodes upstream or not connected  | Refuse not-implemented        |
  | 2a    | a reply address the daemon holds (`sharing.is_reply_address`) | ToReply (no permission asked: |
  |       |                                                               | the unguessable address is)   |
  | 3     | a null target, the upstream not connected (or AwaitUpstream)  | Refuse connection:forced      |
  | 4     | a null target                                                 | Relay (each message checked: `may_send`) |
  | 5     | the user may not send there                                   | Refuse unauthorized-access    |
  | 6     | the upstream is not connected (reconnecting: AwaitUpstream)   | Refuse connection:forced      |
  | 7     | a queue another replica owns, the connection may be spliced   | Splice                        |
  | 8     | otherwise                                                     | Publish                       |

Permissions are checked on the address the client used, once per attach; an address rule that
rewrites it needs the address it reaches granted too (a rewrite never widens what the client may do),
while a virtual address is the operator's narrowed view (its filter is always ANDed in) and its own
grant is enough.  Only the anonymous relay checks each message, by its `to`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..amqp import types as t
from ..filters import FilterError, compile_filter_set
from . import sharing
from .traits import Traits
from .upstream import FILTEX_KINDS

FIELD_FILTER = {t.symbol("field"): t.symbol("filter")}  # the error info naming the source filter

CONSUME, BROWSE, SEND, MANAGE, DURABLE = "consume", "browse", "send", "manage", "durable"


# ---------------------------------------------------------------------------- what the daemon knows
class Permissions:
    """What the plan asks of the permission model (`broker_filter.authorization`): None when the
    operation is allowed, else why not (one line naming the operation, the address and the user)."""

    def refusal(self, user: str | None, operation: str, address: str | None) -> str | None:
        return None


OPEN = Permissions()  # no security settings: every authenticated client may do everything


@dataclass(frozen=True)
class Context:
    """What an attach is decided against."""

    traits: Traits
    upstream_name: str
    upstream_up: bool
    route: Callable[[str | None], Any] = lambda address: None  # `Routing.route`, None when no rule applies
    routing_type: Callable[..., str | None] = lambda address, capabilities=(): None  # the upstream's address model
    permissions: Permissions = OPEN
    dialect: str = "jms"
    filter_limits: Any = None  # `config.Limits.filter_limits()`
    max_depth: int | None = None
    reconnecting: bool = False  # the upstream is down and being reconnected: an attach waits for it
    replicas: bool = False  # `[replicas]`: a queue may be owned by another replica
    splicing: bool = False  # ... and this connection may be spliced to it (`replicas.splice`, its first link)


# ---------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class ReceiverRequest:
    """A client's receiving link's attach, as far as the plan reads it."""

    address: str | None
    filter: Any = None  # the source's filter map as decoded (None: none)
    capabilities: tuple = ()
    copy: bool = False  # distribution-mode copy
    dynamic: bool = False
    null: bool = False  # a null source
    durable: bool = False  # a durable source (durability set, or expiry-policy never): a durable subscription
    user: str | None = None
    peer: bool = False  # opened by another replica (`[replicas]`): its client was checked there


@dataclass(frozen=True)
class SenderRequest:
    address: str | None
    capabilities: tuple = ()
    dynamic: bool = False
    coordinator: bool = False
    user: str | None = None
    peer: bool = False


# ---------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class Refuse:
    condition: str
    description: str
    info: dict | None = None
    reason: str | None = None  # the refusal's metric label, when not its condition's
    operation: str | None = None  # a permission refused: the operation and the address the client used
    address: str | None = None


@dataclass(frozen=True)
class AwaitUpstream:
    """The upstream is reconnecting: the attach waits for it (`resume.Resumption.await_attach`), at most
    `upstream.answer_timeout`, then is planned again."""


@dataclass(frozen=True)
class LookUpKept:
    """A null source: the durable subscription named by the link (Qpid JMS's unsubscribe)."""


@dataclass(frozen=True)
class Splice:
    """The connection goes whole to the owner of `address` (`engine.splice`), if it still can; if
    not, the attach is planned again with `Context.splicing` off."""

    address: str


@dataclass(frozen=True)
class Serve:
    """A receiver served from a feed (`ProxyServer._place`)."""

    route: Any
    routed: str | None  # the upstream address (after address rules)
    fs: Any  # the client's filter-set
    wanted: Any  # ... ANDed with a virtual address's
    decision: sharing.Decision
    browse: bool
    owned: bool  # a queue link served by the queue's owner (`[replicas]`)
    routing_type: str = ""


@dataclass(frozen=True)
class Reply:
    """A dynamic source the upstream cannot make: the daemon holds the reply address itself
    (`replies.serve`): request/reply (RabbitMQ's direct reply-to) without the broker."""


@dataclass(frozen=True)
class Relay:
    """A null target: each message goes to its `properties.to` (`sender.Relay`)."""


@dataclass(frozen=True)
class DynamicTarget:
    """A node of its own, named in the reply, gone with the link (a JMS temporary queue)."""


@dataclass(frozen=True)
class Publish:
    route: Any
    routed: str
    capabilities: tuple = field(default=())  # the upstream target's


@dataclass(frozen=True)
class ToReply(Publish):
    """A target that is a reply address of the daemon's (`replies`): carried out as a Publish is
    (`sender.open_inlet`), to the requester's link instead of the upstream."""


# ---------------------------------------------------------------------------- rules
def _refused(context: Context, user: str | None, operation: str, address: str | None) -> Refuse | None:
    why = context.permissions.refusal(user, operation, address)
    return None if why is None else Refuse("amqp:unauthorized-access", why, reason="unauthorized",
                                           operation=operation, address=address)


def _rewritten(context: Context, user: str | None, operation: str, address: str | None, route: Any) -> Refuse | None:
    """An address rule that rewrites the client's address: the address it reaches must be granted too,
    so a rewrite never widens what the client may do.  A virtual address is the operator's narrowed
    view (its filter is always ANDed in): the client's grant on it is enough."""
    if route is None or route.virtual or route.upstream == address:
        return None
    return _refused(context, user, operation, route.upstream)


def _not_connected(context: Context) -> Refuse | AwaitUpstream:
    if context.reconnecting:
        return AwaitUpstream()
    return Refuse("amqp:connection:forced", f"upstream {context.upstream_name} is not connected; retry later")


def plan_receiver(request: ReceiverRequest,
                  context: Context) -> Refuse | AwaitUpstream | LookUpKept | Splice | Serve | Reply:
    traits = context.traits
    raw = request.filter
    if raw is not None and not isinstance(raw, dict):
        return Refuse("amqp:invalid-field", "the source filter must be a map (a filter-set)", FIELD_FILTER)
    address = request.address
    if request.dynamic and not address and not traits.dynamic_sources:
        # (RabbitMQ 3.10 and 4.0 answer a dynamic source by ending the whole session; 4.2 makes a
        # volatile queue only when asked with its capability.)  The daemon holds the reply address.
        refused = None if request.peer else _refused(context, request.user, CONSUME, None)
        return refused if refused is not None else Reply()
    if sharing.is_reply_address(address):
        return Refuse("amqp:not-allowed", f"reply address {address} takes no other receiver: only the link it was "
                                          "made for receives from it")
    if request.null and not traits.named_subscriptions:
        return LookUpKept()
    route = context.route(address)
    caps = request.capabilities
    routed = route.upstream if route is not None else address
    rule_type = route.routing_type if route is not None else ""
    decision = sharing.decide(address=routed, capabilities=caps, copy=request.copy, rule_routing_type=rule_type,
                              routing_type=context.routing_type)
    # A browser: copy on a queue (Qpid JMS QueueBrowser: copy and the `queue` capability); copy with
    # `topic` is a subscription (Qpid JMS durable subscribers ask for copy too)
    browse = request.copy and "topic" not in caps and (
        "queue" in caps
        or sharing.ANYCAST in (sharing.address_form_routing(routed), context.routing_type(routed, caps)))
    if not request.peer and not request.null:  # (a null source names a subscription of the user's own)
        refused = _refused(context, request.user, BROWSE if browse else CONSUME,
                           address if not request.dynamic or address else None)
        if refused is None:
            refused = _rewritten(context, request.user, BROWSE if browse else CONSUME, address, route)
        if refused is None and request.durable and decision.subscription and not request.dynamic:
            refused = _refused(context, request.user, DURABLE, address)
        if refused is not None:
            return refused
    owned = (context.replicas and not request.peer and routed is not None and not decision.subscription
             and not browse and not request.dynamic)
    if owned and context.upstream_up and context.splicing:
        return Splice(routed)  # (its filter is the owner's to compile, or to refuse)
    try:
        bounds = {} if context.filter_limits is None else {"limits": context.filter_limits,
                                                             "max_depth": context.max_depth}
        fs = compile_filter_set(raw or {}, dialect=context.dialect, **bounds)
        # A virtual address's filter (compiled once, by the routing) AND the client's own: one
        # filter-set, pushed down as far as the upstream filters.
        wanted = route.virtual.combine(fs) if route is not None and route.virtual else fs
    except FilterError as e:
        return Refuse(e.condition, e.describe(), FIELD_FILTER)
    if not context.upstream_up:
        return _not_connected(context)
    if browse and not traits.browses_queues:
        return Refuse("amqp:not-implemented",
                      f"browsing a queue (distribution-mode copy) is not supported in front of {context.upstream_name}: "
                      "attach without distribution-mode copy to consume from it")
    return Serve(route, routed, fs, wanted, decision, browse, owned, rule_type)


def plan_sender(request: SenderRequest, context: Context) -> Refuse | AwaitUpstream | Relay | DynamicTarget | Splice | Publish:
    if request.coordinator:
        return Refuse("amqp:not-implemented", "transactions are not supported")
    address = request.address
    if address is None and request.dynamic:
        if not context.traits.dynamic_sources or not context.upstream_up:
            return Refuse("amqp:not-implemented",
                          f"dynamic targets (temporary queues) are not supported by upstream {context.upstream_name}")
        if not request.peer:
            refused = _refused(context, request.user, SEND, None)
            if refused is not None:
                return refused
        return DynamicTarget()
    if address is None:
        return Relay() if context.upstream_up else _not_connected(context)
    if sharing.is_reply_address(address):
        return ToReply(None, address)  # (held, or refused `amqp:not-found`, by `replies.open_inlet`)
    route = context.route(address)
    if not request.peer:
        refused = _refused(context, request.user, SEND, address) or _rewritten(context, request.user, SEND, address,
                                                                                  route)
        if refused is not None:
            return refused
    routed = route.upstream if route is not None else address
    rule_type = route.routing_type if route is not None else ""
    caps = sharing.upstream_capabilities(request.capabilities, rule_type)
    if not context.upstream_up:
        return _not_connected(context)
    if (context.splicing and context.replicas and not request.peer
            and not sharing.decide(address=routed, capabilities=request.capabilities, rule_routing_type=rule_type,
                                   routing_type=context.routing_type).subscription):
        return Splice(routed)  # (a producer on a queue: its publishes are the owner's, who consumes the queue)
    return Publish(route, routed, caps)


def may_send(permissions: Permissions, user: str | None, address: str) -> str | None:
    """An anonymous relay's message to `address` (its `to`): None when allowed, else why not."""
    return permissions.refusal(user, SEND, address)


_EXCHANGE = re.compile(r"^/exchange/([^/]+)/?$")


def push_down(upstream: Any, address: str | None, fs: Any,
              dialect: str) -> tuple[str | None, tuple, Any, tuple]:
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
