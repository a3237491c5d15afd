"""A client's receiving links: the attach carried out (`plan.plan_receiver` decides it), the link
placed on a feed, the attach answered, and the client's credit, drain and outcomes.

Theory of operation
-------------------
A planned receiver (`plan.Serve`) becomes an `Outlet` on a feed (`forwarding`): `place` pushes the
filters down as far as the upstream evaluates them (`plan.push_down`), keys the feed
(`sharing.feed_key`: which links share one upstream consumer) and joins the open feed of that key
or opens one (`FeedRegistry.open_feed`), holds a durable subscription on the broker
(`durable.hold_on_broker`), declares the queue a subscription's feed consumes
(`subscribe_on_own_queue`: it outlives an upstream reconnect, `resume_subscription`), or waits for a
feed whose offered filters await the upstream's answer.
The attach reply is sent only once the feed's upstream consumer is attached (`complete`, called by
`FeedBinding.on_consumer_ready`), so an upstream refusal reaches the client as an attach refusal.
The link is one object, a `ReceiverLink` (its `Link.handler`, see `links`): the client's
dispositions come to its `transfer` straight from the engine; its flow sets the outlet's credit
(`Receivers.credit`), and a drain waits for what the upstream had ready (`Receivers.drain`).  Its
state goes attaching -> attached (`complete`), awaiting upstream while its upstream connection is
down (`resume`), moving while its queue's owner changes (`rehoming`), and gone with the link.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ..engine._cproton import lib
from ..engine.endpoints import LOCAL_ACTIVE, LOCAL_CLOSED, REMOTE_CLOSED, Link, Terminus
from ..filters import FilterSet
from . import plan, replies, sharing, topology
from .feeds import FeedBinding, offer_identity
from .forwarding import Outcome, Outlet, filter_identity
from .durable import UNSETTLED_STATE
from .links import ClientLinkObject
from .records import ClientConnection, Placement, connection_state, link_state, state_of
from .refusal import close_link
from .upstream import ConsumerSpec, ErrorInfo, Passthrough
from .wire import remote_outcome

# A drain (see `Receivers.drain`) waits for the upstream's messages until none came for DRAIN_QUIET
# seconds (looking every DRAIN_STEP), at most DRAIN_LIMIT seconds.
DRAIN_QUIET = 0.15
DRAIN_STEP = 0.05
DRAIN_LIMIT = 2.0

log = logging.getLogger("broker_filter.proxy")


FILTER_CAPABILITIES = (
    "APACHE.ORG:LEGACY_AMQP_EXCHANGE_FILTERS",
    "APACHE.ORG:JMS_FILTERS",
    "APACHE.ORG:LOGIC_FILTERS",
    "APACHE.ORG:SELECTOR",
    "APACHE.ORG:NO_LOCAL",
    "AMQP_FILTEX_PROP_V1_0",
    "AMQP_FILTEX_SQL_V1_0",
)


class ReceiverLink(ClientLinkObject):
    """A client's receiving link (the proxy sends on it): its place on a feed (`outlet`), the client's
    dispositions (`transfer`, the per-message path) and flow (`flow`).  See `links` for its states."""

    __slots__ = ("outlet",)

    def __init__(self, server: Any, link: Link, conn: ClientConnection, outlet: Outlet):
        self.outlet = outlet
        super().__init__(server, link, conn)

    def transfer(self, dlv) -> None:
        """A client's disposition of a delivery (a pointer) sent on this link (the outlet's feed is
        None once the link was dropped)."""
        outlet = self.outlet
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

    def flow(self) -> None:
        self.server.receivers.credit(self.link)


class Receivers:
    """One server's client receiving links (see the module's docstring)."""

    def __init__(self, server: Any):
        self.server = server

    def attach(self, link, conn: ClientConnection) -> None:
        src = link.remote_source
        request = plan.ReceiverRequest(address=src.address, filter=src.filter, capabilities=src.capabilities,
                                       copy=src.distribution_mode == "copy", dynamic=bool(src.dynamic), null=src.null,
                                       durable=bool(src.durability) or src.expiry_policy == "never",
                                       user=conn.user, peer=conn.peer is not None)
        context = self.server.plan_context(conn)
        decided = plan.plan_receiver(request, context)
        if isinstance(decided, plan.Splice):
            if self.server._splice(link, decided.address):
                return
            decided = plan.plan_receiver(request, dataclasses.replace(context, splicing=False))
        if isinstance(decided, plan.Refuse):
            self.server._refuse_planned(link, conn, decided)
            return
        if isinstance(decided, plan.AwaitUpstream):
            self.server.resumption.await_attach(link, conn, self.attach)
            return
        if isinstance(decided, plan.Reply):  # request/reply: the daemon holds the reply address
            replies.serve(self.server, link, conn)
            return
        if isinstance(decided, plan.LookUpKept):
            # Qpid JMS's unsubscribe (a null source, the subscription's link name): the durable
            # subscription the proxy keeps under that name, if any.
            self.server.durable.look_up(link, conn)
            return
        fs, wanted = decided.fs, decided.wanted
        state = link_state(link)
        state.fs = fs
        state.subscription = decided.decision.subscription
        state.operation, state.address = plan.BROWSE if decided.browse else plan.CONSUME, src.address
        outlet = Outlet(f"{conn.id}:{link.name}", wanted, conn.id, io_ref=link,
                        max_size=link.remote_max_message_size)
        state.outlet = outlet
        conn.links.add(link)
        ReceiverLink(self.server, link, conn, outlet)  # (the link's handler from now on)
        if outlet_presettled_requested(link):
            link.set_snd_settle_mode(True)
            outlet.presettled = True
        state.place = Placement(decided.routed, wanted, decided.decision, src.capabilities, decided.routing_type,
                                decided.browse, decided.owned)
        self.place(link, outlet)

    def place(self, link, outlet: Outlet) -> None:
        """Serve a client's receiving link: join the feed of its kind on its upstream, or open one
        (a queue link under `[replicas]`: on the upstream of the queue's owner)."""
        state = state_of(link)
        p: Placement = state.place
        src = link.remote_source
        fs: FilterSet = state.fs
        routed, wanted, decision, caps, browse = p.routed, p.wanted, p.decision, p.caps, p.browse
        subscription = decision.subscription
        upstream, via = self.server.upstream, None
        if p.owned:
            via, peer_upstream = self.server.replicas.upstream_for(routed)
            if via is not None:
                upstream = peer_upstream
        up_address, pushed, local, offered = plan.push_down(upstream, routed, wanted, self.server.dialect)
        outlet.filter = local
        outlet.identity = filter_identity(local, outlet.receiver)
        passthrough = ()
        if fs.ignored and upstream.traits.passes_unknown_filters:
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
            container_id=self.server.guard.subscriber(connection_state(link.connection), link),
            offered=offered,
            passthrough=passthrough,
        )
        # The offered filters are in the key: links on one upstream consumer ask it the same.
        # A durable subscription (shared or not) in front of an upstream without named
        # subscriptions: the proxy keeps it across its subscribers' detaches, as a queue on the
        # broker (RabbitMQ 4, `_hold_on_broker`), else with its upstream consumer left attached.
        kept = (subscription and via is None and not browse and not spec.dynamic
                and not upstream.traits.named_subscriptions)
        durable = bool(src.durability) or spec.expiry_policy == "never"
        key = sharing.feed_key(decision, address=up_address, pushed=pushed + offered + passthrough, local=local,
                               serial=next(self.server._sub_ids), link_name=link.name,
                               container_id=spec.container_id, capabilities=caps,
                               durable=durable, dynamic=spec.dynamic, kept=kept)
        kept_name = key[2] if key[0] == sharing.KEPT or (key[0] == sharing.NAMED and durable and kept) else None
        if kept_name is not None and key[0] == sharing.NAMED and self.server.durable.in_use_otherwise(link, kept_name, key):
            return
        if kept_name is not None and not (pushed or offered or passthrough):
            held = topology.exchange_binding(up_address)
            pair = topology.topology(upstream) if held is not None else None
            if pair is not None:
                # RabbitMQ 4 (or 3.x with `upstream.management_url`): the subscription is a durable
                # queue of its own on the broker
                existing = self.server.registry.feeds.get(key)
                if existing is None or existing.closed:
                    self.server.durable.hold_on_broker(pair, link, outlet, key, spec, kept_name, held, up_address, local)
                    return
                kept_name = None  # (attached already: the link joins that feed, below)
        if kept_name is not None:
            if self.server.durable.beyond_kept_limit(link, kept_name):
                return
            old = self.server.registry.kept.pop(kept_name, None)
            if old is not None and old.key != key:
                # JMS: subscribing again under the name with another selector or topic replaces it
                log.info("durable subscription %r resubscribed with another address or selector: the "
                         "one kept is ended", kept_name)
                self.server.registry.end_feed(old, closed=True)
        own_queue = False
        if (subscription and kept_name is None and via is None and not browse and not spec.dynamic
                and key[0] != sharing.NAMED):  # (a JMS shared subscription is one queue, shared by name)
            if upstream.traits.serves_management and sharing.exchange_subscription(up_address):
                # RabbitMQ 4 consumes queues only: a queue of the daemon's own, for this link alone
                key, own_queue = ("subscription", next(self.server._sub_ids)), True
            else:
                own_queue = (key[0] in ("fanout", "subscription") and self.server.replicas is None
                             and not (pushed or offered or passthrough) and topology.declares_queues(upstream)
                             and topology.exchange_binding(up_address) is not None)
        if browse:  # a browser reads the queue from its head on an upstream consumer of its own
            key = ("subscription", next(self.server._sub_ids))
        if via is not None:  # consuming through the queue's owner: not the feed of one consuming here
            key = key + (("via", via),)
        binding = self.server.registry.feeds.get(key)
        base = None
        if (binding is None or binding.closed) and not decision.subscription:
            # A feed whose upstream turned the offered filters down serves every link of its queue.
            base = sharing.feed_key(decision, address=up_address, pushed=pushed, local=local, serial=0)
            if via is not None:
                base = base + (("via", via),)
            binding = self.server.registry.feeds.get(base) or self.server.registry.feed_aliases.get(base)
            if binding is None or binding.closed:
                # One whose answer is not in yet: wait for it rather than open a second upstream
                # consumer on the queue, which would hold a share of its messages out of reach.
                deciding = self.server.registry.deciding.get(base)
                if deciding is not None and not deciding.closed:
                    outlet.io_owner = deciding
                    deciding.pending.append(outlet)
                    deciding.awaiting[outlet] = (key, spec)
                    return
        if (binding is None or binding.closed) and own_queue:
            self.subscribe_on_own_queue(link, outlet, key, spec, up_address)
            return
        if binding is None or binding.closed:
            opened = self.server.registry.open_feed(key, spec, subscription, outlet, upstream, via)
            opened.kept_name, opened.kept_address = kept_name, src.address
            if offered and base is not None and base not in self.server.registry.deciding:
                self.server.registry.deciding[base] = opened
                opened.deciding_key = base
            return
        self.join(binding, outlet)

    def subscribe_on_own_queue(self, link, outlet: Outlet, key: tuple, spec: ConsumerSpec, address: str) -> None:
        """A subscription to an exchange (`/topic/K`, `/exchange/X[/K]`, RabbitMQ 4's `/exchanges/X[/K]`)
        in front of a RabbitMQ the daemon can declare queues on (RabbitMQ 4's `/management`, 3.x's HTTP
        API given as `upstream.management_url`): its feed (`key`: the address's shared subscription, or a
        link's own) consumes a queue of the daemon's own, declared and bound first
        (`topology.declare_subscription`: not exclusive, not auto-delete, `x-expires`
        `upstream.subscription_expiry`), rather than one RabbitMQ makes and names (`amq.gen-`), which
        the daemon could not find again after a reconnect.  Links that come meanwhile join the feed
        and wait.  The queue goes when the feed ends (`topology.end_subscription`); it outlives a lost
        upstream connection, and is consumed again with what was routed to it meanwhile when the
        upstream is back (`resume_subscription`)."""
        upstream = self.server.upstream
        pair = topology.topology(upstream)
        if pair is None:
            self.server._drop_link(link)
            self.server._refuse(link, "amqp:connection:forced",
                                f"upstream {upstream.name} is not connected; retry later")
            return
        binding = self.server.registry.declare_feed(key, spec, True, outlet, upstream)

        def ready(queue: str, failure: tuple[str, str] | None) -> None:
            if failure is None:
                binding.consume_own_queue(queue)
            elif not upstream.connected:  # the upstream went: its links wait for it, and are placed again
                self.server.resumption.suspend_feed(binding)
            else:
                names = [o.io_ref.name for o in binding.pending if o.io_ref is not None]
                log.warning("upstream %s refused link %s (%s)%s its subscription's queue: %s: %s", upstream.name,
                            names[0] if names else "-", address,
                            f" and {len(names) - 1} more waiting with it," if len(names) > 1 else "",
                            failure[0], failure[1])
                self.server.registry.fail_feed(binding, ErrorInfo(failure[0], f"subscription to {address}: {failure[1]}"))

        # (its subscribers went meanwhile, or the daemon stops: the queue goes too)
        binding.declare_queue(pair, lambda: binding.closed or self.server.stopping, ready)

    def resume_subscription(self, held: Any, outlets: list[Outlet]) -> None:
        """The upstream is back under the links of a subscription's feed that was suspended (`resume`):
        its queue (`subscribe_on_own_queue`) is looked up and, still there with what was routed to it
        meanwhile, consumed again by one feed serving them all, as before; gone (expired, the broker
        restarted), the links are detached with the reason, never left with a silent gap."""
        upstream = self.server.upstream
        resumption = self.server.resumption
        pair = topology.topology(upstream)
        if pair is None:  # (lost again already)
            resumption.suspend_subscription(held, outlets)
            return
        queue = held.queue

        def found(reply: topology.Reply) -> None:
            staying = [o for o in outlets if o.io_ref is not None and state_of(o.io_ref).outlet is o
                       and o.io_ref.local_state != LOCAL_CLOSED and o.io_ref.remote_state != REMOTE_CLOSED]
            if not staying or self.server.stopping:
                topology.end_subscription(upstream, queue)  # the subscribers went meanwhile
                return
            if reply.ok:
                key = held.key
                existing = self.server.registry.feeds.get(key)
                if existing is not None and not existing.closed:  # (a new link's feed took the key meanwhile:
                    key = key + (("resumed", next(self.server._sub_ids)),)  # one of the same kind beside it)
                binding = self.server.registry.declare_feed(key, held.spec, True, staying[0], upstream)
                for o in staying[1:]:
                    self.join(binding, o)
                binding.consume_own_queue(queue)
                resumption.resumed(len(staying))
                log.info("upstream %s is back: %d subscription link(s) of %s resumed on their queue %s",
                         upstream.name, len(staying), held.spec.address, queue)
                return
            if reply.status is None and not upstream.connected:  # the upstream went again: wait again
                resumption.suspend_subscription(held, staying)
                return
            address = held.spec.address
            if reply.status == "404":
                why = (f"subscription to {address} ended: its queue {queue} on upstream {upstream.name} was gone "
                       f"when the upstream connection came back (expired after "
                       f"{self.server.config.upstream.subscription_expiry:g} s, upstream.subscription_expiry, "
                       "or deleted with a broker restart): what was routed to it meanwhile is lost; subscribe again")
            else:
                why = (f"subscription to {address} ended: its queue {queue} on upstream {upstream.name} could not be "
                       f"found again after the upstream connection came back ({reply.describe()})")
                topology.end_subscription(upstream, queue)
            for o in staying:
                resumption.detach(o.io_ref, "amqp:connection:forced", why)

        pair.call("GET", topology.queue_path(queue), None, found)

    def join(self, binding: FeedBinding, outlet: Outlet) -> None:
        """The outlet is served by an open feed: at once if its upstream consumer is ready."""
        outlet.io_owner = binding
        if binding.ready:
            self.complete(binding, outlet)
        else:
            binding.pending.append(outlet)

    def complete(self, binding: FeedBinding, outlet: Outlet) -> None:
        link = outlet.io_ref
        if link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED:
            return
        if binding.evaluated:
            # What the upstream evaluates for this feed is not evaluated again here.
            outlet.filter = outlet.filter.subset(lambda e: offer_identity(e) not in binding.evaluated)
            outlet.identity = filter_identity(outlet.filter, outlet.receiver)
        if link.local_state == LOCAL_ACTIVE:  # attached before: moved to its queue's new owner, or resumed
            binding.feed.add_outlet(outlet)
            link.handler.attached()
            self.credit(link)
            return
        state = state_of(link)
        fs: FilterSet = state.fs
        src = link.remote_source
        address, dynamic = src.address, False
        if src.dynamic and not src.address:
            address = binding.info.address if binding.info is not None else None
            if not address:
                self.server._drop_link(link)
                close_link(link, "amqp:not-implemented",
                           f"dynamic sources are not supported by upstream {self.server.upstream.name}")
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
            source = dataclasses.replace(source, address=binding.info.address, durability=UNSETTLED_STATE,
                                         expiry_policy="never", distribution_mode="copy")
        link.set_source(source)
        link.copy_remote_target()
        link.open()
        binding.feed.add_outlet(outlet)
        link.handler.attached()
        self.credit(link)

    def credit(self, link: Link) -> None:
        outlet = state_of(link).outlet
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
            self.drain(link, outlet, binding)
        elif outlet.draining is not None:
            outlet.draining = None  # a flow without drain ends a drain under way

    def drain(self, link, outlet: Outlet, binding) -> None:
        """The client asked to drain (AMQP 1.0 2.6.7): the feed was just given the link's credit, so it
        offered what it holds and asked its upstream for more.  Messages the upstream had ready come
        within moments: once none came for `DRAIN_QUIET` s (at most `DRAIN_LIMIT` s), or the credit is
        used up, the link is drained (its delivery-count advanced past the unused credit, credit 0).
        Only a link with drain set pays for this: the per-message path does not change."""
        token = outlet.draining = object()
        loop = self.server.upstream.loop
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


def outlet_presettled_requested(link: Link) -> bool:
    return link.remote_settled_mode
