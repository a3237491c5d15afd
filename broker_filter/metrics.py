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

import logging
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger("broker_filter.metrics")

OTHER = "other"
OUTCOMES = frozenset({"accepted", "rejected", "released", "modified"})
LINK_KINDS = frozenset({"consumer", "producer", "upstream-consumer", "upstream-producer"})

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
                                 "out-of-descriptors", "vhost"})


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
        self.splices = Counter(
            "broker_filter_splices", "Client connections spliced to the replica owning their first link's queue "
            "(replicas.splice)", registry=r
        )
        self.upstream_reconnects = Counter(
            "broker_filter_upstream_reconnects", "Upstream connections re-established after a loss, by the "
            "loss's cause (broker-closed, socket, heartbeat, unanswered)", ["cause"], registry=r
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

    def refuse_connection(self, reason: str) -> None:
        self.connections_refused.labels(bounded(reason, CONNECTION_REFUSALS)).inc()

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
                                      "(metrics.costliest_filters of them), rank 1 the costliest; the filter's "
                                      "text cut to 60 characters and a hash of the whole",
                                      labels=["rank", "address", "kind", "filter"])
        for rank, (address, kind, text) in enumerate(snap.costliest, 1):
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
# HTTP exporter


_TEXT = [("Content-Type", "text/plain; charset=utf-8")]
PROBES = {"/healthz": "alive", "/livez": "alive", "/readyz": "ready"}


def make_app(registry: CollectorRegistry, health: Health, links: Callable[[], dict | None] | None = None) -> Callable:
    """The exporter as a WSGI application: `/metrics` is prometheus_client's own `make_wsgi_app`
    (content negotiation, gzip, `name[]` filters), `/healthz` (`/livez`) and `/readyz` answer 200 or
    503 with the reason; `/links` (when `links` is given) the daemon's client links as JSON (503 when
    the daemon's loop does not answer in time); HEAD answers like GET without a body; nothing is cached."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path, head = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"] == "HEAD"

        def respond(status: str, headers: list, exc_info: Any = None) -> Any:
            return start_response(status, [*headers, ("Cache-Control", "no-store")], exc_info)

        try:
            if path == "/metrics":
                body = metrics_app({**environ, "REQUEST_METHOD": "GET"} if head else environ, respond)
            elif path == "/links" and links is not None:
                report = links()
                if report is None:
                    respond("503 Service Unavailable", _TEXT)
                    body = [b"the daemon did not answer in time\n"]
                else:
                    respond("200 OK", [("Content-Type", "application/json")])
                    body = [json.dumps(report, default=str).encode()]
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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("http %s - %s", self.address_string(), format % args)


class _ExporterServer(ThreadingWSGIServer):
    allow_reuse_address = True


class _ExporterServer6(_ExporterServer):
    address_family = socket.AF_INET6


class Exporter:
    """The HTTP exporter running on its own thread; `close()` stops it (idempotent)."""

    def __init__(self, server: ThreadingWSGIServer):
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="broker-filter-metrics", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def host(self) -> str:
        return self._server.server_address[0]

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve_http(metrics: Metrics, health: Health, host: str, port: int) -> Exporter:
    """Start the exporter on host:port (port 0: any free port, see `Exporter.port`).  OSError if the
    address cannot be bound."""
    server_class = _ExporterServer6 if ":" in host else _ExporterServer
    server = make_server(host, port, make_app(metrics.registry, health, metrics.links), server_class, _QuietHandler)
    exporter = Exporter(server)
    log.info("metrics and health endpoints on %s (/metrics, /healthz, /readyz, /links)", exporter.url)
    return exporter


__all__ = [
    "AddressCounters",
    "AddressLabels",
    "Exporter",
    "Health",
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
