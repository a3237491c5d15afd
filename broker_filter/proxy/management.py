"""RabbitMQ 4's `/management` node, passed through (issue 29 item 2).

RabbitMQ 4's AMQP 1.0 clients manage topology (declare, bind, purge, delete) over a request/response
link pair: a sender and a receiver, both attached to `/management` under one link name, both with
the link property `paired = true`, on one session (RabbitMQ's `LINK_PAIR_V1_0`).  The proxy relays
such a pair unchanged: for each client session that attaches to `/management` it begins one session
of its own on the upstream connection (with pass-through credentials, the client's own login), and
attaches there a link per client link with the client's link name, termini, settle modes and link
properties; the upstream's attach reply is the client's.  Messages go through as bytes (properties,
application-properties and bodies unchanged, nothing filtered), credit follows the upstream's
(requests) and the client's (responses), and outcomes go back where a delivery was unsettled.

Anywhere else (the embedded broker, RabbitMQ 3.x) a link to `/management` is refused with
`amqp:not-implemented` (`refusal`): the node is RabbitMQ 4's own.

Permissions.  With `[security]` settings, each request needs what `authorization.management_checks`
reads from it (`manage` on the queue or exchange it declares, deletes, purges or reads; for a
binding `manage` on its destination and `consume` on its source with its key); a request that is
not granted never reaches the broker: the daemon answers it
itself with status 403 and the refusal's text, as RabbitMQ answers a request its user may not make.

Order.  Directly, RabbitMQ answers a management call before it detaches the links the call
removed (a deleted queue's publishers, `amqp:resource-deleted`), and RabbitMQ's clients rely on it
(the detach would otherwise break the call waiting for its answer).  The proxy's pair is on a
session of its own upstream, so the broker may send the two in either order there: while a request
of a client connection is unanswered, a detach of that connection's links by the broker waits
(`after_calls`) until the answer has been relayed, or `ORDER_WAIT` seconds.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from ..amqp.message import Message, Properties
from ..authorization import PatternError, management_checks
from ..amqp.sections import decode_message, encode_message
from ..engine._cproton import lib
from ..engine.endpoints import Transfers
from ..engine.endpoints import LOCAL_ACTIVE, LOCAL_CLOSED, LOCAL_UNINIT, Link, Terminus, copy_remote
from . import remote_links
from .records import link_state
from .refusal import refuse_link
from .wire import receive, remote_outcome, send, settle_with

log = logging.getLogger("broker_filter.proxy.management")

MANAGEMENT = "/management"
ORDER_WAIT = 2.0  # at most this long a broker's detach waits for a management answer (see Order)
_tags = itertools.count(1)


class _Calls:
    """A client connection's management requests in flight and what waits for their answers."""

    __slots__ = ("waiting", "after")

    def __init__(self) -> None:
        self.waiting = 0
        self.after: list = []

    def answered(self) -> None:
        self.waiting = max(0, self.waiting - 1)
        if not self.waiting:
            self.flush()

    def flush(self) -> None:
        after, self.after = self.after, []
        for fn in after:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one detach must not keep the others
                log.exception("relaying a detach after a management answer failed")


def _calls(connection: Any) -> _Calls:
    state = connection.context  # the proxy's record of the client connection (records.ClientConnection)
    if state.management_calls is None:
        state.management_calls = _Calls()
    return state.management_calls


def after_calls(connection: Any, fn: Any, call_later: Any) -> None:
    """Run `fn` (relaying a detach the broker sent) once the management requests in flight on the
    client `connection` are answered, at the latest after ORDER_WAIT seconds; at once if none is."""
    calls = connection.context.management_calls  # (a `records.ClientConnection`)
    if calls is None or not calls.waiting:
        fn()
        return
    calls.after.append(fn)
    call_later(ORDER_WAIT, calls.flush)


def request_refusal(check: Any, data: bytes) -> tuple[str, str] | None:
    """(message id, why) when `check(needed, request)` refuses the request in `data`, else None
    (`needed`: the (operation, address) pairs `authorization.management_checks` reads from it; None
    for a request RabbitMQ would refuse as malformed: refused whenever permissions apply)."""
    try:
        m = decode_message(data)
    except Exception:  # noqa: BLE001 - the broker answers what it cannot read
        return None
    props = m.properties
    method = str(props.subject or "") if props is not None else ""
    path = str(props.to or "") if props is not None else ""
    try:
        needed = management_checks(method, path, m.body if isinstance(m.body, dict) else None)
    except PatternError:
        needed = None
    why = check(needed, f"management request {method} {path}")
    return None if why is None else (props.message_id if props is not None else None, why)


def forbidden(message_id: Any, why: str) -> bytes:
    """The daemon's own answer to a refused request: status 403 (HTTP over AMQP 1.0)."""
    return encode_message(Message(properties=Properties(correlation_id=message_id, subject="403"),
                                  application_properties={"http:response": "1.0"}, body=why))


def is_management(link: Any) -> bool:
    """A client link attached to `/management` (its source if it receives, else its target)."""
    terminus = link.remote_source if link.is_sender else link.remote_target
    return terminus.address == MANAGEMENT


def refusal(upstream: Any) -> str | None:
    """Why `/management` cannot be served in front of `upstream`, or None when it passes through."""
    if upstream.traits.serves_management:
        return None
    return (f"/management is RabbitMQ 4's management node: it passes through only in front of RabbitMQ 4, "
            f"and upstream {upstream.name} is "
            f"{_describe(upstream)}")


def _describe(upstream: Any) -> str:
    product = upstream.product
    if product is None:
        return "the embedded broker" if upstream.traits.in_process else "not connected"
    return " ".join(p for p in (product, upstream.version) if p)


def _copy_link(dst: Link, src: Link) -> None:
    """dst's termini, settle modes and properties as src's peer sent them."""
    if dst.ptr is not None and src.ptr is not None:
        copy_remote(dst.ptr, src.ptr)


def pair_session(upstream: Any, pair: Any) -> Any:
    """A session on `upstream`'s connection for a `/management` link pair (`pair` gets its events):
    on RabbitMQ 4 a begun session no link uses, rather than a begin that could reach a dying one."""
    session = upstream.sessions.take_idle()
    if session is None:
        session = upstream.connection.session()
        session.open()
    state = remote_links.session_state(session)
    state.endpoint = None
    state.pair = pair
    return session


class ManagementPair:
    """One client session's `/management` links and their upstream session."""

    def __init__(self, upstream: Any, client_session: Any, check: Any = None):
        self.upstream = upstream
        self.check = check  # addresses -> why they may not be managed, or None (`nodes`; None: no settings)
        self.answers: list[bytes] = []  # the daemon's own answers waiting for the client's credit
        self.client_session = client_session
        self.session = pair_session(upstream, self)
        self.links: dict[Any, Any] = {}  # client link -> upstream link
        self.closed = False
        upstream.pairs.add(self)

    @classmethod
    def serve(cls, upstream: Any, client_link: Link, route: Any, check: Any = None) -> None:
        """Relay `client_link` (a client's attach to `/management`): on its session's pair."""
        session = client_link.session
        pair = session.context
        if pair is None or pair.closed:
            pair = cls(upstream, session, check)
            session.context = pair
        pair.attach(client_link, route)

    def attach(self, client: Link, route: Any) -> None:
        up = self.session.sender(client.name) if client.is_receiver else self.session.receiver(client.name)
        _copy_link(up, client)
        state = remote_links.link_state(up)
        state.pair, state.peer = self, client
        mine = link_state(client)
        mine.pair, mine.peer = self, up
        self.links[client] = up
        route(client, self._client_transfer)  # (its flow: ProxyServer.on_flow, `_client_credit`)
        # the broker's deliveries and outcomes on it as raw pointers (its flow: RemoteUpstream.on_flow)
        up.handler = Transfers(lambda dlv, up=up: self.upstream_delivery(up, dlv))
        up.open()

    # ------------------------------------------------------------------ upstream events
    def upstream_open(self, up: Any) -> None:
        client = up.context.peer
        if client is None or client.local_state != LOCAL_UNINIT:
            return
        _copy_link(client, up)
        if up.is_sender and up.remote_target.null:
            client.set_target(Terminus(null=True))
        client.open()
        if up.is_sender:
            self._upstream_credit(up)

    def upstream_closed(self, up: Any) -> None:
        client = up.context.peer
        if up.local_state != LOCAL_CLOSED:
            up.close()  # detached on both ends: the engine frees it
        up.context.peer = None
        if client is not None:
            self.links.pop(client, None)
            client.context.peer = None
            c = up.remote_condition
            log.warning("upstream %s detached /management link %s: %s", self.upstream.name, client.name,
                        f"{c.name}: {c.description}" if c is not None else "no error")
            self._close_client(client, c.name if c is not None else "amqp:link:detach-forced",
                               c.description if c is not None else "the upstream detached the link")
        self._end_if_done()

    def upstream_flow(self, up: Any) -> None:
        if up.is_sender:
            self._upstream_credit(up)

    def upstream_delivery(self, up: Any, dlv: Any) -> None:
        state = up.context
        client = state.peer
        if not up.is_sender:
            data = receive(up.ptr, dlv)
            if data is None:
                return
            if client is None or client.local_state == LOCAL_CLOSED:
                lib.pn_delivery_settle(dlv)
                return
            settled = bool(lib.pn_delivery_settled(dlv)) or up.remote_settled_mode
            out = send(client.ptr, str(next(_tags)).encode(), data, settled=settled)
            if settled:
                lib.pn_delivery_settle(dlv)
            else:
                mine = client.context
                mine.unsettled = mine.unsettled or {}
                mine.unsettled[out] = dlv
            _calls(client.connection).answered()
        else:  # the broker's outcome of a request the client sent unsettled
            outcome = remote_outcome(dlv)
            if outcome is None and not lib.pn_delivery_settled(dlv):
                return
            origin = (state.unsettled or {}).pop(dlv, None)
            lib.pn_delivery_settle(dlv)
            if origin is not None and outcome is not None:
                settle_with(origin, outcome)

    # ------------------------------------------------------------------ client events
    def _client_transfer(self, client: Link, dlv: Any) -> None:
        mine = client.context
        up = mine.peer
        if client.is_receiver:  # a request
            data = receive(client.ptr, dlv)
            if data is None:
                return
            if up is None:
                lib.pn_delivery_settle(dlv)
                return
            refused = request_refusal(self.check, data) if self.check is not None else None
            # (a refused request is answered here; None: the broker answers)
            if refused is not None:
                lib.pn_delivery_settle(dlv)  # (accepted: answered, by the daemon)
                self.answers.append(forbidden(*refused))
                self._answer()
                self._upstream_credit(up)  # (the request took the client's credit, not the broker's)
                return
            settled = bool(lib.pn_delivery_settled(dlv))
            _calls(client.connection).waiting += 1
            out = send(up.ptr, str(next(_tags)).encode(), data, settled=settled)
            if settled:
                lib.pn_delivery_settle(dlv)
            else:
                state = up.context
                state.unsettled = state.unsettled or {}
                state.unsettled[out] = dlv
        else:  # the client's outcome of a response
            outcome = remote_outcome(dlv)
            if outcome is None and not lib.pn_delivery_settled(dlv):
                return
            origin = (mine.unsettled or {}).pop(dlv, None)
            lib.pn_delivery_settle(dlv)
            if origin is not None and outcome is not None:
                settle_with(origin, outcome)

    def _answer(self) -> None:
        """Send the daemon's own answers on the client's response link, as its credit allows."""
        for client in self.links:
            if not client.is_sender or client.local_state != LOCAL_ACTIVE:
                continue
            while self.answers and client.credit > 0:
                send(client.ptr, str(next(_tags)).encode(), self.answers.pop(0), settled=client.remote_settled_mode)
            return

    def _client_credit(self, client: Link) -> None:
        if self.answers and client.is_sender:
            self._answer()
        up = client.context.peer
        if client.is_sender and up is not None and up.local_state == LOCAL_ACTIVE:
            add = client.credit - up.credit - up.queued
            if add > 0:
                up.flow(add)

    def _upstream_credit(self, up: Any) -> None:
        client = up.context.peer
        if client is None or client.local_state != LOCAL_ACTIVE:
            return
        add = up.credit - client.credit - client.queued
        if add > 0:
            client.flow(add)

    def client_gone(self, client: Any) -> None:
        """The client detached `client`: so does its upstream link."""
        mine = client.context
        mine.pair = None
        up = self.links.pop(client, None)
        mine.peer = None
        if up is not None:
            up.context.peer = None
            if up.local_state != LOCAL_CLOSED:
                up.close()
        self._end_if_done()

    def lost(self, condition: str, description: str) -> None:
        """The upstream connection went: every client link of the pair is detached."""
        self.closed = True
        _calls(self.client_session.connection).flush()
        for client in list(self.links):
            self._close_client(client, condition, description)
        self.links.clear()

    def session_ended(self, condition: Any) -> None:
        self.closed = True
        self.upstream.pairs.discard(self)
        for client, up in list(self.links.items()):
            up.context.peer = None
            self._close_client(client, condition.name if condition is not None else "amqp:session:unattached-handle",
                               condition.description if condition is not None else "the upstream ended the session")
        self.links.clear()

    def _close_client(self, client: Link, condition: str, description: str | None) -> None:
        mine = client.context
        mine.peer = None
        mine.pair = None
        refuse_link(client, condition, description)

    def _end_if_done(self) -> None:
        if self.links or self.closed:
            return
        self.closed = True
        self.upstream.pairs.discard(self)
        if self.client_session.context is self:
            self.client_session.context = None
        if self.session.local_state != LOCAL_CLOSED:
            self.session.close()
            self.upstream.sessions.ending(self.session)  # a later begin waits for its answer (sessions.py)
