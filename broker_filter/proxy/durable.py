"""JMS durable subscriptions in front of an upstream without named subscriptions (RabbitMQ): the daemon
keeps them.

Theory of operation
-------------------
A durable subscriber's link (a durable source on a subscription) names its subscription by its link
name and client id (`sharing.subscription_name`; with `[security]` settings, its user as well:
`ProxyServer.subscriber`).  In front of RabbitMQ 4 (or 3.x given its HTTP API: `topology`) the
subscription is a durable queue of its own on the broker, found or declared and bound at the
attach (`hold_on_broker`), which outlives the daemon; otherwise the daemon keeps its upstream
consumer attached across its subscriber's detaches (`FeedRegistry.kept`), at most
`limits.kept_subscriptions` of them (`beyond_kept_limit`).  A null-source attach names a
subscription (Qpid JMS's unsubscribe): `look_up` answers it with the subscription's source, and
closing that link ends the subscription.  Subscribing again under a name with another selector
or address replaces the subscription; a shared one with subscribers attached is refused
(`in_use_otherwise`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..engine.endpoints import LOCAL_UNINIT, Terminus
from ..filters import FilterSet
from . import plan, sharing, topology
from .forwarding import Outlet
from .records import ClientConnection, link_state, state_of
from .upstream import ConsumerSpec

log = logging.getLogger("broker_filter.proxy")

UNSETTLED_STATE = 2  # terminus durability: unsettled-state (what Qpid JMS's durable subscriptions ask)


def kept_source(address: str | None) -> Terminus:
    """The source of a durable subscription found by its name (a null-source attach)."""
    return Terminus(address=address, durability=UNSETTLED_STATE, expiry_policy="never", distribution_mode="copy")


class DurableSubscriptions:
    """One server's durable subscriptions kept for their subscribers (see the module's docstring)."""

    def __init__(self, server: Any):
        self.server = server

    def look_up(self, link, conn: ClientConnection) -> None:
        """A null-source attach names a durable subscription (Qpid JMS's unsubscribe): answered with
        the kept subscription's source (Qpid JMS requires one); closing the link ends it.  In front
        of RabbitMQ 4 the subscription is looked for on the broker as well (`_hold_on_broker`)."""
        name = sharing.kept_name(link.name, self.server.guard.subscriber(conn, link))
        binding = self.server.registry.kept.get(name) if name is not None else None
        if binding is not None:
            self._answer_lookup(link, conn, name, binding.kept_address)
            return
        pair = topology.topology(self.server.upstream) if name is not None else None
        if pair is None:
            self.server._refuse(link, "amqp:not-found",
                         f"no durable subscription named {link.name!r} is kept for a detached subscriber here "
                         f"(in front of upstream {self.server.upstream.name} the proxy keeps one from its subscriber's "
                         "detach until the upstream connection goes)")
            return
        queue = topology.durable_queue(name)
        state = link_state(link)
        state.unsubscribe_queue = queue  # (set while the broker is asked: a detach meanwhile clears it)

        def found(arguments: dict | None, failure: tuple[str, str] | None) -> None:
            if state.unsubscribe_queue != queue or link.local_state != LOCAL_UNINIT:
                return  # the client went meanwhile
            if arguments is None:
                state.unsubscribe_queue = None
                self.server._refuse(link, failure[0] if failure else "amqp:not-found",
                             f"durable subscription {link.name!r}: {failure[1]}" if failure else
                             f"no durable subscription named {link.name!r} of client "
                             f"{link.connection.remote_container!r} exists on upstream {self.server.upstream.name} "
                             f"(no queue {queue!r})")
                return
            self._answer_lookup(link, conn, name, str(arguments.get(topology.ARG_ADDRESS) or "") or None)

        topology.find_subscription_queue(pair, queue, found)

    def _answer_lookup(self, link, conn: ClientConnection, name: str, address: str | None) -> None:
        why = self.server.permissions.refusal(conn.user, plan.DURABLE, address) if address is not None else None
        if why is not None:  # (its own subscription, but no longer allowed to keep or remove one there)
            self.server.guard.audit(conn, plan.DURABLE, address, why)
            self.server._refuse(link, "amqp:unauthorized-access", why, reason="unauthorized")
            return
        link.set_source(kept_source(address))
        link.copy_remote_target()
        link_state(link).unsubscribe = name
        conn.links.add(link)
        link.open()

    def unsubscribe_on_broker(self, name: str | None, queue: str) -> None:
        pair = topology.topology(self.server.upstream)
        if pair is None:
            log.warning("durable subscription %r could not be unsubscribed: upstream %s is not connected; its "
                        "queue %s stays on the broker", name, self.server.upstream.name, queue)
            return
        log.info("durable subscription %r unsubscribed: deleting its queue %s", name, queue)
        topology.delete_subscription_queue(pair, queue)

    def hold_on_broker(self, pair: Any, link, outlet: Outlet, key: Any, spec: ConsumerSpec, kept_name: str,
                        binding_key: tuple[str, str], address: str, local: FilterSet) -> None:
        """A durable subscription in front of RabbitMQ 4 (or 3.x given its HTTP API): its queue on the
        broker is found or declared (and bound) over `pair` (`topology`), then consumed by a
        subscription feed (what the link's filters do not select is accepted and dropped).  The
        queue, not the daemon, keeps the subscription while its subscriber is detached, across
        daemon restarts and upstream reconnects; an unsubscribe deletes it."""
        state = state_of(link)
        queue = topology.durable_queue(kept_name)
        arguments = {"x-queue-type": "classic", topology.ARG_ADDRESS: address, topology.ARG_FILTER: local.description,
                     topology.ARG_CLIENT: spec.container_id or "", topology.ARG_NAME: link.name}

        def ready(failure: tuple[str, str] | None, replaced: bool) -> None:
            if state.outlet is not outlet or self.server.stopping:
                return  # the subscriber went meanwhile (the queue stays, as its detach asks)
            if failure is not None:
                self.server._drop_link(link)
                self.server._refuse(link, failure[0], f"durable subscription {link.name!r}: {failure[1]}")
                return
            if replaced:
                log.info("durable subscription %r resubscribed with another address or selector: its queue "
                         "%s was replaced", kept_name, queue)
            binding = self.server.registry.feeds.get(key)
            if binding is not None and not binding.closed:
                self.server.receivers.join(binding, outlet)
                return
            consumed = dataclasses.replace(spec, address=topology.consume_address(self.server.upstream, queue), capabilities=(),
                                           distribution_mode=None, durable=None, expiry_policy=None)
            opened = self.server.registry.open_feed(key, consumed, True, outlet, self.server.upstream)
            opened.kept_name, opened.kept_address, opened.broker_queue = kept_name, address, queue

        topology.ensure_subscription_queue(pair, queue, binding_key, arguments, ready)

    def beyond_kept_limit(self, link, name: str) -> bool:
        """A new durable subscription the daemon would keep (`name`: not attached nor kept now) while
        it already has `limits.kept_subscriptions` of them, attached or kept: refused at its attach,
        so that no subscriber's detach ever needs one more kept than the limit and none kept is
        dropped.  True if refused."""
        limit = self.server.config.limits.kept_subscriptions or 0
        if not limit or name in self.server.registry.kept:
            return False
        names = {b.kept_name for b in self.server.registry.feeds.values()
                 if b.kept_name is not None and not b.closed and b.broker_queue is None}
        if name in names or len(names) < limit:
            return False
        self.server._drop_link(link)
        self.server._refuse(link, "amqp:resource-limit-exceeded",
                     f"durable subscription {link.name!r} of client {link.connection.remote_container!r} "
                     f"refused: the daemon keeps {len(names)} durable subscriptions in front of upstream "
                     f"{self.server.upstream.name}, attached or detached (limits.kept_subscriptions = {limit}); "
                     "unsubscribe one, or resume one of them", reason="kept-subscriptions", level=logging.WARNING)
        return True

    def in_use_otherwise(self, link, name: str, key: Any) -> bool:
        """A shared durable subscription asked for with another address or selector while links are
        attached to it as it is: refused (JMS: its selector cannot change while it has consumers).
        True if refused."""
        for k, b in self.server.registry.feeds.items():
            if k[0] == sharing.NAMED and k[2] == name and k != key and not b.closed and (b.feed.outlets or b.pending):
                self.server._drop_link(link)
                self.server._refuse(link, "amqp:resource-locked",
                             f"shared durable subscription {link.name!r} has subscribers attached with another "
                             "address or selector: detach them before subscribing with this one")
                return True
        return False
