"""Each client link the proxy serves is one object: the link's `Link.handler`.

Theory of operation
-------------------
A served client link's object — `receiver.ReceiverLink` (a client's receiving link, on a feed),
`sender.SenderLink` (a sending link with a target address, and its upstream publisher),
`sender.Relay` (the anonymous relay), `ServedLink` (a link served by an object of its own: a
`/management` link, a reply address's links) — is made once the attach is planned, and set as the
engine link's `handler`.  From then on the engine hands it the link's transfers (`transfer(delivery
pointer)`, straight from `Engine.process`: one dict lookup by link pointer, no wrapper built) and its
control events (`on_flow`, `on_link_close`); a link the proxy does not serve (refused, or waiting
for its plan) stays with the connection's handler, `ProxyServer`.

Every object has a state, changed only by its named transitions:

    attaching ──attached()──> attached ──moving()──> moving ──attached()──> attached
        │                        │ ^
        │            awaiting_upstream()  attached()      (the upstream connection went, and came back)
        │                        v │
        └─────────────────> awaiting upstream
    any ──gone()──> gone          (the link was dropped: `ProxyServer._drop_link`; final)

Its control events and a failed transfer are handled in its log context (the proxy's connection id
and the link's name: `lifecycle.event_ids`) inside an error boundary: a failure closes this link
alone with `amqp:internal-error`.  The transfers themselves run outside any wrapper (the
per-message path pays for none); one that raises reaches `failed()`, which logs it in that context.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from .. import logs
from ..engine.endpoints import Link, LinkHandler
from .lifecycle import event_ids
from .records import ClientConnection, state_of
from .refusal import close_link

log = logging.getLogger("broker_filter.proxy")

# A client link object's states (`ClientLinkObject.state`).
ATTACHING = "attaching"  # planned; its attach not answered yet (its feed or publisher is being opened)
AWAITING_UPSTREAM = "awaiting upstream"  # its upstream connection went: held attached until it is back
ATTACHED = "attached"  # answered and served
MOVING = "moving"  # attached, being placed on another feed (its queue's owner changed, `rehoming`)
GONE = "gone"  # dropped: its transfers are settled without effect


class ClientLinkObject(LinkHandler):
    """What every client link object shares: its server, link and connection record, its state and
    its transitions, and its control events handled in its log context (see the module docstring)."""

    __slots__ = ("server", "link", "conn", "state")

    def __init__(self, server: Any, link: Link, conn: ClientConnection):
        self.server = server
        self.link = link
        self.conn = conn
        self.state = ATTACHING
        link.handler = self  # (its transfers and control events come here from now on)

    # ---------------------------------------------------------------- transitions
    def attached(self) -> None:
        self._to(ATTACHED)

    def awaiting_upstream(self) -> None:
        self._to(AWAITING_UPSTREAM)

    def moving(self) -> None:
        self._to(MOVING)

    def gone(self) -> None:
        self._to(GONE)

    def _to(self, state: str) -> None:
        if self.state is GONE or self.state is state:
            return
        log.debug("link %r of %s: %s -> %s", self.link.name, self.conn.id, self.state, state)
        self.state = state

    # ---------------------------------------------------------------- control events
    def on_flow(self, link: Link) -> None:
        self._handle(self.flow)

    def on_link_close(self, link: Link) -> None:
        # A detach without close (JMS consumer.close() on a durable subscription): it stays upstream.
        self._handle(self.closed_by_peer)

    def flow(self) -> None:
        """The client's flow (credit, drain) on this link."""

    def closed_by_peer(self) -> None:
        self.server._link_gone(self.link, closed=self.link.remote_closed)

    def _handle(self, event: Callable[[], None]) -> None:
        token = logs.enter(event_ids, self.link)
        try:
            event()
        except Exception:
            log.exception("%s failed", event.__name__)
            self.server._fail(self.link)
        finally:
            logs.leave(token)

    def failed(self) -> None:
        """A transfer raised (called while the exception is handled): logged in this link's context,
        then this link alone is closed."""
        token = logs.enter(event_ids, self.link)
        try:
            log.exception("handling a delivery failed")
            self.server._drop_link(self.link)
            close_link(self.link, "amqp:internal-error", "proxy failure on this link; see the proxy log")
        finally:
            logs.leave(token)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.link.name!r} of {self.conn.id}: {self.state}>"


class ServedLink(ClientLinkObject):
    """A client link served by an object of its own (`ClientLink.pair`: a `/management` link's
    `management.ManagementPair`, a reply address's `replies.ReplyNode`; or a `replies.ReplyInlet`):
    its transfers go to `serve(link, delivery pointer)`, its flow to the pair's `_client_credit`."""

    __slots__ = ("serve",)

    def __init__(self, server: Any, link: Link, conn: ClientConnection, serve: Callable[[Link, Any], None]):
        self.serve = serve
        super().__init__(server, link, conn)
        self.state = ATTACHED  # (its pair answers the attach, and knows the rest of its life)

    def transfer(self, delivery: Any) -> None:
        self.serve(self.link, delivery)

    def flow(self) -> None:
        pair = state_of(self.link).pair
        if pair is not None:
            pair._client_credit(self.link)
