"""A client's sending links: each message the client publishes goes upstream and is settled with the
upstream's outcome.

Theory of operation
-------------------
A sending link with a target address is a `SenderLink`: one upstream publisher to the same address
(after address rules), the client's credit as far as the upstream's (`SenderLink.top_up`), an
accepted delivery meaning the upstream accepted it.  A sending link with a null target (the anonymous relay,
`ANONYMOUS-RELAY`) is a `Relay`: each message is published to its `properties.to`, through an
upstream publisher kept per address (at most `RELAY_PUBLISHERS`, the least recently used idle one
closed first), each `to` checked against the permissions.  Both read a transfer with `read` (too
large: rejected, memory bounded while it arrives; aborted: dropped) and splice the origin
annotation "<instance>/<connection>" in, which no-local receivers compare against.  Each is its
link's `Link.handler` (see `links`): transfers come to its `transfer` straight from the engine's
event loop.  A `SenderLink` is attaching until its publisher is ready (then attached), awaiting
upstream while its upstream connection is down (`resume`), gone with its link; a `Relay` is
attached from its attach reply on.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from ..amqp import CodecError, decode_message, set_message_annotation
from ..amqp.sections import MESSAGE_ANNOTATIONS, encode_section
from ..engine._cproton import lib
from ..engine.endpoints import LOCAL_ACTIVE, LOCAL_CLOSED, Terminus
from ..filters import ORIGIN_ANNOTATION
from . import admission, management, plan, replies, sharing
from .forwarding import RELEASED, Outcome
from .links import ATTACHED, GONE, ClientLinkObject
from .records import ClientConnection, link_state
from .refusal import close_link
from .upstream import ErrorInfo, PublisherHandler
from .wire import read, settle_with

# Offered in the open frame besides the filter capabilities: a sender may attach with a null target
# and address each message by its `properties.to` (see `Relay`).
RELAY_CAPABILITY = "ANONYMOUS-RELAY"
# At most this many upstream publishers per anonymous-relay link, one per `to` address (an LRU:
# the least recently used idle one is closed when a new address needs one over the limit).
RELAY_PUBLISHERS = 16
RELAY_WINDOW = 1000  # credit an anonymous-relay link keeps granted (messages not yet settled count)


def open_inlet(server: Any, link: Any, conn: ClientConnection, address: str, caps: tuple, dynamic: str | None) -> None:
    """Serve a planned sending link (`plan.Publish`, `plan.DynamicTarget`): its upstream publisher; the
    attach is answered when the publisher is ready (`SenderLink.on_publisher_ready`).  A reply address of
    the daemon's (`plan.ToReply`) is served by `replies` instead: no upstream publisher."""
    if sharing.is_reply_address(address):
        replies.open_inlet(server, link, conn, address)
        return
    inlet = SenderLink(server, link, address, conn,
                       server.metrics.address(address) if server.metrics is not None else None)
    inlet.dynamic = dynamic
    inlet.caps, inlet.durable = caps, link.remote_target.durability
    link_state(link).inlet = inlet
    if server.max_message_size:
        link.set_max_message_size(server.max_message_size)  # advertised in the attach reply
    conn.links.add(link)
    conn.producers.add(link)
    inlet.reopen()


def open_relay(server: Any, link: Any, conn: ClientConnection) -> None:
    """A sending link with a null target (`plan.Relay`): each message goes to its `properties.to`."""
    relay = Relay(server, link, conn)
    link_state(link).relay = relay
    if server.max_message_size:
        link.set_max_message_size(server.max_message_size)
    conn.links.add(link)
    conn.producers.add(link)
    link.set_target(Terminus())  # a target without an address: the anonymous relay
    link.copy_remote_source()
    link.open()
    relay.attached()
    relay.top_up()


class SenderLink(ClientLinkObject, PublisherHandler):
    """A client sending link with a target address and its upstream publisher (its state: attaching
    until the publisher is ready, attached, awaiting upstream while the upstream connection is down,
    gone)."""

    __slots__ = ("ptr", "publisher", "address", "unsettled", "counters", "oversize", "origin", "dynamic", "in_flight",
                 "caps", "durable")

    def __init__(self, server: Any, link, address: str, conn: ClientConnection, counters: Any = None):
        self.counters = counters
        self.ptr = link.ptr  # its pn_link_t (per message: no property)
        self.address = address
        self.publisher = None
        self.unsettled = 0
        self.oversize: set = set()  # partial deliveries already over the size limit (pointers)
        self.dynamic: str | None = None  # the node made for a dynamic target (gone with the link)
        self.in_flight: set = set()  # client deliveries sent upstream, not settled there yet (pointers)
        self.caps: tuple = ()  # the upstream target's capabilities and durability (`reopen`)
        self.durable: Any = None
        # the message-annotations section a message without any gets: the origin annotation alone
        self.origin = encode_section(MESSAGE_ANNOTATIONS, {ORIGIN_ANNOTATION: conn.id})
        super().__init__(server, link, conn)

    @property
    def closed(self) -> bool:
        return self.state is GONE

    def publishing_client(self) -> tuple[Any, str | None]:
        return self.conn, self.address

    # PublisherHandler
    def on_publisher_ready(self, publisher) -> None:
        if self.state is GONE:
            return
        answered = self.link.local_state == LOCAL_ACTIVE  # (resumed: answered long ago)
        self.attached()
        if answered:
            self.top_up()
        else:
            link = self.link
            if self.dynamic is not None:  # the node made for it (gone with the link)
                link.set_target(dataclasses.replace(link.remote_target, address=self.dynamic, dynamic=True))
            else:  # the client's address, even when routed
                link.set_target(Terminus(address=link.remote_target.address))
            link.copy_remote_source()
            link.open()
            self.top_up()

    def on_publisher_credit(self, publisher) -> None:
        self.top_up()

    def on_publisher_closed(self, publisher, error: ErrorInfo | None) -> None:
        was = self.state
        if was is GONE:
            return
        err = error or ErrorInfo("amqp:link:detach-forced", "upstream detached")
        if (err.transient and was is ATTACHED and self.dynamic is None and not self.server.stopping
                and self.server.replicas is None):
            self._suspend()
            return
        self.gone()
        if was is not ATTACHED:
            self.link.set_target(Terminus(null=True))
            self.link.open()
        loop = self.server.upstream.loop
        if err.condition == "amqp:resource-deleted" and loop is not None:
            # (the broker removed the node, maybe by a management call of this client's, whose
            # answer the client must see first, as directly: see management.py, Order)
            management.after_calls(self.link.connection, lambda: self._detach(err), loop.call_later)
        else:
            self._detach(err)

    def _suspend(self) -> None:
        """The upstream connection went (`resume`): what was in flight is released (the client sends it
        again: at least once), the link stays attached, and a publisher is opened again when the
        upstream is back (`reopen`)."""
        self.publisher = None
        self.awaiting_upstream()
        in_flight, self.in_flight = self.in_flight, set()
        self.unsettled = 0
        for dlv in in_flight:
            settle_with(dlv, RELEASED)
        self.server.resumption.suspend_inlet(self)

    def reopen(self) -> None:
        self.publisher = self.server.upstream.open_publisher(self.address, self, self.caps, durable=self.durable)

    def _detach(self, err: ErrorInfo) -> None:
        if self.link.local_state != LOCAL_CLOSED:
            close_link(self.link, err.condition, err.description)

    def transfer(self, dlv) -> None:
        """A client's transfer (a delivery pointer) on this link: published upstream, settled with the
        upstream's outcome."""
        data = read(self, dlv)
        if data is None:
            return
        if self.state is not ATTACHED:  # (its publisher went with the upstream connection: `_suspend`)
            settle_with(dlv, RELEASED)
            return
        try:
            data = set_message_annotation(data, ORIGIN_ANNOTATION, self.conn.id, self.origin)
        except CodecError as e:
            settle_with(dlv, Outcome("rejected", error=("amqp:decode-error", f"message not decodable: {e}")))
            self.top_up()
            return
        refused = admission.refused(self.server.upstream, data)  # what would break the shared upstream connection
        if refused is not None:
            settle_with(dlv, Outcome("rejected", error=refused))
            self.top_up()
            return
        if self.counters is not None:
            self.counters.published.inc()
        server = self.server
        if lib.pn_delivery_settled(dlv):  # sent pre-settled: at most once, nothing to report
            lib.pn_delivery_settle(dlv)
            self.publisher.send(data, lambda outcome, address=self.address: server.registry.poke(address))
        else:
            self.unsettled += 1
            self.in_flight.add(dlv)

            def settled(outcome: Outcome, dlv=dlv, inlet=self) -> None:
                if dlv not in inlet.in_flight:
                    return  # (released already: its upstream connection went, `_suspend`)
                inlet.in_flight.discard(dlv)
                inlet.unsettled -= 1
                if outcome.kind == "accepted":
                    server.registry.poke(inlet.address)
                if inlet.state is not GONE:  # (else the link, and the delivery with it, may be gone)
                    settle_with(dlv, outcome)
                    inlet.top_up()

            self.publisher.send(data, settled)
        self.top_up()

    def top_up(self) -> None:
        if self.state is not ATTACHED or self.publisher is None:
            return
        limit = min(self.publisher.credit, 1000)
        credit = lib.pn_link_credit(self.ptr)
        want = limit - credit - self.unsettled
        # In batches (a flow frame per message would cost an event on both sides per message).
        if want > 0 and (want * 4 >= limit or credit == 0):
            lib.pn_link_flow(self.ptr, want)


class _RelayTarget(PublisherHandler):
    """One `to` address of an anonymous-relay link and its upstream publisher."""

    __slots__ = ("relay", "address", "publisher", "ready", "closed", "waiting", "in_flight")

    def __init__(self, relay: Relay, address: str):
        self.relay = relay
        self.address = address
        self.publisher = None
        self.ready = False
        self.closed = False
        self.waiting: list = []  # (data, dlv or None) not yet sent: no publisher / credit yet
        self.in_flight: set = set()  # client deliveries sent upstream, not yet settled

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.in_flight

    def publishing_client(self) -> tuple[Any, str | None]:
        return self.relay.conn, self.address

    def on_publisher_ready(self, publisher) -> None:
        self.ready = True
        self.flush()

    def on_publisher_credit(self, publisher) -> None:
        self.flush()

    def on_publisher_closed(self, publisher, error: ErrorInfo | None) -> None:
        self.closed = True
        self.relay.forget(self)
        err = error or ErrorInfo("amqp:link:detach-forced", "upstream detached")
        description = f"{self.address}: {err.description}" if err.description else self.address
        rejected = Outcome("rejected", error=(err.condition, description))
        pending = [d for _, d in self.waiting] + list(self.in_flight)
        self.waiting.clear()
        self.in_flight.clear()
        for dlv in pending:
            if dlv is not None:
                self.relay.settled(dlv, rejected if not self.ready else RELEASED)

    def send(self, data: bytes, dlv) -> None:
        self.waiting.append((data, dlv))
        self.flush()

    def flush(self) -> None:
        if self.closed or not self.ready or self.publisher is None:
            return
        server = self.relay.server
        while self.waiting and self.publisher.credit > 0:
            data, dlv = self.waiting.pop(0)
            if dlv is None:
                self.publisher.send(data, lambda outcome, a=self.address: server.registry.poke(a))
                continue
            self.in_flight.add(dlv)

            def settled(outcome: Outcome, dlv=dlv) -> None:
                self.in_flight.discard(dlv)
                if outcome.kind == "accepted":
                    server.registry.poke(self.address)
                self.relay.settled(dlv, outcome)

            self.publisher.send(data, settled)


class Relay(ClientLinkObject):
    """A client sending link with a null target (anonymous relay): each message is published to
    its `properties.to` through an upstream publisher kept per address, at most `RELAY_PUBLISHERS`
    of them (least recently used closed first), and settled with the outcome that address gave."""

    __slots__ = ("ptr", "unsettled", "targets", "oversize", "origin")

    def __init__(self, server: Any, link, conn: ClientConnection):
        self.ptr = link.ptr
        self.unsettled = 0
        self.targets: "collections.OrderedDict[str, _RelayTarget]" = collections.OrderedDict()
        self.oversize: set = set()
        self.origin = encode_section(MESSAGE_ANNOTATIONS, {ORIGIN_ANNOTATION: conn.id})
        super().__init__(server, link, conn)

    @property
    def closed(self) -> bool:
        return self.state is GONE

    def top_up(self) -> None:
        if self.state is GONE:
            return
        want = RELAY_WINDOW - lib.pn_link_credit(self.ptr) - self.unsettled
        if want > 0 and (want * 4 >= RELAY_WINDOW or lib.pn_link_credit(self.ptr) == 0):
            lib.pn_link_flow(self.ptr, want)

    def settled(self, dlv, outcome: Outcome) -> None:
        self.unsettled -= 1
        if self.state is not GONE:
            settle_with(dlv, outcome)
            self.top_up()

    def forget(self, target: _RelayTarget) -> None:
        if self.targets.get(target.address) is target:
            del self.targets[target.address]

    def close(self) -> None:
        """The client link went: every publisher closes (no callbacks follow)."""
        self.gone()
        for target in list(self.targets.values()):
            target.closed = True
            if target.publisher is not None:
                target.publisher.close()
        self.targets.clear()

    def target(self, address: str) -> _RelayTarget:
        target = self.targets.get(address)
        if target is not None:
            self.targets.move_to_end(address)
            return target
        while len(self.targets) >= RELAY_PUBLISHERS:
            victim = next((t for t in self.targets.values() if t.idle), None)
            if victim is None:
                break  # all busy: over the limit for a moment rather than lose messages
            del self.targets[victim.address]
            victim.closed = True
            victim.publisher.close()
        target = _RelayTarget(self, address)
        self.targets[address] = target
        server = self.server
        route = server._route(address)
        upstream_address = route.upstream if route is not None else address
        caps = sharing.upstream_capabilities((), route.routing_type if route is not None else "")
        target.publisher = server.upstream.open_publisher(upstream_address, target, caps)
        return target

    def transfer(self, dlv) -> None:
        server = self.server
        data = read(self, dlv)
        if data is None:
            return
        presettled = bool(lib.pn_delivery_settled(dlv))
        if self.state is GONE or not server.upstream_up:
            settle_with(dlv, RELEASED)
            return
        try:
            m = decode_message(data, ("properties",))
            to = m.properties.to if m.properties is not None else None
        except Exception as e:
            return self._refuse(dlv, "amqp:decode-error", f"message not decodable: {e}")
        if not to:
            return self._refuse(dlv, "amqp:invalid-field",
                                "properties.to is required on an anonymous-relay link (null target)")
        to = str(to)
        if sharing.is_reply_address(to):  # a reply address the daemon holds: to its requester, no broker
            if presettled:
                lib.pn_delivery_settle(dlv)
                replies.relay(server, to, data, None)
            else:
                self.unsettled += 1
                replies.relay(server, to, data, lambda outcome, dlv=dlv: self.settled(dlv, outcome))
            self.top_up()
            return
        if server.permissions is not plan.OPEN:
            why = plan.may_send(server.permissions, self.conn.user, to)
            if why is not None:
                server.guard.audit(self.conn, plan.SEND, to, why)
                return self._refuse(dlv, "amqp:unauthorized-access", why)
        try:
            data = set_message_annotation(data, ORIGIN_ANNOTATION, self.conn.id, self.origin)
        except CodecError as e:
            return self._refuse(dlv, "amqp:decode-error", f"message not decodable: {e}")
        refused = admission.refused(server.upstream, data)  # what would break the shared upstream connection
        if refused is not None:
            return self._refuse(dlv, *refused)
        if presettled:
            lib.pn_delivery_settle(dlv)
            self.target(to).send(data, None)
        else:
            self.unsettled += 1
            self.target(to).send(data, dlv)
        self.top_up()

    def _refuse(self, dlv, condition: str, description: str) -> None:
        settle_with(dlv, Outcome("rejected", error=(condition, description)))
        self.top_up()
