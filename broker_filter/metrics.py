"""Prometheus metrics and the HTTP exporter (`/metrics`, `/healthz`, `/readyz`).

Theory of operation.  One `Metrics(registry)` object owns every instrument; the daemon creates one
and hands it down, tests give it a private `CollectorRegistry`.  Two kinds of facts feed it, and the
HTTP thread never touches the daemon's live (proton) objects:

- events, counted the moment they happen on the daemon's thread: a message received, forwarded,
  filtered out, an outcome, a refused attach, a reconnect (`Counter`s, thread-safe);
- state, published by the daemon as an immutable `Snapshot` (connections, links by kind, messages
  held and credit outstanding per address, upstream status) whenever it likes — e.g. once a second
  from a timer.  The exporter renders the latest snapshot it was given.

Label values are bounded: `address` takes the first `address_labels` distinct addresses (configured
ones can be reserved first) and counts every later one as `other`; outcome, reason and kind take
values from fixed sets (anything else is `other`).  Selector text never becomes a label.

`Health` answers the probes: `/healthz` is 200 while the daemon's loop keeps calling `beat()` (or
always, when it never does), `/readyz` is 200 while the readiness check says the upstream is
reachable.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import ipaddress
import json
import logging
import selectors
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("broker_filter.metrics")

OTHER = "other"
OUTCOMES = frozenset({"accepted", "rejected", "released", "modified"})
LINK_KINDS = frozenset({"consumer", "producer", "upstream-consumer", "upstream-producer"})

AUTHORIZATION_OPERATIONS = frozenset({"consume", "browse", "send", "manage", "durable"})
REFUSAL_REASONS = frozenset(
    {
        "invalid-filter",  # selector or filter-set that does not compile (amqp:invalid-field)
        "limit",  # over a configured limit (links per connection, selector length, depth)
        "kept-subscriptions",  # a new durable subscription beyond limits.kept_subscriptions
        "unauthorized",  # SASL or upstream permission refused
        "not-found",  # upstream address missing
        "upstream-unavailable",  # no upstream connection
        "shutdown",  # the daemon is stopping
        "internal-error",
    }
)
# Why the upstream connection went down before a reconnect (proxy/remote.py's LOSS_CAUSES).
RECONNECT_CAUSES = frozenset({"broker-closed", "socket", "heartbeat", "unanswered"})
CONNECTION_REFUSALS = frozenset({"limit", "unauthorized", "tls", "shutdown", "handshake-timeout",
                                 "out-of-descriptors", "vhost", "login-busy"})
LOGIN_FAILURES = frozenset(
    {
        "wrong-credentials",  # PLAIN: wrong user name or password (or the upstream refused them: pass-through)
        "unknown-certificate",  # EXTERNAL: a certificate that maps to no configured user
        "mechanism",  # a SASL mechanism not offered
        "malformed",  # a SASL exchange that breaks the protocol
        "throttled",  # refused at once: too many logins of the source address wait (listener.login.per_address)
        "queue-full",  # refused at once: the check queue is full (listener.login.queue)
        "abandoned",  # the client hung up while its login was checked
        "no-upstream-account",  # pass-through: a client without a password (ANONYMOUS, EXTERNAL) refused
    }
)


def bounded(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


class AddressLabels:
    """Maps addresses to at most `limit` distinct label values; later addresses become `other`."""

    def __init__(self, limit: int, max_length: int = 200):
        self._limit = limit
        self._max_length = max_length
        self._labels: dict[str, str] = {}
        self._lock = threading.Lock()

    def reserve(self, addresses: Iterable[str]) -> None:
        """Give known addresses (configured ones) their own label before clients pick theirs."""
        for address in addresses:
            self(address)

    def __call__(self, address: str | None) -> str:
        address = address or ""
        label = self._labels.get(address)
        if label is not None:
            return label
        with self._lock:
            label = self._labels.get(address)
            if label is None:
                fits = len(self._labels) < self._limit and len(address) <= self._max_length
                label = address if fits and address != OTHER else OTHER
                if label != OTHER or len(self._labels) < self._limit * 4:
                    # Remember overflow addresses too (bounded) so repeat lookups stay cheap.
                    self._labels[address] = label
            return label

    @property
    def distinct(self) -> int:
        return len({label for label in self._labels.values() if label != OTHER})


@dataclass(frozen=True)
class Snapshot:
    """The daemon's state at one moment, as plain values (the exporter renders the latest one)."""

    connections: int = 0
    links: Mapping[str, int] = field(default_factory=dict)  # kind -> attached links
    held: Mapping[str, int] = field(default_factory=dict)  # address -> messages held unsettled, unmatched
    credit: Mapping[str, int] = field(default_factory=dict)  # address -> credit granted by clients, unused
    stalled: Mapping[str, bool] = field(default_factory=dict)  # address -> pulling stopped (window full)
    moving: Mapping[str, int] = field(default_factory=dict)  # address -> moves to the queue's tail in flight
    passes: Mapping[str, int] = field(default_factory=dict)  # address -> searches completed by its feeds
    handed_back: Mapping[str, int] = field(default_factory=dict)  # address -> messages its feeds handed back
    waited: Mapping[str, float] = field(default_factory=dict)  # address -> longest wait of a link with credit
    # (address, filter kind) -> (evaluations, matches, evaluation seconds) since the daemon started
    filters: Mapping[tuple, tuple] = field(default_factory=dict)
    costliest: tuple = ()  # (address, kind, filter text) of the costliest filters, costliest first
    upstream_connected: bool = False
    spliced: int = 0  # client connections spliced to another replica (`replicas.splice`), open
    taken_at: float = field(default_factory=time.time)


class AddressCounters:
    """The per-address counters of one address, bound once (a link keeps one for its life)."""

    __slots__ = ("label", "received", "forwarded", "filtered_out", "published", "_outcomes")

    def __init__(self, metrics: Metrics, label: str):
        self.label = label
        self.received = metrics.messages_received.labels(label)
        self.forwarded = metrics.messages_forwarded.labels(label)
        self.filtered_out = metrics.messages_filtered_out.labels(label)
        self.published = metrics.messages_published.labels(label)
        self._outcomes = {o: metrics.outcomes.labels(label, o) for o in (*sorted(OUTCOMES), OTHER)}

    def outcome(self, outcome: str, n: int = 1) -> None:
        self._outcomes[bounded(outcome, OUTCOMES)].inc(n)


class SharedCounters:
    """The instruments of the shared upstream subscriptions on one address (`proxy/fanout.py`):
    bound once per shared subscription."""

    __slots__ = ("subscribers", "messages", "candidates", "evaluations", "cache_lookups", "cache_hits")

    def __init__(self, metrics: Metrics, label: str):
        self.subscribers = metrics.shared_subscribers.labels(label)
        self.messages = metrics.shared_messages.labels(label)
        self.candidates = metrics.shared_candidates.labels(label)
        self.evaluations = metrics.shared_evaluations.labels(label)
        self.cache_lookups = metrics.shared_cache_lookups.labels(label)
        self.cache_hits = metrics.shared_cache_hits.labels(label)


class Metrics:
    """Every instrument of the daemon, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None, *, address_labels: int = 100):
        from . import __version__

        self.registry = registry if registry is not None else CollectorRegistry()
        self.addresses = AddressLabels(address_labels)
        r = self.registry
        if registry is None:
            # process_open_fds / process_max_fds (descriptor headroom), CPU and memory
            ProcessCollector(registry=r)
        self.info = Info("broker_filter", "broker-filter build information", registry=r)
        self.info.info({"version": __version__})
        self.connections_accepted = Counter(
            "broker_filter_connections_accepted", "Client connections accepted", registry=r
        )
        self.connections_refused = Counter(
            "broker_filter_connections_refused", "Client connections refused, by reason", ["reason"], registry=r
        )
        self.authentication_failures = Counter(
            "broker_filter_authentication_failures", "Failed SASL authentications, by mechanism", ["mechanism"],
            registry=r,
        )
        self.login_failures = Counter(
            "broker_filter_login_failures",
            "Client logins that failed, were refused for now (throttled, queue-full) or abandoned mid-check, "
            "by reason",
            ["reason"],
            registry=r,
        )
        self.messages_received = Counter(
            "broker_filter_messages_received", "Messages received from upstream, by address", ["address"], registry=r
        )
        self.messages_forwarded = Counter(
            "broker_filter_messages_forwarded", "Messages delivered to a client link, by address", ["address"],
            registry=r,
        )
        self.messages_filtered_out = Counter(
            "broker_filter_messages_filtered_out",
            "Messages a link's filter did not select, by address",
            ["address"],
            registry=r,
        )
        self.messages_published = Counter(
            "broker_filter_messages_published", "Messages clients published upstream, by address", ["address"],
            registry=r,
        )
        self.outcomes = Counter(
            "broker_filter_outcomes",
            "Client outcomes applied to upstream deliveries, by address and outcome",
            ["address", "outcome"],
            registry=r,
        )
        self.filter_pushdown = Counter(
            "broker_filter_filter_pushdown",
            "Filter expressions offered to the upstream on an attach, by kind and by who evaluates them "
            "as the attach reply decided (upstream or local)",
            ["kind", "result"],
            registry=r,
        )
        self.attach_refused = Counter(
            "broker_filter_attach_refused", "Link attaches refused, by reason", ["reason"], registry=r
        )
        self.authorization_refusals = Counter(
            "broker_filter_authorization_refusals", "Operations refused by the security settings, by operation "
            "(consume, browse, send, manage, durable)", ["operation"], registry=r
        )
        self.splices = Counter(
            "broker_filter_splices", "Client connections spliced to the replica owning their first link's queue "
            "(replicas.splice)", registry=r
        )
        self.upstream_reconnects = Counter(
            "broker_filter_upstream_reconnects", "Upstream connections re-established after a loss, by the "
            "loss's cause (broker-closed, socket, heartbeat, unanswered)", ["cause"], registry=r
        )
        self.links_resumed = Counter(
            "broker_filter_links_resumed", "Client links served again, still attached, after their upstream "
            "connection was lost and re-established (queues, subscriptions on a queue the daemon declared, senders)", registry=r
        )
        self.links_detached_by_reconnect = Counter(
            "broker_filter_links_detached_by_reconnect", "Client links detached because their upstream connection "
            "was lost and they cannot be resumed (subscriptions whose queue RabbitMQ made or that expired meanwhile, "
            "dynamic nodes, browsers)", registry=r
        )
        self.shared_subscribers = Gauge(
            "broker_filter_shared_subscribers",
            "Client links served by the address's shared upstream subscription (a link that fell behind "
            "and continues on a subscription of its own is not counted)", ["address"], registry=r,
        )
        for attr, name, doc in (
            ("shared_messages", "broker_filter_shared_messages",
             "Upstream messages of shared subscriptions matched once against their subscription index, by "
             "address (this and the four below are added once a second)"),
            ("shared_candidates", "broker_filter_shared_candidates",
             "Links the subscription index offered as candidates (divide by shared_messages: candidates per "
             "message), by address"),
            ("shared_evaluations", "broker_filter_shared_evaluations",
             "Link filters evaluated on shared subscriptions' messages (divide by shared_messages: links "
             "evaluated per message), by address"),
            ("shared_cache_lookups", "broker_filter_shared_index_lookups",
             "Candidate lookups in the subscription index's result cache, by address"),
            ("shared_cache_hits", "broker_filter_shared_index_hits",
             "Lookups answered by the subscription index's result cache (divide by shared_index_lookups: the "
             "index hit rate), by address"),
        ):
            setattr(self, attr, Counter(name, doc, ["address"], registry=r))
        self._by_address: dict[str, AddressCounters] = {}
        self._lock = threading.Lock()
        self._snapshot = Snapshot()
        r.register(_SnapshotCollector(self))
        self.links: Callable[[], dict | None] | None = None  # `GET /links` (set by the daemon)
        self.filter_text_in_labels = False  # `metrics.filter_text_in_labels` (set by `serve_http`)

    # -- events (called on the daemon's thread) ----------------------------------------------------

    def address(self, address: str | None) -> AddressCounters:
        """The counters for `address` (bounded label); cache the result per link."""
        label = self.addresses(address)
        counters = self._by_address.get(label)
        if counters is None:
            with self._lock:
                counters = self._by_address.get(label)
                if counters is None:
                    counters = self._by_address[label] = AddressCounters(self, label)
        return counters

    def shared(self, address: str | None) -> SharedCounters:
        """The instruments of a shared subscription on `address` (bounded label)."""
        return SharedCounters(self, self.addresses(address))

    def refuse_attach(self, reason: str) -> None:
        self.attach_refused.labels(bounded(reason, REFUSAL_REASONS)).inc()

    def upstream_reconnected(self, cause: str | None) -> None:
        self.upstream_reconnects.labels(bounded(cause or "", RECONNECT_CAUSES)).inc()

    def authorization_refused(self, operation: str) -> None:
        self.authorization_refusals.labels(bounded(operation, AUTHORIZATION_OPERATIONS)).inc()

    def refuse_connection(self, reason: str) -> None:
        self.connections_refused.labels(bounded(reason, CONNECTION_REFUSALS)).inc()

    def login_failed(self, reason: str) -> None:
        self.login_failures.labels(bounded(reason, LOGIN_FAILURES)).inc()

    def authentication_failed(self, mechanism: str) -> None:
        known = frozenset({"ANONYMOUS", "PLAIN", "EXTERNAL"})
        self.authentication_failures.labels(bounded(mechanism.upper(), known)).inc()

    # -- state ---------------------------------------------------------------------------------------

    def publish(self, snapshot: Snapshot) -> None:
        """Replace the state the exporter shows (one reference assignment: atomic for readers)."""
        self._snapshot = snapshot

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot


class _SnapshotCollector:
    """Renders the latest published `Snapshot` as gauges, labels bounded like the counters'."""

    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    def describe(self) -> list:
        return []  # collected on demand; no fixed description needed at registration

    def collect(self) -> Iterable[Any]:
        snap = self._metrics.snapshot
        labels = self._metrics.addresses
        yield GaugeMetricFamily("broker_filter_connections", "Client connections open", value=snap.connections)
        yield GaugeMetricFamily("broker_filter_spliced_connections",
                                "Client connections spliced to another replica and open (not among "
                                "broker_filter_connections: the owner ends them)", value=snap.spliced)
        links = GaugeMetricFamily("broker_filter_links", "Attached links, by kind", labels=["kind"])
        for kind, n in _merge(snap.links, lambda k: bounded(k, LINK_KINDS)).items():
            links.add_metric([kind], n)
        yield links
        for name, doc, values in (
            ("broker_filter_messages_held", "Messages held unsettled from upstream with no match yet, by address",
             snap.held),
            ("broker_filter_credit_outstanding", "Credit granted by clients and not yet used, by address",
             snap.credit),
            ("broker_filter_address_stalled", "1 while pulling from an address is stopped because its window is full",
             {a: int(bool(v)) for a, v in snap.stalled.items()}),
            ("broker_filter_moves_in_flight", "Messages being moved to the queue's tail (copy published, original "
             "not yet accepted), by address", snap.moving),
            ("broker_filter_search_passes", "Searches of the queue completed by the address's current feeds "
             "(a moved copy came round)", snap.passes),
            ("broker_filter_messages_handed_back", "Held messages the address's current feeds moved to the queue's "
             "tail for other consumers (a feed holding messages its links do not select)", snap.handed_back),
        ):
            family = GaugeMetricFamily(name, doc, labels=["address"])
            for label, n in _merge(values, labels).items():
                family.add_metric([label], n)
            yield family
        waited = GaugeMetricFamily("broker_filter_link_wait_seconds",
                                   "Longest time a link of the address has had credit and received nothing",
                                   labels=["address"])
        for label, n in _merge_max(snap.waited, labels).items():
            waited.add_metric([label], n)
        yield waited
        families = [CounterMetricFamily(name, doc, labels=["address", "kind"]) for name, doc in (
            ("broker_filter_filter_evaluations", "Evaluations of client links' filters here (not those pushed "
             "down), by address and filter kind (a shared subscription's index counts every message for every "
             "member)"),
            ("broker_filter_filter_matches", "Evaluations that selected the message, by address and filter kind"),
            ("broker_filter_filter_evaluation_seconds", "Time spent evaluating filters (one evaluation in 32 "
             "timed), by address and filter kind"),
        )]
        merged: dict[tuple[str, str], list[float]] = {}
        for (address, kind), values in snap.filters.items():
            t = merged.setdefault((labels(address), kind), [0, 0, 0.0])  # (kinds: a fixed set, proxy/introspect.py)
            for i, v in enumerate(values):
                t[i] += v
        for key, values in sorted(merged.items()):
            for family, v in zip(families, values):
                family.add_metric(list(key), v)
        yield from families
        costliest = GaugeMetricFamily("broker_filter_costliest_filter_info",
                                      "1 for each of the links' filters that took the most evaluation time "
                                      "(metrics.costliest_filters of them), rank 1 the costliest; a hash of the "
                                      "filter's text (with metrics.filter_text_in_labels: the text cut to 60 "
                                      "characters, then the hash)",
                                      labels=["rank", "address", "kind", "filter"])
        shown = self._metrics.filter_text_in_labels
        for rank, (address, kind, text) in enumerate(snap.costliest, 1):
            if not shown:  # the hash alone (`short_text`'s last word): a selector's literals stay in the daemon
                text = "#" + text.rpartition("#")[2]
            costliest.add_metric([str(rank), labels(address), kind, text], 1)
        yield costliest
        yield GaugeMetricFamily(
            "broker_filter_upstream_connected", "1 while the upstream connection is open", value=int(snap.upstream_connected)
        )
        yield GaugeMetricFamily(
            "broker_filter_state_timestamp_seconds", "When the daemon published the state above", value=snap.taken_at
        )


def _merge(values: Mapping[str, float], label: Callable[[str], str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, n in values.items():
        lab = label(key)
        out[lab] = out.get(lab, 0) + n
    return out


def _merge_max(values: Mapping[str, float], label: Callable[[str], str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, n in values.items():
        lab = label(key)
        out[lab] = max(out.get(lab, 0.0), n)
    return out


# --------------------------------------------------------------------------------------------------
# Health


class Health:
    """Liveness and readiness, both safe to ask from the HTTP thread.

    alive: the daemon's loop calls `beat()` regularly; alive while the last beat is younger than
    `stale_after` seconds (before the first beat: alive).  ready: `ready_check()` if given (it must be
    thread-safe and cheap: read a flag), else the latest snapshot's `upstream_connected`; plus
    `set_ready(False, reason)` overrides, e.g. while shutting down.
    """

    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        ready_check: Callable[[], bool] | None = None,
        stale_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._metrics = metrics
        self._ready_check = ready_check
        self._stale_after = stale_after
        self._clock = clock
        self._last_beat: float | None = None
        self._not_ready_reason: str | None = None

    def beat(self) -> None:
        self._last_beat = self._clock()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self._not_ready_reason = None if ready else (reason or "not ready")

    def alive(self) -> tuple[bool, str]:
        if self._last_beat is None:
            return True, "ok"
        age = self._clock() - self._last_beat
        if age > self._stale_after:
            return False, f"event loop stalled for {age:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        alive, why = self.alive()
        if not alive:
            return False, why
        if self._not_ready_reason is not None:
            return False, self._not_ready_reason
        try:
            if self._ready_check is not None:
                ok = bool(self._ready_check())
            elif self._metrics is not None:
                ok = self._metrics.snapshot.upstream_connected
            else:
                ok = True
        except Exception as e:  # noqa: BLE001 - a failing probe means "not ready", never a crash
            log.warning("readiness check failed: %s", type(e).__name__)
            return False, "readiness check failed"
        return (True, "ok") if ok else (False, "upstream not reachable")


# --------------------------------------------------------------------------------------------------
# GET /links


class LinksAccess:
    """Who may read `/links`, and what they see.

    A token configured (`metrics.token`): a request must carry it (`Authorization: Bearer TOKEN`,
    else 401) and sees everything.  No token: on a loopback listener anyone who can reach it is
    answered with each filter's kind and a hash of its text in place of the text (literals in a
    selector, such as account numbers, stay in the daemon); on any other listener `/links` is
    refused (403) -- the listener may be reachable from far away.

    The report is made on the daemon's loop (`source`, which waits for it) at most once per
    `interval` seconds, however many clients ask: the others get the report made last (its JSON
    rendered once per form), and wait for the one being made rather than asking the loop again.  Its
    records are cut to `limit` (`truncated` says so)."""

    def __init__(self, source: Callable[[], dict | None], *, token: str = "", loopback: bool = True,
                 interval: float = 1.0, limit: int = 1000, clock: Callable[[], float] = time.monotonic):
        self._source = source
        self._token = token.encode()
        self._loopback = loopback
        self._interval = interval
        self._limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._made_at: float | None = None
        self._report: dict | None = None
        self._bodies: dict[bool, bytes] = {}
        self.made = 0  # reports the loop was asked for

    def authorize(self, header: str | None) -> tuple[str, list, bytes] | bool:
        """True: the request may see filter texts; False: it may see the rest; else the refusal
        (status, headers, body)."""
        if self._token:
            scheme, _, given = (header or "").strip().partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token):
                return True
            return ("401 Unauthorized", [*_TEXT, ("WWW-Authenticate", 'Bearer realm="broker-filter"')],
                    b"/links needs the bearer token of metrics.token (Authorization: Bearer TOKEN)\n")
        if not self._loopback:
            return ("403 Forbidden", _TEXT,
                    b"/links is refused on a metrics listener that is not loopback unless metrics.token is set "
                    b"(requests must then carry it)\n")
        return False

    def body(self, texts: bool) -> bytes | None:
        """The JSON of the current report (with filter texts, or with their hashes); None when the
        daemon's loop did not answer in time."""
        with self._lock:
            now = self._clock()
            if self._made_at is None or now - self._made_at >= self._interval:
                self.made += 1
                report = self._source()
                self._report = _bounded(report, self._limit) if report is not None else None
                self._made_at = self._clock()
                self._bodies = {}
            if self._report is None:
                return None
            body = self._bodies.get(texts)
            if body is None:
                shown = self._report if texts else _without_texts(self._report)
                body = self._bodies[texts] = json.dumps(shown, default=str).encode()
            return body


def _bounded(report: dict, limit: int) -> dict:
    links = report.get("links") or []
    if len(links) <= limit:
        return report
    return {**report, "links": links[:limit], "truncated": True}


def filter_hash(text: str) -> str:
    """What `/links` shows of a filter's text without the token: a hash that tells filters apart."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _without_texts(report: dict) -> dict:
    links = []
    for record in report.get("links") or []:
        filters = record.get("filters")
        if filters:
            record = {**record, "filters": [
                {k: v for k, v in f.items() if k != "text"} | {"hash": filter_hash(str(f.get("text", "")))}
                for f in filters]}
        links.append(record)
    return {**report, "links": links, "filter_texts": "hidden (they need metrics.token)"}


# --------------------------------------------------------------------------------------------------
# HTTP exporter


_TEXT = [("Content-Type", "text/plain; charset=utf-8")]
PROBES = {"/healthz": "alive", "/livez": "alive", "/readyz": "ready"}


def make_app(registry: CollectorRegistry, health: Health, links: LinksAccess | Callable[[], dict | None] | None = None
             ) -> Callable:
    """The exporter as a WSGI application: `/metrics` is prometheus_client's own `make_wsgi_app`
    (content negotiation, gzip, `name[]` filters), `/healthz` (`/livez`) and `/readyz` answer 200 or
    503 with the reason; `/links` (when `links` is given) the daemon's client links as JSON, as
    `LinksAccess` allows (503 when the daemon's loop does not answer in time); HEAD answers like GET
    without a body; nothing is cached by clients."""
    metrics_app = make_wsgi_app(registry)
    if links is not None and not isinstance(links, LinksAccess):
        links = LinksAccess(links)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path, head = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"] == "HEAD"

        def respond(status: str, headers: list, exc_info: Any = None) -> Any:
            return start_response(status, [*headers, ("Cache-Control", "no-store")], exc_info)

        try:
            if path == "/metrics":
                body = metrics_app({**environ, "REQUEST_METHOD": "GET"} if head else environ, respond)
            elif path == "/links" and links is not None:
                allowed = links.authorize(environ.get("HTTP_AUTHORIZATION"))
                if isinstance(allowed, tuple):
                    status, headers, text = allowed
                    respond(status, headers)
                    body = [text]
                else:
                    report = links.body(texts=allowed)
                    if report is None:
                        respond("503 Service Unavailable", _TEXT)
                        body = [b"the daemon did not answer in time\n"]
                    else:
                        respond("200 OK", [("Content-Type", "application/json")])
                        body = [report]
            elif path in PROBES:
                ok, reason = getattr(health, PROBES[path])()
                respond("200 OK" if ok else "503 Service Unavailable", _TEXT)
                body = [f"{reason}\n".encode()]
            else:
                respond("404 Not Found", _TEXT)
                body = [b"not found\n"]
        except Exception:  # noqa: BLE001 - the exporter must keep serving
            log.exception("metrics endpoint %s failed", path)
            respond("500 Internal Server Error", _TEXT, sys.exc_info())
            body = [b"internal error\n"]
        return [] if head else body

    return app


class _Handler(WSGIRequestHandler):
    """One request whose head the exporter has read already (`request`: the socket and the head);
    the answer is written with the request's deadline."""

    def setup(self) -> None:
        sock, head, deadline = self.request
        self.connection = sock
        self.rfile = io.BytesIO(head)
        self.wfile = _DeadlineWriter(sock, deadline)

    def finish(self) -> None:
        self.rfile.close()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("http %s - %s", self.address_string(), format % args)


class _DeadlineWriter(io.RawIOBase):
    """Writes to a socket, all of it before `deadline` (monotonic) or not at all: a client that does
    not take its answer is dropped then."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock = sock
        self._deadline = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the client did not take its answer in time")
        self._sock.settimeout(remaining)
        self._sock.sendall(data)
        return len(data)


# A request's head (request line and headers) is at most this long; more is refused (431).
MAX_HEAD = 16 * 1024
# Connections whose request is still coming in; past this, the oldest one is dropped.
MAX_PENDING = 256
# Complete requests waiting for a thread, per thread; past this, a request is answered 503 at once.
QUEUE_PER_THREAD = 4


class _Pending:
    __slots__ = ("sock", "peer", "head", "deadline")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float):
        self.sock = sock
        self.peer = peer
        self.head = bytearray()
        self.deadline = deadline


class Exporter:
    """The HTTP exporter.  One thread (`broker-filter-metrics`) accepts connections and reads their
    requests, all of them, without blocking; a complete request goes to one of `threads` threads
    (`broker-filter-http`), which answers it.  A request must arrive whole within `request_timeout`
    seconds, and its answer must be taken within as many more; else the connection is dropped.  So
    the threads are bounded whatever clients do (half-sent requests hold a socket, not a thread), and
    so is the wait for one: past `threads * QUEUE_PER_THREAD` requests queued, 503 at once.
    `close()` stops it (idempotent)."""

    def __init__(self, app: Callable, host: str, port: int, *, threads: int = 8, request_timeout: float = 5.0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self._app = app
        self._timeout = request_timeout
        self._threads = threads
        self._queue_limit = threads * (1 + QUEUE_PER_THREAD)
        self._busy = 0  # requests handed to the pool and not finished
        self._busy_lock = threading.Lock()
        address = self._sock.getsockname()
        self.base_environ = {"SERVER_NAME": host, "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_PORT": str(address[1]),
                             "REMOTE_HOST": "", "CONTENT_LENGTH": "", "SCRIPT_NAME": ""}
        self._address = address
        self._pending: dict[int, _Pending] = {}  # fd -> connection whose request is coming in
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="broker-filter-http")
        self._closed = False
        self.dropped = 0  # connections dropped: request too slow, too long, or too many at once
        self._thread = threading.Thread(target=self._run, name="broker-filter-metrics", daemon=True)
        self._thread.start()

    def get_app(self) -> Callable:  # (what WSGIRequestHandler asks its server for)
        return self._app

    @property
    def host(self) -> str:
        return self._address[0]

    @property
    def port(self) -> int:
        return self._address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- the accepting thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            now = time.monotonic()
            wait = min((p.deadline for p in self._pending.values()), default=now + 1.0) - now
            try:
                events = self._selector.select(max(0.0, min(wait, 1.0)))
            except OSError:
                if self._closed:
                    return
                raise
            for key, _ in events:
                if key.fileobj is self._sock:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    return
                else:
                    self._read(key.data)
            now = time.monotonic()
            for pending in [p for p in self._pending.values() if p.deadline <= now]:
                self._drop(pending)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of descriptors: try again on the next event
                log.warning("metrics listener: accept failed: %s", e.strerror or e)
                return
            sock.setblocking(False)
            if len(self._pending) >= MAX_PENDING:
                self._drop(min(self._pending.values(), key=lambda p: p.deadline))
            pending = _Pending(sock, peer, time.monotonic() + self._timeout)
            self._pending[sock.fileno()] = pending
            self._selector.register(sock, selectors.EVENT_READ, pending)

    def _read(self, pending: _Pending) -> None:
        try:
            data = pending.sock.recv(MAX_HEAD + 1 - len(pending.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(pending)
            return
        pending.head += data
        end = pending.head.find(b"\r\n\r\n")
        if end < 0:
            end = pending.head.find(b"\n\n")
        if end < 0:
            if len(pending.head) > MAX_HEAD:
                self._answer_now(pending, "431 Request Header Fields Too Large", b"request head too long\n")
            return
        self._forget(pending)
        with self._busy_lock:
            full = self._busy >= self._queue_limit
            if not full:
                self._busy += 1
        if full:
            self._answer_now(pending, "503 Service Unavailable", b"too many requests at once\n", forgotten=True)
            return
        try:
            self._pool.submit(self._serve, pending.sock, bytes(pending.head), pending.peer,
                              time.monotonic() + self._timeout)
        except RuntimeError:  # closing
            pending.sock.close()

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.sock.fileno(), None)
        try:
            self._selector.unregister(pending.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, pending: _Pending) -> None:
        self.dropped += 1
        self._forget(pending)
        pending.sock.close()

    def _answer_now(self, pending: _Pending, status: str, body: bytes, *, forgotten: bool = False) -> None:
        """A short refusal, sent without waiting (what does not fit the socket's buffer is lost)."""
        self.dropped += 1
        if not forgotten:
            self._forget(pending)
        try:
            pending.sock.send(f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                              f"Connection: close\r\n\r\n".encode() + body)
        except OSError:
            pass
        pending.sock.close()

    # -- the answering threads -----------------------------------------------------------------------

    def _serve(self, sock: socket.socket, head: bytes, peer: Any, deadline: float) -> None:
        try:
            _Handler((sock, head, deadline), peer, self)
        except (OSError, TimeoutError):
            pass  # the client went, or did not take its answer in time
        except Exception:  # noqa: BLE001 - one request's failure never stops the exporter
            log.exception("metrics listener: a request failed")
        finally:
            with self._busy_lock:
                self._busy -= 1
            try:
                sock.close()
            except OSError:
                pass

    # ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for pending in list(self._pending.values()):
            self._forget(pending)
            pending.sock.close()
        self._selector.close()
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def is_loopback(host: str) -> bool:
    """A listener on `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_http(metrics: Metrics, health: Health, host: str, port: int, settings: Any = None) -> Exporter:
    """Start the exporter on host:port (port 0: any free port, see `Exporter.port`).  `settings`: the
    `[metrics]` section (token, `/links` interval and limit, threads, request time-out); without it,
    the defaults and no token.  OSError if the address cannot be bound."""
    def get(name: str, default: Any) -> Any:
        return getattr(settings, name, default) if settings is not None else default

    metrics.filter_text_in_labels = get("filter_text_in_labels", False)
    links = None
    if metrics.links is not None:
        links = LinksAccess(metrics.links, token=get("token", ""), loopback=is_loopback(host),
                            interval=get("links_interval", 1.0), limit=get("links_limit", 1000))
    app = make_app(metrics.registry, health, links)
    exporter = Exporter(app, host, port, threads=get("http_threads", 8), request_timeout=get("request_timeout", 5.0))
    log.info("metrics and health endpoints on %s (/metrics, /healthz, /readyz, /links)", exporter.url)
    return exporter


__all__ = [
    "AddressCounters",
    "AddressLabels",
    "Exporter",
    "Health",
    "LinksAccess",
    "Metrics",
    "Snapshot",
    "serve_http",
]


def reference_table() -> str:
    """The Markdown table of every metric (README.md carries it): name, type, labels, meaning."""
    metrics = Metrics(CollectorRegistry(), address_labels=1)
    # Touch every labelled instrument once so the scrape below shows its label names.
    counters = metrics.address("a")
    for counter in (counters.received, counters.forwarded, counters.filtered_out, counters.published):
        counter.inc()
    counters.outcome("accepted")
    metrics.refuse_attach("limit")
    metrics.refuse_connection("limit")
    metrics.authentication_failed("PLAIN")
    metrics.filter_pushdown.labels(kind="sql", result="local").inc()
    shared = metrics.shared("a")
    for counter in (shared.messages, shared.candidates, shared.evaluations, shared.cache_lookups, shared.cache_hits):
        counter.inc()
    shared.subscribers.inc()
    metrics.publish(Snapshot(links={"consumer": 1}, held={"a": 1}, credit={"a": 1}, stalled={"a": True},
                             moving={"a": 1}, passes={"a": 1}, handed_back={"a": 1},
                             waited={"a": 1.0}, filters={("a", "selector"): (1, 1, 0.1)},
                             costliest=(("a", "selector", "x #0"),)))
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for family in metrics.registry.collect():
        name = {"counter": f"{family.name}_total", "info": f"{family.name}_info"}.get(family.type, family.name)
        labels = sorted({k for s in family.samples for k in s.labels if k not in ("le", "version")})
        if family.type == "info":
            labels = ["version"]
        shown = ", ".join(f"`{label}`" for label in labels) or "—"
        lines.append(f"| `{name}` | {family.type} | {shown} | {family.documentation} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(reference_table())
