"""Reply addresses the daemon holds itself: request/reply without the broker.

Theory of operation
-------------------
A receiver with a dynamic source asks for a node of its own, named in the attach reply, gone with
the link: the reply address of a request/reply exchange (RabbitMQ's direct reply-to: a dynamic
source with capability `rabbitmq:volatile-queue`; rhea's `createRequestResponseLink`; proton's
`dynamic=True`).  An upstream that makes no dynamic nodes (`Traits.dynamic_sources` false: RabbitMQ
3.x and 4.x) gets no such attach: `plan.plan_receiver` plans a `plan.Reply`, and `serve` answers it
here with an address of the daemon's own, `/queues/broker-filter.reply-to.<random>` (RabbitMQ 4's
queue form, so that RabbitMQ's clients may publish to it; 24 random bytes: unguessable, so that
holding the address is what allows sending to it, and no `send` permission is asked).

A message sent to that address, by a sender attached to it (`plan.ToReply`, carried out by
`sender.open_inlet` → `ReplyInlet`) or through the anonymous relay with `to` set to it
(`sender.Relay.transfer` → `relay`), goes to the requester's link directly in the daemon: no
broker is involved, and nothing is stored.  A reply address the daemon does not hold (its requester
detached, or it never was) is refused: a sender's attach with `amqp:not-found`, a relayed message
rejected with `amqp:not-found`.

Credit and settlement: a message goes out at once while the requester's link has credit.  Beyond
it, at most as many messages as the link's largest credit so far (its window, at most the daemon's
`max_credit`) wait for the next flow; a message beyond that is rejected with
`amqp:resource-limit-exceeded` naming the address, so what the daemon holds is bounded by what the
requester asked for.  A requester that receives pre-settled (RabbitMQ's client does) settles each
message as it is sent: the sender's delivery is accepted then.  Otherwise the requester's own
outcome (accepted, rejected, released, modified) is the sender's.  When the requester's link goes,
the address goes with it: what waited and what was unsettled is released to its senders, and
senders attached to the address are detached with `amqp:resource-deleted`.

The reply link is kept in `ClientLink.pair` (the slot of a link served by an object of its own:
its `links.ServedLink` gives it the link's dispositions and flow, `ProxyServer._drop_link` its end),
so the server needs no change for it.
"""

from __future__ import annotations

import collections
import logging
import secrets
from typing import Any, Callable

from ..engine._cproton import lib
from ..engine.endpoints import LOCAL_CLOSED, Terminus
from . import plan
from .forwarding import ACCEPTED, RELEASED, Outcome
from .links import ServedLink
from .records import ClientConnection, link_state
from .refusal import close_link
from .sharing import REPLY_PREFIX
from .wire import read, remote_outcome, send, settle_with

log = logging.getLogger("broker_filter.proxy")

VOLATILE = "rabbitmq:volatile-queue"  # RabbitMQ's direct reply-to capability (echoed when asked)
Settle = Callable[[Outcome], None]  # the sender's side of a message: given the message's outcome


def registry(server: Any) -> "Replies":
    """The reply addresses the daemon holds, for every server of the process (with pass-through
    logins each client identity has a server of its own, and a responder may log in as another
    user than its requester; every server runs on the one loop)."""
    return REPLIES


class Replies:
    """The reply addresses the daemon holds: address -> `ReplyNode`."""

    def __init__(self) -> None:
        self.nodes: dict[str, ReplyNode] = {}

    def new_address(self) -> str:
        while True:
            address = REPLY_PREFIX + secrets.token_urlsafe(24)
            if address not in self.nodes:
                return address

    def deliver(self, address: str, data: bytes, settle: Settle | None) -> None:
        """A message to `address`: offered to its requester; `settle(outcome)` once it has one (None:
        sent pre-settled, nothing to report)."""
        node = self.nodes.get(address)
        if node is None or node.closed:
            if settle is not None:
                settle(not_found(address))
            return
        node.offer(data, settle)


REPLIES = Replies()


def not_found(address: str) -> Outcome:
    return Outcome("rejected", error=("amqp:not-found", f"no reply address {address} is held here: its receiver "
                                                       "has detached"))


class ReplyNode:
    """One requester's reply address and its link (see the module's docstring)."""

    __slots__ = ("server", "replies", "address", "link", "ptr", "presettled", "window", "max_size", "waiting",
                 "unsettled", "inlets", "closed")

    def __init__(self, server: Any, replies: Replies, link: Any, address: str):
        self.server = server
        self.replies = replies
        self.address = address
        self.link = link
        self.ptr = link.ptr
        self.presettled = False
        self.window = 0  # the largest credit the requester gave: what the node holds at most
        self.max_size = link.remote_max_message_size or 0
        self.waiting: collections.deque = collections.deque()  # (data, settle) waiting for credit
        self.unsettled: dict = {}  # delivery pointer -> the sender's settle, awaiting the requester's outcome
        self.inlets: set = set()  # senders attached to the address (`ReplyInlet`)
        self.closed = False

    def offer(self, data: bytes, settle: Settle | None) -> None:
        if self.max_size and len(data) > self.max_size:
            if settle is not None:
                settle(Outcome("rejected", error=("amqp:resource-limit-exceeded",
                                                  f"message of {len(data)} bytes is larger than the {self.max_size} "
                                                  f"bytes the receiver of {self.address} takes")))
            return
        if len(self.waiting) >= max(self.window, lib.pn_link_credit(self.ptr)):
            if settle is not None:  # (one sent pre-settled has no outcome: it is dropped)
                settle(Outcome("rejected", error=(
                    "amqp:resource-limit-exceeded",
                    f"reply address {self.address}: its receiver has no credit for more "
                    f"({len(self.waiting)} messages wait for it); send again later")))
            return
        self.waiting.append((data, settle))
        self.flush()

    def flush(self) -> None:
        ptr = self.ptr
        while self.waiting and not self.closed and lib.pn_link_credit(ptr) > 0:
            data, settle = self.waiting.popleft()
            dlv = send(ptr, self.server.next_tag(), data, self.presettled)
            if self.presettled:
                if settle is not None:
                    settle(ACCEPTED)
            else:
                self.unsettled[dlv] = settle

    # the requester's link (`ClientLink.pair`: its flow, its end; its dispositions routed to `outcome`)
    def _client_credit(self, link: Any) -> None:
        credit = lib.pn_link_credit(self.ptr)
        self.window = min(max(self.window, credit), self.server.max_credit)
        self.flush()
        for inlet in list(self.inlets):  # (senders attached to the address get as much)
            inlet.top_up()
        if lib.pn_link_get_drain(self.ptr) and lib.pn_link_credit(self.ptr) > 0:
            lib.pn_link_drained(self.ptr)  # nothing else waits: the rest of the credit is given back

    def outcome(self, link: Any, dlv: Any) -> None:
        outcome = remote_outcome(dlv)
        if outcome is None:
            if not lib.pn_delivery_settled(dlv):
                return  # not a terminal state yet
            outcome = RELEASED  # settled without an outcome: never taken as accepted
        settle = self.unsettled.pop(dlv, None)
        lib.pn_delivery_settle(dlv)
        if settle is not None:
            settle(outcome)

    def client_gone(self, link: Any) -> None:
        """The requester's link went: the address goes with it."""
        if self.closed:
            return
        self.closed = True
        if self.replies.nodes.get(self.address) is self:
            del self.replies.nodes[self.address]
        link_state(link).pair = None
        pending = [s for _, s in self.waiting] + list(self.unsettled.values())
        self.waiting.clear()
        self.unsettled.clear()
        for settle in pending:
            if settle is not None:
                settle(RELEASED)
        for inlet in list(self.inlets):
            inlet.gone(f"reply address {self.address} was removed: its receiver detached")
        log.debug("reply address %s removed", self.address)


def serve(server: Any, link: Any, conn: ClientConnection) -> None:
    """A receiver planned `plan.Reply`: its reply address made, the attach answered."""
    replies = registry(server)
    address = replies.new_address()
    node = ReplyNode(server, replies, link, address)
    replies.nodes[address] = node
    state = link_state(link)
    state.pair = node
    state.operation, state.address = plan.CONSUME, None
    conn.links.add(link)
    ServedLink(server, link, conn, node.outcome)  # (the link's handler: its dispositions, its flow)
    src = link.remote_source
    if link.remote_settled_mode:
        link.set_snd_settle_mode(True)
        node.presettled = True
    caps = tuple(c for c in src.capabilities if c == VOLATILE)
    link.set_source(Terminus(address=address, dynamic=True, expiry_policy=src.expiry_policy, capabilities=caps))
    link.copy_remote_target()
    link.open()
    node._client_credit(link)  # (a flow that came with the attach)
    log.debug("reply address %s made for link %r of %s", address, link.name, conn.id)


def relay(server: Any, address: str, data: bytes, settle: Settle | None) -> None:
    """A message of an anonymous-relay link whose `to` is a reply address."""
    registry(server).deliver(address, data, settle)


class ReplyInlet:
    """A client sending link attached to a reply address (`plan.ToReply`): each message goes to the
    requester, settled with the requester's outcome.  Kept as the link's `ClientLink.inlet` (what
    `ProxyServer._drop_link` ends: it sets `closed`, and finds no publisher nor dynamic node)."""

    __slots__ = ("server", "link", "ptr", "conn", "node", "address", "_closed", "unsettled", "oversize")
    publisher = None  # (no upstream publisher)
    dynamic = None

    def __init__(self, server: Any, link: Any, conn: ClientConnection, node: ReplyNode):
        self.server = server
        self.link = link
        self.ptr = link.ptr
        self.conn = conn  # (its messages in transfer count in the connection's: `wire.read`)
        self.node = node
        self.address = node.address
        self._closed = False
        self.unsettled = 0
        self.oversize: set = set()  # (for `wire.read`)

    @property
    def closed(self) -> bool:
        return self._closed

    @closed.setter
    def closed(self, closed: bool) -> None:
        self._closed = closed
        if closed:
            self.node.inlets.discard(self)

    def top_up(self) -> None:
        if self._closed:
            return
        window = max(self.node.window, 1)
        want = window - lib.pn_link_credit(self.ptr) - self.unsettled
        if want > 0:
            lib.pn_link_flow(self.ptr, want)

    def on_transfer(self, link: Any, dlv: Any) -> None:
        data = read(self, dlv)
        if data is None:
            return
        if self._closed:
            settle_with(dlv, RELEASED)
            return
        if lib.pn_delivery_settled(dlv):
            lib.pn_delivery_settle(dlv)
            self.node.offer(data, None)
        else:
            self.unsettled += 1

            def settled(outcome: Outcome, dlv=dlv) -> None:
                self.unsettled -= 1
                if not self._closed:
                    settle_with(dlv, outcome)
                    self.top_up()

            self.node.offer(data, settled)
        self.top_up()

    def gone(self, why: str) -> None:
        """The reply address went: the sender is detached."""
        if not self._closed:
            self.closed = True
            if self.link.local_state != LOCAL_CLOSED:
                close_link(self.link, "amqp:resource-deleted", why)


def open_inlet(server: Any, link: Any, conn: ClientConnection, address: str) -> None:
    """A sending link attached to a reply address: refused with `amqp:not-found` unless it is held."""
    node = registry(server).nodes.get(address)
    if node is None or node.closed:
        server._refuse(link, "amqp:not-found", not_found(address).error[1])
        return
    inlet = ReplyInlet(server, link, conn, node)
    node.inlets.add(inlet)
    state = link_state(link)
    state.inlet = inlet  # (closed with the link: `ProxyServer._drop_link`)
    state.operation, state.address = None, None  # (no permission asked: the address is the authority)
    if server.max_message_size:
        link.set_max_message_size(server.max_message_size)
    conn.links.add(link)
    conn.producers.add(link)
    ServedLink(server, link, conn, inlet.on_transfer)  # (the link's handler: its transfers)
    link.set_target(Terminus(address=address))
    link.copy_remote_source()
    link.open()
    inlet.top_up()
