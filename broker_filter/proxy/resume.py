"""An upstream reconnect the clients do not see: links that can be resumed stay attached while the
daemon's upstream connection is down, and are served again when it is back.

Theory of operation
-------------------
When the upstream connection goes, every upstream consumer and publisher is closed with a transient
error (`ErrorInfo.transient`), then the server hears `on_upstream_down`.

* A **queue** feed (`sharing.feed_key` kind "queue", or a durable subscription held as a queue on the
  broker) is suspended (`suspend_feed`): the feed closes — what it held and what its clients had
  not settled stay on the broker, which delivers them again (at least once) — and its client links
  stay attached, each kept to be placed again (`Receivers.place`) once the upstream is back.  An
  attach that was not answered yet waits too, at most `upstream.answer_timeout` seconds.
* A **subscription** to an exchange (`/topic/K`, `/exchange/X[/K]`, RabbitMQ 4's `/exchanges/X[/K]`) in
  front of a RabbitMQ the daemon can declare queues on (RabbitMQ 4's `/management`; RabbitMQ 3.x
  given its HTTP API, `upstream.management_url`) is a queue the daemon declared for its feed
  (`Receivers.subscribe_on_own_queue`: the address's shared subscription, or a link's own): not
  exclusive to the connection, not auto-delete, expiring `upstream.subscription_expiry` seconds
  after its last consumer went.  Its feed is suspended the same way (`FeedBinding.own_queue`); while
  the daemon is away the queue keeps collecting what is routed to it, and when the upstream is back
  its links are served from the same queue again, by one feed as before
  (`Receivers.resume_subscription`): nothing routed meanwhile is missed, and what was unsettled
  comes again.  Where the queue is gone by then (it expired, the broker restarted), the links are
  detached with `amqp:connection:forced` and a description saying so: never a silent gap.  A
  member of a shared subscription that had been moved to an upstream subscription of its own (a
  slow one, `fanout`; `feeds.OwnQueueConsumer`) is detached too, with the reason: that queue is not
  consumed again (it expires).  The daemon deletes the queue when the feed ends (`topology.end_subscription`), and
  one whose links went while the upstream was down when it is back; what the daemon cannot
  delete expires.
* A **sending** link (`sender.SenderLink`) stays attached: the deliveries it had in flight upstream are
  settled `released` (the upstream may or may not have taken them: the client sends them again, at
  least once), what it sends while the upstream is down is released too, and a publisher is opened
  again when the upstream is back.  The anonymous relay's links never depended on one publisher.
* Links that cannot be resumed are detached with the reason, as before: a subscription whose queue
  RabbitMQ makes — in front of RabbitMQ 3.x without `upstream.management_url` (its AMQP 1.0
  plugin's queue is server-named, `amq.gen-…`, a name the attach never tells: what was routed to it
  meanwhile is out of reach, so a resumed link would hide that gap), and one whose filters the
  upstream evaluates —, a dynamic node, a browser, and every link of a replica (`[replicas]`: a
  replica without its upstream owns nothing, and the others take its queues over).
* An **attach** that arrives while the upstream is reconnecting waits for it (`await_attach`), at
  most `upstream.answer_timeout` seconds, instead of being refused at once.

Counted in `broker_filter_links_resumed_total` and `broker_filter_links_detached_by_reconnect_total`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..engine.endpoints import LOCAL_CLOSED, LOCAL_UNINIT, REMOTE_CLOSED
from . import topology
from .fanout import FanoutFeed
from .forwarding import Outlet
from .records import state_of
from .refusal import close_link

log = logging.getLogger("broker_filter.proxy")


class Held:
    """A suspended subscription feed's queue of the daemon's own, and the key and spec of the feed
    that consumes it again (`Receivers.resume_subscription`); one per feed, shared by its links."""

    __slots__ = ("key", "spec", "queue")

    def __init__(self, key: Any, spec: Any, queue: str):
        self.key, self.spec, self.queue = key, spec, queue


class Resumption:
    """One server's links waiting for their upstream to come back (see the module's docstring)."""

    def __init__(self, server: Any):
        self.server = server
        self.outlets: list[Outlet] = []  # receiving links of suspended feeds, to be placed again
        # ... those of them on a subscription's own queue (`FeedBinding.own_queue`): their feed's key, spec and queue
        self.subscriptions: dict[Outlet, Held] = {}
        self.inlets: list = []  # sending links whose publisher went with the connection
        self.attaches: list[tuple[Any, Any, Callable]] = []  # (link, connection record, attach again)

    def resumable(self, binding: Any) -> bool:
        """Whether a feed's links can outlive its upstream connection (a queue, not through a replica)."""
        return (binding.via is None and not self.server.stopping and self.server.replicas is None
                and (binding.key[0] == "queue" or binding.broker_queue is not None or binding.own_queue is not None))

    def suspend_feed(self, binding: Any) -> None:
        registry = self.server.registry
        alone = binding.feed.on_own() if binding.own_queue is not None and isinstance(binding.feed, FanoutFeed) else ()
        outlets = registry.suspend(binding)
        if not outlets:
            return
        held = Held(binding.key, binding.spec, binding.own_queue) if binding.own_queue is not None else None
        for o in alone:
            if o in outlets and o.io_ref is not None:
                outlets.remove(o)
                self.detach(o.io_ref, "amqp:connection:forced",
                            f"upstream {self.server.upstream.name} lost: this slow subscriber of {binding.spec.address} "
                            "was on an upstream subscription of its own, which is not resumed: what was routed to "
                            "it meanwhile is lost; subscribe again")
        for o in outlets:
            if o.io_ref is not None:
                o.io_ref.handler.awaiting_upstream()  # (its `receiver.ReceiverLink`)
            if held is not None:
                self.subscriptions[o] = held
        self.outlets.extend(outlets)
        waiting = [o for o in outlets if o.io_ref is not None and o.io_ref.local_state == LOCAL_UNINIT]
        if waiting:
            self.server.upstream.loop.call_later(self.server.upstream.answer_timeout,
                                                 lambda: self._give_up(waiting))
        log.info("upstream %s lost: %d link(s) of %s wait for it%s", self.server.upstream.name, len(outlets),
                 binding.spec.address, f" on their queue {held.queue}" if held is not None else "")

    def suspend_subscription(self, held: Held, outlets: list[Outlet]) -> None:
        """A subscription's links whose queue was being looked up again when the upstream went again."""
        for o in outlets:
            self.subscriptions[o] = held
        self.outlets.extend(outlets)

    def resumed(self, n: int) -> None:
        if n and self.server.metrics is not None:
            self.server.metrics.links_resumed.inc(n)

    def detach(self, link: Any, condition: str, description: str) -> None:
        """A suspended link that cannot be served again after all: detached (refused if its attach
        was never answered) with the reason, counted as detached by the reconnect."""
        self.server._drop_link(link)
        if link.local_state == LOCAL_UNINIT:
            self.server._refuse(link, condition, description)
        else:
            close_link(link, condition, description)
            log.info("link %r detached: %s", link.name, description)
        if self.server.metrics is not None:
            self.server.metrics.links_detached_by_reconnect.inc()

    def suspend_inlet(self, inlet: Any) -> None:
        self.inlets.append(inlet)

    def await_attach(self, link: Any, conn: Any, attach: Callable[[Any, Any], None]) -> None:
        """An attach while the upstream reconnects: `attach(link, conn)` again once it is back, or a
        refusal after `upstream.answer_timeout` seconds."""
        entry = (link, conn, attach)
        self.attaches.append(entry)
        upstream = self.server.upstream
        log.info("attach of link %r waits for upstream %s to reconnect (at most %g s)", link.name, upstream.name,
                 upstream.answer_timeout)

        def expired() -> None:
            if entry in self.attaches:
                self.attaches.remove(entry)
                if link.local_state == LOCAL_UNINIT and link.remote_state != REMOTE_CLOSED:
                    self.server._refuse(link, "amqp:connection:forced",
                                        f"upstream {upstream.name} is not connected (waited "
                                        f"{upstream.answer_timeout:g} s, upstream.answer_timeout); retry later")

        upstream.loop.call_later(upstream.answer_timeout, expired)

    def _give_up(self, waiting: list[Outlet]) -> None:
        """Attaches of suspended feeds still unanswered after `upstream.answer_timeout`: refused."""
        for o in waiting:
            if o not in self.outlets:
                continue
            link = o.io_ref
            if link is None or link.local_state != LOCAL_UNINIT:
                continue
            self.outlets.remove(o)
            self.subscriptions.pop(o, None)
            self.server._drop_link(link)
            self.server._refuse(link, "amqp:connection:forced",
                                f"upstream {self.server.upstream.name} is not connected; retry later")

    def upstream_up(self) -> None:
        """The upstream is back: every waiting link is served again, every waiting attach planned again."""
        server = self.server
        outlets, self.outlets = self.outlets, []
        inlets, self.inlets = self.inlets, []
        attaches, self.attaches = self.attaches, []
        subscriptions, self.subscriptions = self.subscriptions, {}
        resumed = 0
        groups: dict[Held, list[Outlet]] = {}
        for held in subscriptions.values():
            groups.setdefault(held, [])
        for o in outlets:
            link = o.io_ref
            if (link is None or link.local_state == LOCAL_CLOSED or link.remote_state == REMOTE_CLOSED
                    or state_of(link).outlet is not o):
                continue
            held = subscriptions.get(o)
            if held is not None:
                groups[held].append(o)
                continue
            server.receivers.place(link, o)
            resumed += 1
        for held, members in groups.items():
            if members:  # one feed for the links of one queue (counted once it is found)
                server.receivers.resume_subscription(held, members)
            else:  # its subscribers went while the upstream was down
                topology.end_subscription(server.upstream, held.queue)
        for inlet in inlets:
            if not inlet.closed:
                inlet.reopen()
                resumed += 1
        for link, conn, attach in attaches:
            if link.local_state == LOCAL_UNINIT and link.remote_state != REMOTE_CLOSED and not conn.closed:
                attach(link, conn)
        if resumed:
            log.info("upstream %s is back: %d link(s) resumed", server.upstream.name, resumed)
            self.resumed(resumed)
