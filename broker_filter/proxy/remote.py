"""An upstream that is a remote AMQP 1.0 broker (RabbitMQ or any other), over one engine connection (proton-c's, `broker_filter.engine`).

Theory of operation: one connection carries every consumer and publisher of the proxy, each in a
session of its own, ended with it (on RabbitMQ 4 kept, idle, for the next link): RabbitMQ 3.10
returns a consumer's unsettled messages to the queue only when its session ends, and answers some
errors (a missing exchange) by ending the session, which must take down only the endpoint concerned.
Which session a link gets, when a new session may begin (never while an ended one may still hold its
channel number at the broker), and when an idle one ends is decided in `sessions.Sessions`, whose
module docstring gives the rules (`BEGIN_HOLD`, `SESSION_IDLE`, `END_SETTLE`); this module applies
the decisions to the engine's sessions and runs their timers.  Deliveries are received as raw bytes and
settled with the client's outcome; nothing is settled upstream on the proxy's own initiative except
what the forwarding rules decide.  When the connection drops, every consumer and publisher is
reported closed with a transient `amqp:connection:forced` error (the broker returns their unsettled
messages to the queues) and the upstream reconnects with exponential backoff (0.1 s doubling to
`max_backoff`).

What the remote evaluates (push-down) is decided from its open frame, never from an attach echo
(RabbitMQ 3.10 echoes a selector and still delivers everything): selectors only if it offers
`APACHE.ORG:SELECTOR` or `APACHE.ORG:JMS_FILTERS`, legacy bindings only if it offers
`APACHE.ORG:LEGACY_AMQP_EXCHANGE_FILTERS`, unless the configuration declares the kinds itself.
Filter expressions (filtex) are decided by each attach reply instead (`can_offer`): every consumer
attach carries the client's property and SQL filters (RabbitMQ 3.10, 4.0 and 4.1+ echo them and
refuse nothing; another broker-filter evaluates them), and the upstream evaluates one only when the
reply offers its capability and echoes it under its key (`upstream.evaluated_offers`).  RabbitMQ 4.1+
offers `AMQP_FILTEX_PROP_V1_0` / `AMQP_FILTEX_SQL_V1_0` in the attach frame's own
offered-capabilities, on streams only; python-qpid-proton 0.40 does not expose a link's remote
offered-capabilities, so the proxy reads them from proton's frame trace of the attach reply
(`frametrace.py`), traced only while a consumer attach that offers filters awaits its reply.
RabbitMQ (by its `product` connection property) takes a binding key as part of an `/exchange/X/key`
address (`binds_exchange_keys`).  RabbitMQ 3.x ends the session on a `modified` outcome, so
`modified` is sent to it as `released`; RabbitMQ 4 (by its `version` property) honours `modified`
and gets it unchanged (`delivery-failed` raises a quorum queue's delivery-count; `undeliverable-here`
dead-letters, as it would for a client of its own).  RabbitMQ 4's v2 addresses (`/queues/q`,
`/exchanges/x/key`) pass through like any address; a missing queue makes RabbitMQ 4 end the
session, which, the session being the link's own, refuses only that link with `amqp:not-found`.
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from ..amqp import types as t
from ..security import redact_url
from ..engine._cproton import lib
from ..engine.container import Typed
from ..engine.endpoints import (LOCAL_CLOSED, LOCAL_UNINIT, REMOTE_CLOSED, REMOTE_UNINIT, Connection, Handler,
                                Link, Session, Terminus)
from .frametrace import parse_attach_capabilities, parse_available
from .wire import receive, remote_outcome, send, settle_with
from .sessions import Sessions
from .settlement import SettlementOrder
from .sharing import address_form_routing
from .traits import Traits, traits_of
from .upstream import (
    ConsumerHandler,
    ConsumerInfo,
    ConsumerSpec,
    ErrorInfo,
    Loop,
    Outcome,
    PublisherHandler,
    RELEASED,
    UpstreamBase,
    UpstreamDelivery,
    UpstreamListener,
    FILTEX_KINDS,
    evaluated_offers,
)

log = logging.getLogger("broker_filter.proxy.upstream")

SELECTOR_CAPS = frozenset({"APACHE.ORG:SELECTOR", "APACHE.ORG:JMS_FILTERS"})
BINDING_CAPS = frozenset({"APACHE.ORG:LEGACY_AMQP_EXCHANGE_FILTERS"})
PROBE_TIMEOUT = 5.0  # seconds a count may take before it counts as unanswered
STOP_ENDS = 1.0  # seconds a stop waits for ended sessions to be answered before closing the connection
ANSWER_TIMEOUT = 5.0  # default `upstream.answer_timeout`: longest wait for a begin, attach or end to be answered
# Why an upstream connection went down (`RemoteUpstream.lost_cause`; the reconnects counter's `cause`):
# the broker closed it (a close frame), the socket closed or failed under it, the broker fell silent for
# longer than the heartbeat allows, or the daemon gave up on an unanswered begin, attach or end.
LOSS_CAUSES = ("broker-closed", "socket", "heartbeat", "unanswered")
CULPRITS_LOGGED = 5  # publishers named in the log line of a dropped connection


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
    def wrapper(self: "RemoteUpstream", subject: Any, *rest: Any) -> None:
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

    def __init__(self, upstream: "RemoteUpstream", handler: Any):
        self.handler = handler
        self.upstream = upstream
        self.link = None
        self.session = None
        self.closed = False
        self.ready = False

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

    def __init__(self, upstream: "RemoteUpstream", spec: ConsumerSpec, handler: ConsumerHandler):
        super().__init__(upstream, handler)
        self.spec = spec
        self.offer_pending = False  # its attach offers filters and the reply is not in yet
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
    def __init__(self, upstream: "RemoteUpstream", address: str | None, handler: PublisherHandler):
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


class RemoteUpstream(Handler, UpstreamBase):
    """`upstream.Upstream` for a remote broker at `url` (amqp://[user:pass@]host:port, amqps://…).

    Several URLs: failover, tried in turn on each (re)connect attempt.  `backoff(attempt)` gives the
    wait before reconnect attempt `attempt` (0-based); default 0.1 s doubling up to `max_backoff`.
    amqps:// URLs use the container's client TLS context (`[upstream.tls]`).
    """

    def __init__(
        self,
        url: str | list[str] | tuple[str, ...],
        *,
        pushdown_kinds: frozenset[str] | None = None,
        max_backoff: float = 5.0,
        backoff: Callable[[int], float] | None = None,
        heartbeat: float | None = None,
        properties: dict[str, str] | None = None,
        answer_timeout: float = ANSWER_TIMEOUT,
        management_url: str = "",
    ):
        super().__init__()
        self.properties = dict(properties or {})  # more connection properties (a replica's name)
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        self._targets = []
        for u in urls:
            parts = urlsplit(u)
            if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
                raise ValueError(f"upstream URL must be amqp://[user:pass@]host[:port] or amqps://…, not {redact_url(u)!r}")
            port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
            # The URL's path names the RabbitMQ vhost (as in RabbitMQ's URI spec): `/` by default
            vhost = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
            self._targets.append((
                f"{parts.scheme}://{parts.hostname}:{port}",
                unquote(parts.username) if parts.username else None,
                unquote(parts.password) if parts.password else None,
                parts.scheme == "amqps",
                vhost,
            ))
        self.url = urls[0]
        self.vhost = self._targets[0][4]  # the vhost every upstream connection opens (its URL's path)
        self.name = ", ".join(redact_url(u) for u in urls)
        self._backoff_fn = backoff
        self._attempt = 0
        self.configured_pushdown = pushdown_kinds
        self.max_backoff = max_backoff
        self.heartbeat = heartbeat
        self.answer_timeout = answer_timeout
        # which sessions are ended, waiting, idle (see broker_filter/proxy/sessions.py); applied here
        self.sessions = Sessions(self.name)
        self._abandoned_timer = None
        self.stuck_reconnects = 0  # reconnects because a begin, attach or end went unanswered
        self.lost_cause: str | None = None  # why the connection last went down (one of LOSS_CAUSES)
        self.last_publisher: Any = None  # the publisher that sent last (`RemotePublisher.send`)
        self.pairs: set = set()  # `management.ManagementPair`s on this connection, and `topology_pair`
        self.topology_pair: Any = None  # the daemon's own /management pair (`topology.Topology`)
        self.management_url = management_url  # RabbitMQ 3.x: its HTTP API (`topology.HttpTopology`)
        self.topology_http: Any = None
        self.loop: Loop | None = None
        self.listener: UpstreamListener | None = None
        self.connection = None
        self.connected = False
        self.stopped = False
        self.remote_capabilities: frozenset[str] = frozenset()
        self.product: str | None = None
        self.traits = Traits()  # from the open frame (on_connection_remote_open)
        self.version: str | None = None
        self._idle_timer = None
        self._endpoints: dict[str, Any] = {}
        self._hold_timer = None
        self._stop_timer = None
        self._names = itertools.count(1)
        self._backoff = 0.1
        self._reconnect_timer = None
        self.connects = 0
        self._awaiting_trace = 0  # consumer attaches offering filters whose reply is not in yet
        self.probing: RemoteConsumer | None = None  # the consumer whose queue count was asked for
        self.probe_answer: Callable[[int | None], None] | None = None
        self.probe_timer: Any = None
        self._traced: dict[str, frozenset[str]] = {}  # link name -> its attach reply's offered-capabilities

    @property
    def recycles_sessions(self) -> bool:
        """RabbitMQ 4: sessions outlive their links (broker_filter/proxy/sessions.py)."""
        return self.sessions.recycles

    @property
    def unanswered_ends(self) -> int:
        """Ended sessions given up on after `sessions.BEGIN_HOLD`."""
        return self.sessions.unanswered_ends

    # ------------------------------------------------------------------ Upstream
    def start(self, loop: Loop, listener: UpstreamListener) -> None:
        self.loop = loop
        self.listener = listener
        self._connect()

    def stop(self) -> None:
        """Close every link and the connection.  The connection's close waits (at most
        STOP_ENDS seconds) for the broker to answer the sessions ended here: RabbitMQ 3.10 drops
        dispositions its session processes have not handled when the connection closes, so the
        accept of a move's original sent just before would be lost and the message redelivered
        beside its copy.  A session's `end` is answered after its earlier frames."""
        self.stopped = True
        if self._reconnect_timer is not None:
            self._reconnect_timer.cancel()
        if self.topology_http is not None:
            self.topology_http.close()
        for ep in list(self._endpoints.values()):
            ep.close()
        if self.connection is not None:
            if self.sessions.ended:
                self._stop_timer = self.loop.call_later(STOP_ENDS, self._close_connection)
            else:
                self._close_connection()

    def _close_connection(self) -> None:
        if self._stop_timer is not None:
            self._stop_timer.cancel()
            self._stop_timer = None
        if self.connection is not None and self.connection.local_state != LOCAL_CLOSED:
            self.connection.close()

    def closing(self) -> bool:
        """Stopped, and the connection's close not yet answered (or the socket not yet closed)."""
        return self.stopped and self.connection is not None

    def can_evaluate(self, entry: Any) -> bool:
        kind = getattr(entry, "kind", None)
        if self.configured_pushdown is not None:
            return kind in self.configured_pushdown
        if kind == "selector":
            return bool(self.remote_capabilities & SELECTOR_CAPS)
        if kind in ("direct", "topic", "headers"):
            return bool(self.remote_capabilities & BINDING_CAPS)
        return False

    def _applies(self, entry: Any) -> bool:
        """Whether the upstream's echo of a passed-through filter can be believed: RabbitMQ 3.10 and
        4.0 echo every filter, applied or not, so from RabbitMQ only its own (`rabbitmq:*`, its
        stream filters) count; another broker-filter echoes only what it applies."""
        if self.traits.chained:
            return True
        descriptor = getattr(entry.value, "descriptor", None)
        return self.product == "RabbitMQ" and isinstance(descriptor, str) and descriptor.startswith("rabbitmq:")

    def can_offer(self, entry: Any) -> bool:
        """Filter expressions go on every consumer attach: the reply decides (module docstring)."""
        return getattr(entry, "kind", None) in FILTEX_KINDS

    def routing_type(self, address: str | None, capabilities: tuple[str, ...] = ()) -> str | None:
        return address_form_routing(address)

    def open_consumer(self, spec: ConsumerSpec, handler: ConsumerHandler) -> RemoteConsumer:
        consumer = RemoteConsumer(self, spec, handler)
        name = f"{spec.name or 'consumer'}-{next(self._names)}"
        session = self._session_for(consumer)
        if session is None:
            return consumer
        filters = spec.filters + spec.offered + spec.passthrough
        durable, expiry = 0, "session-end"
        if _names_a_queue(spec):
            # How RabbitMQ declares or finds the node: 3.10 declares a `/queue/` node from the
            # source's durability and refuses an existing one declared otherwise.
            durable = spec.durable or 0
            if spec.expiry_policy in _EXPIRY_POLICIES:
                expiry = spec.expiry_policy
        # A subscription's durability, expiry and the client's link name are not passed on: the
        # upstream link is the proxy's own (named "<name>-<n>"), so a durable subscription could not
        # be found again.
        source = Terminus(address=spec.address, durability=durable, expiry_policy=expiry,
                          distribution_mode=spec.distribution_mode if spec.distribution_mode in ("copy", "move")
                          else None,
                          filter={_key(e.key): e.value for e in filters} if filters else None,
                          capabilities=_routing_capabilities(spec.capabilities))
        link = session.receiver(name, source=source, target=Terminus())
        if spec.offered:
            consumer.offer_pending = True
            self._trace_frames(+1)
        self._attach(consumer, name, link)
        return consumer

    def open_publisher(self, address: str | None, handler: PublisherHandler,
                       capabilities: tuple[str, ...] = (), durable: int | None = None) -> RemotePublisher:
        publisher = RemotePublisher(self, address, handler)
        name = f"publisher-{next(self._names)}"
        session = self._session_for(publisher)
        if session is None:
            return publisher
        link = session.sender(name, target=Terminus(address=address, durability=durable or 0,
                                                    capabilities=_routing_capabilities(capabilities)),
                              source=Terminus())
        self._attach(publisher, name, link)
        return publisher

    def _session_for(self, endpoint: _RemoteLink) -> Any:
        """A session of the endpoint's own (see _RemoteLink), or None when the upstream is down: the
        endpoint is then told so on the next turn of the loop.  Which session, and whether it begins
        now, `self.sessions` decides."""
        if not self.connected or self.connection is None:
            self.loop.call_soon(lambda: endpoint._closed_by_upstream(
                ErrorInfo("amqp:connection:forced", f"upstream {self.name} is not connected", transient=True)))
            return None
        session = self.sessions.take_idle()
        if session is not None:
            session_state(session).endpoint = endpoint
            endpoint.session = session
            return session
        session = self.connection.session()
        session_state(session).endpoint = endpoint
        endpoint.session = session
        if self.sessions.begin(session):
            session.open()
        elif self._hold_timer is None:  # it begins, then its link attaches, in _begin_waiting
            self._hold_timer = self._at(self.sessions.hold_due(), self._begin_waiting)
        self._arm_abandoned()
        return session

    def _at(self, due: float, fn: Callable[[], None], least: float = 0.0) -> Any:
        """Run `fn` on the loop at `due` on the sessions' clock (at least `least` seconds from now)."""
        return self.loop.call_later(max(least, due - self.sessions.clock()), fn)

    def _ended_answered(self, session: Any) -> None:
        free_at = self.sessions.answered(session)
        if self.stopped:
            self.sessions.freed(session)
            if not self.sessions.ended and self._stop_timer is not None:
                self._close_connection()
            return
        if free_at is not None:
            # The broker forgets the channel only after it answered: keep it busy a moment longer.
            self._at(free_at, functools.partial(self._channel_free, session, self.connection))
            return
        self._channel_free(session, self.connection)

    def _channel_free(self, session: Any, connection: Any) -> None:
        if connection is not self.connection:
            return  # from a connection since lost, whose state went with it
        if self.sessions.freed(session):
            self._begin_waiting()

    def _recycle_after_detach(self, session: Any, link: Any) -> None:
        """Keep `session` for the next link once `link`'s detach is answered (RabbitMQ 4)."""
        if session.local_state == LOCAL_CLOSED:
            return
        if link.remote_state == REMOTE_CLOSED:
            self._park(session)
        else:
            link_state(link).recycle = session  # on_link_close parks it

    def _park(self, session: Any) -> None:
        session_state(session).endpoint = None
        if (self.connection is None or session.connection is not self.connection
                or session.local_state == LOCAL_CLOSED or session.remote_state == REMOTE_CLOSED):
            return
        if self.sessions.park(session) and self._idle_timer is None:
            self._idle_timer = self._at(self.sessions.idle_due(), self._end_idle)

    def _end_idle(self) -> None:
        """End the sessions idle for SESSION_IDLE seconds; look again while some are left."""
        self._idle_timer = None
        for session in self.sessions.end_idle():
            session.close()
        due = self.sessions.idle_due()
        if due is not None:
            self._idle_timer = self._at(due, self._end_idle, least=0.1)

    def _begin_waiting(self) -> None:
        waiting = self.sessions.begin_waiting()
        self._arm_abandoned()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        for session in waiting:
            session.open()
            # Opened only now: proton sends no attach for a link opened before its session began.
            endpoint = session_state(session).endpoint
            endpoint.link.open()
            self._await_answer(endpoint)

    # ------------------------------------------------------------------ unanswered begins, attaches, ends
    def _await_answer(self, endpoint: _RemoteLink) -> None:
        """Bound the wait for the answer to the begin and attach just sent for `endpoint`."""
        self.loop.call_later(self.answer_timeout,
                             functools.partial(self._check_answer, endpoint, self.connection))

    def _check_answer(self, endpoint: _RemoteLink, connection: Any) -> None:
        """`answer_timeout` after an attach went out: if it is still unanswered, the client link is
        refused and the upstream connection reconnected (a session the broker does not answer can be
        neither ended nor trusted, and on RabbitMQ 3.10 only its end or the connection's close
        returns what it holds unsettled)."""
        if connection is not self.connection or endpoint.ready or endpoint.closed:
            return
        session = endpoint.session
        what = "begin" if session is None or session.remote_state == REMOTE_UNINIT else "attach"
        link = endpoint.link.name if endpoint.link is not None else "?"
        address = endpoint.spec.address if isinstance(endpoint, RemoteConsumer) else endpoint.address
        reason = (f"upstream {self.name} did not answer the {what} of link {link} (address {address}) "
                  f"within {self.answer_timeout:g} s")
        # (not transient: this link is what the broker left unanswered, so it is refused, not resumed;
        # the other links of the connection are closed transiently by the reconnect, and resumed)
        endpoint._closed_by_upstream(ErrorInfo(
            "amqp:link:detach-forced", f"{reason}; the daemon reconnects to it: attach again", transient=False))
        self._reconnect_stuck(reason)

    def _arm_abandoned(self) -> None:
        """Look again when ended sessions given up on while holding unsettled deliveries are
        `answer_timeout` old (never while `sessions.RECONNECT_FOR_ENDS` is off)."""
        due = self.sessions.abandoned_due(self.answer_timeout)
        if due is not None and self._abandoned_timer is None:
            self._abandoned_timer = self._at(due, self._check_abandoned)

    def _check_abandoned(self) -> None:
        self._abandoned_timer = None
        due = self.sessions.abandoned_due(self.answer_timeout)
        if due is None or self.connection is None:
            return
        if due <= self.sessions.clock():
            self._reconnect_stuck(f"upstream {self.name} did not answer the end of {len(self.sessions.abandoned)} "
                                  f"session(s) holding unsettled messages within {self.answer_timeout:g} s")
        else:
            self._abandoned_timer = self._at(due, self._check_abandoned)

    def _reconnect_stuck(self, reason: str) -> None:
        if self.stopped or self.connection is None:
            return
        log.warning("%s; reconnecting the upstream connection (its links are detached and attach again)", reason)
        self.stuck_reconnects += 1
        self._lost(_Reason(reason), cause="unanswered")

    def _drop_waiting(self, session: Any) -> bool:
        """Forget a session that never began (its endpoint closed while it waited)."""
        if not self.sessions.drop_waiting(session):
            return False
        session_state(session).endpoint = None
        session.free()
        return True

    def _attach(self, endpoint: _RemoteLink, name: str, link: Link) -> None:
        link_state(link).endpoint = endpoint
        endpoint.link = link
        self._endpoints[name] = endpoint
        # its deliveries straight from the engine's event loop, as raw pointers (`on_flow` takes its flow)
        failed = functools.partial(self._typed_failed, endpoint)
        if isinstance(endpoint, RemoteConsumer):
            self.loop.container.route(link, Typed(functools.partial(self._received, endpoint, link.ptr), failed))
        else:
            self.loop.container.route(link, Typed(functools.partial(self._published, endpoint), failed))
        if endpoint.session not in self.sessions.waiting:
            link.open()
            self._await_answer(endpoint)

    def _forget(self, endpoint: Any) -> None:
        if endpoint.link is not None:
            self._endpoints.pop(endpoint.link.name, None)
            self._traced.pop(endpoint.link.name, None)
        if getattr(endpoint, "offer_pending", False):
            self._offer_answered(endpoint)

    # ------------------------------------------------------------------ answers read from the frame trace
    def _trace_frames(self, delta: int) -> None:
        """Trace frames while an answer proton has no accessor for is awaited: a consumer attach's
        reply that offers filters (a link's remote offered-capabilities; see the module docstring), or
        the flow answering a queue count (`RemoteConsumer.probe`)."""
        before = self._awaiting_trace
        self._awaiting_trace = max(0, before + delta)
        if self.connection is None or (before > 0) == (self._awaiting_trace > 0):
            return
        if self._awaiting_trace:
            self.connection.trace(functools.partial(self._on_trace, None))
        else:
            self.connection.trace(None)

    def probe_answered(self, n: int | None) -> None:
        """The count asked for by `RemoteConsumer.probe` (see there)."""
        consumer, answer = self.probing, self.probe_answer
        if consumer is None:
            return
        self.probing = self.probe_answer = None
        if self.probe_timer is not None:
            self.probe_timer.cancel()
            self.probe_timer = None
        self._trace_frames(-1)
        if consumer.link is not None and not consumer.closed:
            consumer.link.set_drain(False)
        answer(n)

    def _offer_answered(self, consumer: "RemoteConsumer") -> None:
        consumer.offer_pending = False
        self._trace_frames(-1)

    def _on_trace(self, transport: Any, message: str) -> None:
        try:
            if self.probing is not None:
                n = parse_available(message)
                if n is not None:
                    self.loop.call_later(0, lambda: self.probe_answered(n))  # not inside proton's I/O
                    return
            attach = parse_attach_capabilities(message)
            if attach is None:
                return
            name, caps = attach
            if not getattr(self._endpoints.get(name), "offer_pending", False):
                return  # not a consumer attach awaiting its reply
            self._traced[name] = caps
        except Exception:
            log.exception("upstream %s: reading an attach reply's capabilities failed", self.name)

    # ------------------------------------------------------------------ connection
    def _connect(self) -> None:
        self._reconnect_timer = None
        if self.stopped:
            return
        address, user, password, _tls, vhost = self._targets[self.connects % len(self._targets)]
        self.connects += 1
        kwargs: dict[str, Any] = {
            "url": address,
            "handler": self,
            "reconnect": False,
            "properties": {"product": "broker-filter", **self.properties},
        }
        if vhost != "/":
            kwargs["virtual_host"] = f"vhost:{vhost}"
        if self.heartbeat:
            kwargs["heartbeat"] = self.heartbeat
        if user is not None:
            kwargs["user"] = user
            kwargs["password"] = password or ""
            kwargs["allow_insecure_mechs"] = True
        else:
            kwargs["allowed_mechs"] = "ANONYMOUS"
        try:
            self.connection = self.loop.container.connect(**kwargs)
        except Exception as e:  # e.g. DNS failure raised synchronously
            log.warning("upstream %s: connect failed: %s", self.name, e)
            self._schedule_reconnect()

    def _log_culprits(self, cause: str, condition: Any) -> None:
        """Name the clients whose publishes were in flight when the broker dropped the connection: a
        message it could not take is among them (RabbitMQ 3.x drops the connection on one without
        naming it; broker_filter/proxy/admission.py refuses the kinds known), the last one sent first."""
        suspects = [ep for ep in self._endpoints.values() if isinstance(ep, RemotePublisher) and ep.pending]
        last, self.last_publisher = self.last_publisher, None
        if not suspects:
            return
        suspects.sort(key=lambda ep: ep is not last)
        why = getattr(condition, "description", None) or getattr(condition, "name", None) or "no reason given"
        named = "; ".join(f"{len(ep.pending)} in flight to {_client_of(ep)}" for ep in suspects[:CULPRITS_LOGGED])
        more = f"; and {len(suspects) - CULPRITS_LOGGED} more publisher(s)" if len(suspects) > CULPRITS_LOGGED else ""
        log.warning("upstream %s dropped the connection (%s: %s) with publishes in flight, the last sent first: "
                    "%s%s", self.name, cause, why, named, more)

    def _schedule_reconnect(self) -> None:
        if self.stopped or self._reconnect_timer is not None:
            return
        if self._backoff_fn is not None:
            delay = self._backoff_fn(self._attempt)
        else:
            delay = self._backoff
            self._backoff = min(self._backoff * 2, self.max_backoff)
        self._attempt += 1
        log.info("upstream %s: reconnecting in %.1fs", self.name, delay)
        self._reconnect_timer = self.loop.call_later(delay, self._connect)

    def _lost(self, condition: Any, aborted: bool = False, cause: str = "socket") -> None:
        """The connection is gone (`cause`, one of LOSS_CAUSES): every endpoint is closed with a
        transient error and a reconnect is scheduled."""
        was_connected = self.connected
        self.connected = False
        if was_connected:
            self.lost_cause = cause
            if cause != "unanswered":
                self._log_culprits(cause, condition)
        self.sessions.reset()
        for timer in (self._hold_timer, self._idle_timer, self._abandoned_timer):
            if timer is not None:
                timer.cancel()
        self._hold_timer = self._idle_timer = self._abandoned_timer = None
        conn, self.connection = self.connection, None
        self._awaiting_trace = 0
        self._traced.clear()
        if self.probing is not None:
            self.probe_answered(None)
        desc = f"upstream {self.name} connection lost"
        if condition is not None and getattr(condition, "description", None):
            desc += f": {condition.description}"
        err = ErrorInfo("amqp:connection:forced", desc, transient=True, aborted=aborted)
        pairs, self.pairs = list(self.pairs), set()
        for pair in pairs:
            pair.lost(err.condition, err.description)
        for ep in list(self._endpoints.values()):
            try:
                ep._closed_by_upstream(err)
            except Exception:
                log.exception("upstream %s: closing an endpoint failed", self.name)
        self._endpoints.clear()
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        if was_connected:
            log.warning("%s", desc)
            self.listener.on_upstream_down(self, err)
        else:
            # An attempt that never opened: a listener that would rather give up than wait for the
            # next (a pass-through client whose vhost or login the broker refuses) is told.
            failed = getattr(self.listener, "on_upstream_failed", None)
            if failed is not None and conn is not None:
                failed(self, err)
        self._schedule_reconnect()

    # ------------------------------------------------------------------ the connection's engine events
    @_guarded
    def on_connection_open(self, conn: Connection) -> None:
        if conn is not self.connection:
            return
        self.remote_capabilities = frozenset(conn.remote_offered_capabilities)
        props = conn.remote_properties
        props = props if isinstance(props, dict) else {}
        product = props.get("product")
        self.product = str(product) if product is not None else None
        version = props.get("version")
        self.version = str(version) if version is not None else None
        # another broker-filter (it stands in for a RabbitMQ behind it under RabbitMQ's product name)
        marked = props.get("broker-filter") is not None
        self.traits = traits = traits_of(self.product, self.version, marked)  # see broker_filter/proxy/traits.py
        self.sessions.recycles = traits.recycles_sessions
        self.connected = True
        self._backoff = 0.1
        self._attempt = 0
        log.info("upstream %s: connected (%s)", self.name,
                 " ".join(p for p in (self.product, self.version) if p) or "unknown product")
        self.listener.on_upstream_up(self)

    @_guarded
    def on_connection_close(self, conn: Connection) -> None:
        if conn is self.connection:
            self._lost(conn.remote_condition, cause="broker-closed")
        else:
            conn.close()  # a connection since given up on: answer its close

    @_guarded
    def on_session_open(self, session: Session) -> None:
        state = session.context
        endpoint = state.end_when_begun if state is not None else None
        if endpoint is not None:
            state.end_when_begun = None
            endpoint._end()

    @_guarded
    def on_session_close(self, ssn: Session) -> None:
        if ssn.connection is not self.connection:
            ssn.close()
            return
        state = session_state(ssn)
        pair = state.pair
        if pair is not None:
            state.pair = None
            if ssn.local_state != LOCAL_CLOSED:
                ssn.close()
                pair.session_ended(ssn.remote_condition)
            else:
                self._ended_answered(ssn)
            return
        endpoint = state.endpoint
        self.sessions.drop_idle(ssn)  # the broker ended an idle session: the engine frees it with this close
        if ssn.local_state != LOCAL_CLOSED:
            ssn.close()
        else:
            self._ended_answered(ssn)
        if endpoint is not None and not endpoint.closed:
            c = ssn.remote_condition
            if c is not None:
                address = endpoint.spec.address if isinstance(endpoint, RemoteConsumer) else endpoint.address
                log.warning("upstream %s %s link %s (%s) by ending its session: %s: %s", self.name,
                            "detached" if endpoint.ready else "refused",
                            endpoint.link.name if endpoint.link is not None else "?", address, c.name, c.description)
            endpoint._closed_by_upstream(ErrorInfo(
                c.name if c is not None else "amqp:link:detach-forced",
                c.description if c is not None else f"upstream {self.name} ended the session",
            ))
        state.endpoint = None

    @_guarded
    def on_disconnected(self, conn: Connection, error: Any) -> None:
        if conn is self.connection or self.connection is None:
            if error is not None:
                log.info("upstream %s: transport closed: %s: %s", self.name, error.name, error.description)
            idle = error is not None and "idle-timeout" in (getattr(error, "description", None) or "")
            self._lost(error, aborted=True, cause="heartbeat" if idle else "socket")

    @_guarded
    def on_link_open(self, link: Link) -> None:
        state = link.context
        if state is None:
            return  # not a link of the proxy's
        if state.pair is not None:
            state.pair.upstream_open(link)
            return
        ep = state.endpoint
        if ep is None or ep.closed:
            return
        if isinstance(ep, RemoteConsumer):
            src = link.remote_source
            if src.null:
                return  # refused: a detach with the reason follows
            echoed = src.filter
            source_caps = src.capabilities
            evaluated: tuple = ()
            if ep.spec.offered:
                # The attach's offered-capabilities, and the source's ones the proxy did not ask for
                # (RabbitMQ echoes a client's source capabilities).
                asked = set(ep.spec.capabilities)
                caps = self._traced.pop(link.name, frozenset()) | {c for c in source_caps if c not in asked}
                evaluated = evaluated_offers(ep.spec.offered, caps, echoed)
                if ep.offer_pending:
                    self._offer_answered(ep)
            info = ConsumerInfo(
                address=src.address,
                subscription=True if src.distribution_mode == "copy" else None,
                filters_applied=tuple(echoed) if isinstance(echoed, dict) else (),
                capabilities=source_caps,
                evaluated=evaluated,
                echoed={e.key: echoed[_key(e.key)] for e in ep.spec.passthrough
                        if isinstance(echoed, dict) and _key(e.key) in echoed and self._applies(e)} or None,
            )
            ep.ready = True
            ep.handler.on_consumer_ready(ep, info)
        else:
            if link.remote_target.null:
                return
            ep.ready = True
            ep.handler.on_publisher_ready(ep)
            if link.credit > 0:
                ep.handler.on_publisher_credit(ep)

    @_guarded
    def on_link_close(self, link: Link) -> None:
        state = link_state(link)
        pair = state.pair
        if pair is not None:
            state.pair = None
            pair.upstream_closed(link)
            return
        ep = state.endpoint
        if link.local_state != LOCAL_CLOSED:
            link.close()  # detached on both ends: the engine frees it
        if ep is not None and not ep.closed:
            c = link.remote_condition
            err = ErrorInfo(
                c.name if c is not None else "amqp:link:detach-forced",
                c.description if c is not None else f"upstream {self.name} detached the link",
                transient=False,
            )
            address = ep.spec.address if isinstance(ep, RemoteConsumer) else ep.address
            log.warning("upstream %s %s link %s (%s): %s: %s", self.name,
                        "detached" if ep.ready else "refused", link.name, address, err.condition, err.description)
            ep._closed_by_upstream(err)
        parked = state.recycle
        if parked is not None:
            state.recycle = None
            self._park(parked)
        state.endpoint = None

    @_guarded
    def on_flow(self, link: Link) -> None:
        state = link.context
        if state is None:
            return
        if state.pair is not None:
            state.pair.upstream_flow(link)
        elif link.is_sender:
            self._publisher_credit(state.endpoint, link.ptr)
        else:
            self._consumer_credit(state.endpoint, link.ptr)

    def _publisher_credit(self, ep: Any, link: Any) -> None:
        if ep is not None and ep.ready and not ep.closed and lib.pn_link_credit(link) > 0:
            ep.handler.on_publisher_credit(ep)

    def _consumer_credit(self, ep: Any, link: Any) -> None:
        """A flow on a consumer's link: the credit the broker left it.  RabbitMQ 3.x accounts for
        credit its own way (it may send more than granted, rabbitmq-server#2597, and use credit up
        without sending), so the feed takes the link's word over its own count."""
        if ep is None or not ep.ready or ep.closed:
            return
        credit = getattr(ep.handler, "on_consumer_credit", None)
        if credit is not None:
            # (deliveries that arrived and were not handled yet still count as credit to the feed)
            credit(ep, lib.pn_link_credit(link) + lib.pn_link_queued(link))

    def _received(self, ep: Any, link: Any, dlv: Any) -> None:
        """A transfer (pointers) on a consumer's link."""
        data = receive(link, dlv)
        if data is None:
            return
        if ep is None or ep.closed:
            settle_with(dlv, RELEASED)
            return
        if lib.pn_delivery_aborted(dlv):
            lib.pn_delivery_settle(dlv)
            return
        ud = UpstreamDelivery(data, dlv)
        if ep.order is not None:
            ep.order.arrived(ud)
        ep.handler.on_delivery(ep, ud)

    def _published(self, ep: Any, dlv: Any) -> None:
        """The broker's disposition of a delivery (a pointer) a publisher sent."""
        if ep is None:
            lib.pn_delivery_settle(dlv)
            return
        outcome = remote_outcome(dlv)
        if outcome is None and not lib.pn_delivery_settled(dlv):
            return
        cb = ep.pending.pop(dlv, None)
        lib.pn_delivery_settle(dlv)
        if cb is not None and not ep.closed:
            cb(outcome if outcome is not None else Outcome("accepted"))

    def _typed_failed(self, ep: Any) -> None:
        if not ep.closed:
            ep._closed_by_upstream(ErrorInfo("amqp:internal-error", "proxy failure on the upstream link"))


_EXPIRY_POLICIES = frozenset({"link-detach", "session-end", "connection-close", "never"})


def _names_a_queue(spec: ConsumerSpec) -> bool:
    """The consumer's source is a queue by its address form or capabilities (not a subscription)."""
    if spec.distribution_mode == "copy" or "topic" in spec.capabilities:
        return False
    return "queue" in spec.capabilities or address_form_routing(spec.address) == "anycast"


def _routing_capabilities(capabilities: Any) -> tuple[str, ...]:
    """The routing capabilities (`topic`, `queue`) a client or an address rule asked for, passed on."""
    return tuple(c for c in capabilities or () if c in ("topic", "queue"))


class _Reason:
    """A condition of the daemon's own for `_lost` (a reconnect it decided)."""

    def __init__(self, description: str):
        self.description = description


def _client_of(publisher: "RemotePublisher") -> str:
    """Who publishes through `publisher`: its client's address, connection id and container id, read
    from its handler (a client link's inlet, or an anonymous relay's target), else the daemon itself."""
    handler = publisher.handler
    conn = getattr(handler, "conn", None) or getattr(getattr(handler, "relay", None), "conn", None)
    address = getattr(handler, "address", None) or publisher.address
    if conn is None:
        return f"address {address} (the daemon's own publisher)"
    engine = getattr(conn, "connection", None)
    container = getattr(engine, "remote_container", None) if engine is not None else None
    return f"address {address} from client connection {getattr(conn, 'id', '?')} (container id {container!r})"


def _endpoint(link: Link) -> Any:
    state = link.context
    return state.endpoint if state is not None else None


def _key(k: Any) -> Any:
    return t.symbol(k) if type(k) is str else k
