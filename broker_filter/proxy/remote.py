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

The upstream is built in four files, by concern: this one (`RemoteUpstream`: the connection, its
reconnects and losses, the `Upstream` operations, the session events), `remote_links.py` (the proxy's
own consumers and publishers, and what is kept on each engine session and link),
`remote_sessions.py` (`SessionPlacement`: which session a link gets, their timers, the bounds on
unanswered begins, attaches and ends) and `remote_traffic.py` (`LinkTraffic`: attach replies,
detaches, flow, deliveries and dispositions on those links, and the answers read from the frame trace).
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from ..amqp import types as t
from ..security import redact_url
from ..engine.endpoints import Transfers
from ..engine.endpoints import LOCAL_CLOSED, Connection, Handler, Link, Session, Terminus
from .remote_links import (RemoteConsumer, RemotePublisher, _client_of, _guarded, _key, _RemoteLink,
                           link_state, session_state)
from .remote_sessions import SessionPlacement
from .remote_traffic import LinkTraffic
from .sessions import Sessions
from .sharing import address_form_routing
from .traits import Traits, traits_of
from .upstream import (
    ConsumerHandler,
    ConsumerSpec,
    ErrorInfo,
    Loop,
    PublisherHandler,
    UpstreamBase,
    UpstreamListener,
    FILTEX_KINDS,
)

log = logging.getLogger("broker_filter.proxy.upstream")

SELECTOR_CAPS = frozenset({"APACHE.ORG:SELECTOR", "APACHE.ORG:JMS_FILTERS"})
BINDING_CAPS = frozenset({"APACHE.ORG:LEGACY_AMQP_EXCHANGE_FILTERS"})
STOP_ENDS = 1.0  # seconds a stop waits for ended sessions to be answered before closing the connection
ANSWER_TIMEOUT = 5.0  # default `upstream.answer_timeout`: longest wait for a begin, attach or end to be answered
# Why an upstream connection went down (`RemoteUpstream.lost_cause`; the reconnects counter's `cause`):
# the broker closed it (a close frame), the socket closed or failed under it, the broker fell silent for
# longer than the heartbeat allows, or the daemon gave up on an unanswered begin, attach or end.
LOSS_CAUSES = ("broker-closed", "socket", "heartbeat", "unanswered")
CULPRITS_LOGGED = 5  # publishers named in the log line of a dropped connection


class RemoteUpstream(SessionPlacement, LinkTraffic, Handler, UpstreamBase):
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
        tls: Any = None,
        server_hostname: str | None = None,
    ):
        super().__init__()
        # amqps: this upstream's own `ssl.SSLContext` (the replicas'), else the container's; the name
        # the certificate must carry, else the URL's host
        self.tls, self.server_hostname = tls, server_hostname
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
        kind = entry.kind
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
        value = entry.value  # (a `Passthrough`: the client's value, described or not)
        return (self.product == "RabbitMQ" and isinstance(value, t.Described) and isinstance(value.descriptor, str)
                and value.descriptor.startswith("rabbitmq:"))

    def can_offer(self, entry: Any) -> bool:
        """Filter expressions go on every consumer attach: the reply decides (module docstring)."""
        return entry.kind in FILTEX_KINDS

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















    def _attach(self, endpoint: _RemoteLink, name: str, link: Link) -> None:
        link_state(link).endpoint = endpoint
        endpoint.link = link
        self._endpoints[name] = endpoint
        # its deliveries straight from the engine's event loop, as raw pointers (`on_flow` takes its flow)
        failed = functools.partial(self._typed_failed, endpoint)
        if isinstance(endpoint, RemoteConsumer):
            link.handler = Transfers(functools.partial(self._received, endpoint, link.ptr), failed)
        else:
            link.handler = Transfers(functools.partial(self._published, endpoint), failed)
        if endpoint.session not in self.sessions.waiting:
            link.open()
            self._await_answer(endpoint)

    def _forget(self, endpoint: Any) -> None:
        if endpoint.link is not None:
            self._endpoints.pop(endpoint.link.name, None)
            self._traced.pop(endpoint.link.name, None)
        if endpoint.offer_pending:
            self._offer_answered(endpoint)





    # ------------------------------------------------------------------ connection
    def _connect(self) -> None:
        self._reconnect_timer = None
        if self.stopped:
            return
        address, user, password, secure, vhost = self._targets[self.connects % len(self._targets)]
        self.connects += 1
        kwargs: dict[str, Any] = {
            "url": address,
            "handler": self,
            "reconnect": False,
            "properties": {"product": "broker-filter", **self.properties},
        }
        if vhost != "/":
            kwargs["virtual_host"] = f"vhost:{vhost}"
        if secure and self.tls is not None:
            kwargs["tls"] = self.tls
        if secure and self.server_hostname:
            kwargs["server_hostname"] = self.server_hostname
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
        why = ((condition.description or condition.name) if condition is not None else None) or "no reason given"
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
        if condition is not None and condition.description:
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
            if self.stopped:  # (the daemon closed it: shutting down)
                log.info("upstream %s connection closed", self.name)
            else:
                log.warning("%s", desc)
            self.listener.on_upstream_down(self, err)
        else:
            # An attempt that never opened: a listener that would rather give up than wait for the
            # next (a pass-through client whose vhost or login the broker refuses) is told.
            if conn is not None:
                self.listener.on_upstream_failed(self, err)
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
            idle = error is not None and "idle-timeout" in (error.description or "")
            self._lost(error, aborted=True, cause="heartbeat" if idle else "socket")










_EXPIRY_POLICIES = frozenset({"link-detach", "session-end", "connection-close", "never"})


def _names_a_queue(spec: ConsumerSpec) -> bool:
    """The consumer's source is a queue by its address form or capabilities (not a subscription)."""
    if spec.distribution_mode == "copy" or "topic" in spec.capabilities:
        return False
    return "queue" in spec.capabilities or address_form_routing(spec.address) == "anycast"


def _routing_capabilities(capabilities: Any) -> tuple[str, ...]:
    """The routing capabilities (`topic`, `queue`) a client or an address rule asked for, passed on."""
    return tuple(c for c in capabilities or () if c in ("topic", "queue"))
