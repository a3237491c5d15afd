"""Replicas (`[replicas]`): a queue's links are served by the queue's owner, and move, still attached,
when the owner changes (`proxy.replicas` tells who owns what).

Theory of operation
-------------------
A queue link placed on a replica's feed (`Placement.owned`) consumes through the owner's daemon.
When the live replicas change (`owners_changed`) or the owner's consumer closes because it went or
drains (`replica_lost`), the links whose queue has another owner now are taken off their feed
(what the client has unsettled goes back to that feed's custody; what the feed holds goes back to
the broker when no link is left on it) and placed again (`rehome`), on the new owner's upstream or
here: the client sees no detach.
"""

from __future__ import annotations

import logging
from typing import Any

from ..engine.endpoints import LOCAL_CLOSED, REMOTE_CLOSED
from .feeds import FeedBinding
from .forwarding import Outlet
from .records import state_of
from .upstream import ErrorInfo

log = logging.getLogger("broker_filter.proxy")


class Rehoming:
    """One server's queue links served through their queue's owner."""

    def __init__(self, server: Any):
        self.server = server

    def owners_changed(self) -> None:
        """The live replicas changed (`proxy.replicas`): queue links whose queue has another owner
        now are served there."""
        if self.server.stopping or self.server.replicas is None:
            return
        seen: set[int] = set()
        for b in list(self.server.registry.feeds.values()) + list(self.server.registry.feed_aliases.values()):
            if id(b) in seen or b.closed:
                continue
            seen.add(id(b))
            moving = [o for o in list(b.feed.outlets) + list(b.pending) if self._moves(o, b)]
            if moving:
                self.rehome(b, moving)

    def _moves(self, outlet: Outlet, binding: FeedBinding) -> bool:
        p = state_of(outlet.io_ref).place
        if p is None or not p.owned:
            return False
        via, _ = self.server.replicas.upstream_for(p.routed)
        return via != binding.via

    def replica_lost(self, binding: FeedBinding, error: ErrorInfo | None) -> bool:
        """The consumer of a feed served through a replica closed: True when its links moved to
        another owner (the replica went or drains), False to fail them as usual."""
        if self.server.stopping or self.server.replicas is None or error is None:
            return False
        if not error.transient and error.condition != "amqp:connection:forced":
            return False  # the owner's own answer (not found, unauthorized...): the client's to see
        if not error.transient:
            self.server.replicas.peer_leaving(binding.via)  # detached as it drains
        if not binding.closed:
            moving = list(binding.feed.outlets) + list(binding.pending)
            if moving:
                self.rehome(binding, moving)
        return binding.closed or not (binding.feed.outlets or binding.pending)

    def rehome(self, binding: FeedBinding, outlets: list[Outlet]) -> None:
        """Move `outlets` (their links stay attached) from `binding` to the feed of their queue's
        owner.  What the client has unsettled goes back to `binding`'s custody, and what it holds
        goes back to the broker when no link is left on it."""
        log.info("queue %s: %d link(s) move from %s to %s", binding.spec.address, len(outlets),
                 binding.via or "this replica",
                 self.server.replicas.owner(state_of(outlets[0].io_ref).place.routed) or "nobody")
        for o in outlets:
            if o in binding.pending:
                binding.pending.remove(o)
            binding.feed.remove_outlet(o)
            o.io_owner = None
        if not binding.feed.outlets and not binding.pending:
            self.server.registry.unregister(binding)
            binding.feed.stop()
            binding.draining = True
            if binding.feed.moving == 0:
                self.server.registry.finish_feed(binding)
            else:
                self.server.registry.draining.add(binding)
                self.server.upstream.loop.call_later(self.server.grace, lambda b=binding: self.server.registry.finish_feed(b))
        for o in outlets:
            link = o.io_ref
            if link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED or state_of(link).outlet is not o:
                continue
            o.in_flight.clear()
            o.waiting_since = None
            link.handler.moving()  # (its `receiver.ReceiverLink`: attached again once placed)
            self.server.receivers.place(link, o)
