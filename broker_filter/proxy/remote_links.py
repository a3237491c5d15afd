"""The proxy's own links on a remote upstream's connection (`remote.RemoteUpstream`): a consumer or a
publisher, each in a session of its own, and what the upstream keeps on each engine session and link.

A `RemoteConsumer` flows credit, settles as its feed decides (in delivery order once asked) and asks
its queue's ready count; a `RemotePublisher` sends raw bytes and keeps each delivery's callback until
the broker settles it.  Both end by ending their session (`_RemoteLink._end`): on RabbitMQ 3.10 only
that returns a consumer's unsettled messages to the queue.  The upstream places them in sessions
(`remote_sessions.SessionPlacement`) and reads the broker's frames for them
(`remote_traffic.LinkTraffic`).
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any, Callable

from ..amqp import types as t
from ..engine._cproton import lib
from ..engine.endpoints import LOCAL_CLOSED, REMOTE_UNINIT, Link, Session
from .settlement import SettlementOrder
from .upstream import ConsumerHandler, ConsumerSpec, ErrorInfo, Outcome, PublisherHandler, RELEASED, UpstreamDelivery
from .wire import send, settle_with

log = logging.getLogger("broker_filter.proxy.upstream")

PROBE_TIMEOUT = 5.0  # seconds a count may take before it counts as unanswered


class _SessionState:
    """What the upstream keeps on each of its sessions (`Session.context`)."""

    __slots__ = ("endpoint", "pair", "end_when_begun", "idle_since")

    def __init__(self) -> None:
        self.endpoint: _RemoteLink | None = None  # the link's own endpoint using the session
        self.pair: Any = None  # a `management.ManagementPair` using it
        self.end_when_begun: _RemoteLink | None = None  # ended before its begin was answered
        self.idle_since = 0.0  # RabbitMQ 4: parked for the next link since (`_park`)


class _LinkState:
    """What the upstream keeps on each of its links (`Link.context`)."""

    __slots__ = ("endpoint", "pair", "peer", "recycle", "unsettled")

    def __init__(self) -> None:
        self.endpoint: _RemoteLink | None = None
        self.pair: Any = None  # a `management.ManagementPair` relaying it
        self.peer: Any = None  # ... and the client link it relays
        self.recycle: Session | None = None  # RabbitMQ 4: park this session once the detach is answered
        self.unsettled: dict | None = None  # a pair's relayed unsettled deliveries -> their origins


def session_state(session: Session) -> _SessionState:
    state = session.context
    if state is None:
        state = session.context = _SessionState()
    return state


def link_state(link: Link) -> _LinkState:
    state = link.context
    if state is None:
        state = link.context = _LinkState()
    return state


def _guarded(fn: Callable) -> Callable:
    """Error boundary for the upstream connection's engine callbacks: an unexpected failure ends the
    consumer or publisher concerned (its client links see amqp:internal-error), never the daemon."""

    @functools.wraps(fn)
    def wrapper(self: Any, subject: Any, *rest: Any) -> None:
        try:
            fn(self, subject, *rest)
        except Exception:
            log.exception("upstream %s: %s failed", self.name, fn.__name__)
            try:
                ep = _endpoint(subject) if isinstance(subject, Link) else None
                if ep is not None and not ep.closed:
                    ep._closed_by_upstream(ErrorInfo("amqp:internal-error", "proxy failure on the upstream link"))
            except Exception:
                log.exception("upstream %s: failure handling a failure", self.name)

    return wrapper


class _RemoteLink:
    """A link of the proxy's own on the upstream connection, in a session of its own: ending that
    session is what returns unsettled messages to the queue on RabbitMQ 3.10 (a detached link's
    unacknowledged messages stay with the session otherwise), and it keeps a session-ending error
    confined to this link."""

    def __init__(self, upstream: Any, handler: Any):
        self.handler = handler
        self.upstream = upstream
        self.link = None
        self.session = None
        self.closed = False
        self.ready = False
        self.offer_pending = False  # a consumer whose attach offers filters, its reply not in yet

    def _finish(self) -> bool:
        """Mark closed and forget; False if it already was."""
        if self.closed:
            return False
        self.closed = True
        self._discard()
        self.upstream._forget(self)
        return True

    def _discard(self) -> None:
        """Drop state that dies with the link (none by default)."""

    def _end(self) -> None:
        if self.upstream._drop_waiting(self.session):
            return  # it never began: nothing to end
        if self.session is not None and self.session.remote_state == REMOTE_UNINIT:
            # Its begin is not answered yet: ending it now frees the channel, and the answer would
            # then name a channel proton no longer knows, which fails the whole upstream connection.
            session_state(self.session).end_when_begun = self
            return
        if self.link is not None and self.link.local_state != LOCAL_CLOSED:
            self.link.close()
        if self.upstream.recycles_sessions and self.link is not None and self.session is not None:
            self.upstream._recycle_after_detach(self.session, self.link)
            return
        if self.session is not None and self.session.local_state != LOCAL_CLOSED:
            holding = self.link.unsettled_count if self.link is not None else 0
            self.session.close()
            self.upstream.sessions.ending(self.session, holding)

    def _closed_by_upstream(self, error: ErrorInfo) -> None:
        if not self._finish():
            return
        if not error.transient:
            self._end()
        self._notify_closed(error)

    def _notify_closed(self, error: ErrorInfo) -> None:
        raise NotImplementedError


class RemoteConsumer(_RemoteLink):
    """An upstream receiving link.  Its deliveries are settled as the feed decides, or, once
    `settle_in_order()` was called (subscription feeds, where every delivery is decided within the
    feed's window), in delivery-id order: proton-c then sends one disposition frame for a run of
    consecutive deliveries instead of one per message.  A decided outcome waits behind undecided
    ones at most until `settlement.ORDER_LIMIT` of them wait, and never past `close()`; the order
    is kept by a `settlement.SettlementOrder`, this class applies what it releases."""

    def __init__(self, upstream: Any, spec: ConsumerSpec, handler: ConsumerHandler):
        super().__init__(upstream, handler)
        self.spec = spec
        self.order: SettlementOrder | None = None  # ordered settlement; None: off

    @property
    def credit(self) -> int:
        return self.link.credit if self.link is not None and not self.closed else 0

    def flow(self, n: int) -> None:
        if n > 0 and not self.closed and self.link is not None:
            if self.upstream.probing is self:
                self.upstream.probe_answered(-1)  # credit withdraws the question (no drain with it)
            credit = self.link.credit
            if credit < 0:
                # The broker sent more than the credit it had (RabbitMQ 3.x, rabbitmq-server#2597):
                # proton's count is below zero, and the flow frame carries it as an unsigned
                # link-credit, so adding n to it would grant the broker about 2^32 messages.  Grant n
                # from zero; the deliveries it sent beyond are the feed's anyway.
                n -= credit
            self.link.flow(n)

    def settle_in_order(self) -> None:
        if self.order is None:
            self.order = SettlementOrder()

    def filter_counts(self) -> None:
        """(The broker's own filter counts are not known: only the embedded broker reports them.)"""
        return None

    def probe(self, answer: Callable[[int | None], None]) -> bool | None:
        """Ask how many messages the queue has ready: a drain without credit, which RabbitMQ 4
        answers with a flow carrying `available` (read from the frame trace, like an attach reply's
        capabilities; one question per connection at a time).  answer(n) comes later: the count,
        -1 if credit withdrew the question, None without an answer in PROBE_TIMEOUT seconds.
        False: not now (credit outstanding, another question open); None: this upstream is never
        asked (not RabbitMQ 4)."""
        up = self.upstream
        if not up.traits.counts_queue:
            return None
        if self.closed or self.link is None or self.link.credit or up.probing is not None or up.connection is None:
            return False
        up.probing, up.probe_answer = self, answer
        up.probe_timer = up.loop.call_later(PROBE_TIMEOUT, lambda: up.probe_answered(None))
        up._trace_frames(+1)
        self.link.drain(0)
        return True

    def settle(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        if outcome.kind == "modified" and not self.upstream.traits.modified_ok:
            outcome = RELEASED
        order = self.order
        if order is None or order.decided_first(delivery):
            self._apply(delivery, outcome)
            return
        for d, o in order.decided(delivery, outcome):
            self._apply(d, o)

    def _settle_decided(self) -> None:
        """Settle every decided outcome now, out of order."""
        if self.order is not None:
            for d, o in self.order.flush():
                self._apply(d, o)

    def _apply(self, delivery: UpstreamDelivery, outcome: Outcome) -> None:
        dlv = delivery.ref
        delivery.ref = None
        if dlv is None or self.closed:
            return  # the link is gone: the broker has already taken the message back
        settle_with(dlv, outcome)

    def _discard(self) -> None:
        if self.order is not None:
            self.order.clear()

    def close(self, closed: bool | None = None) -> None:
        # `closed` does not matter here: the remote link is private to the proxy (see open_consumer).
        if not self.closed:
            self._settle_decided()  # what the feed decided reaches the broker before the detach
        if self._finish():
            self._end()

    def _notify_closed(self, error: ErrorInfo) -> None:
        self.handler.on_consumer_closed(self, error)


class RemotePublisher(_RemoteLink):
    def __init__(self, upstream: Any, address: str | None, handler: PublisherHandler):
        super().__init__(upstream, handler)
        self.address = address
        self._tags = itertools.count(1)
        self.pending: dict[Any, Callable[[Outcome], None]] = {}

    @property
    def credit(self) -> int:
        return lib.pn_link_credit(self.link.ptr) if self.link is not None and self.ready and not self.closed else 0

    def send(self, data: bytes, on_settled: Callable[[Outcome], None]) -> None:
        if self.closed or self.link is None:
            return
        # keyed by the delivery's pointer: valid until settled in `RemoteUpstream._published`
        self.pending[send(self.link.ptr, b"%x" % next(self._tags), data)] = on_settled
        self.upstream.last_publisher = self  # the first suspect if the connection drops now (`_culprits`)

    def close(self) -> None:
        if self._finish():
            self._end()

    def _discard(self) -> None:
        self.pending.clear()

    def _notify_closed(self, error: ErrorInfo) -> None:
        self.handler.on_publisher_closed(self, error)


def _client_of(publisher: "RemotePublisher") -> str:
    """Who publishes through `publisher`: its client's address, connection id and container id, read
    from its handler (a client link's inlet, or an anonymous relay's target), else the daemon itself."""
    conn, address = publisher.handler.publishing_client()
    address = address or publisher.address
    if conn is None:
        return f"address {address} (the daemon's own publisher)"
    engine = conn.connection  # (a `records.ClientConnection`)
    container = engine.remote_container if engine is not None else None
    return f"address {address} from client connection {conn.id} (container id {container!r})"


def _endpoint(link: Link) -> Any:
    state = link.context
    return state.endpoint if state is not None else None


def _key(k: Any) -> Any:
    return t.symbol(k) if type(k) is str else k
