"""The exporter over real HTTP: scraped with urllib, parsed with the Prometheus text parser."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from broker_filter.metrics import OTHER, AddressLabels, Health, Metrics, Snapshot, serve_http


def fetch(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def scrape(exporter) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}}"""
    status, _, body = fetch(exporter.url + "/metrics")
    assert status == 200
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.fixture
def metrics():
    return Metrics(CollectorRegistry(), address_labels=3)


@pytest.fixture
def exporter(metrics):
    health = Health(metrics)
    with serve_http(metrics, health, "127.0.0.1", 0) as exporter:
        exporter.health = health
        yield exporter


def test_counters_by_address_and_outcome(metrics, exporter):
    orders = metrics.address("orders")
    orders.received.inc(5)
    orders.forwarded.inc(3)
    orders.filtered_out.inc(2)
    orders.outcome("accepted", 2)
    orders.outcome("released")
    orders.outcome("made-up")
    metrics.address("news").published.inc()
    samples = scrape(exporter)
    assert samples["broker_filter_messages_received_total"][(("address", "orders"),)] == 5
    assert samples["broker_filter_messages_forwarded_total"][(("address", "orders"),)] == 3
    assert samples["broker_filter_messages_filtered_out_total"][(("address", "orders"),)] == 2
    assert samples["broker_filter_messages_published_total"][(("address", "news"),)] == 1
    outcomes = samples["broker_filter_outcomes_total"]
    assert outcomes[(("address", "orders"), ("outcome", "accepted"))] == 2
    assert outcomes[(("address", "orders"), ("outcome", "released"))] == 1
    assert outcomes[(("address", "orders"), ("outcome", OTHER))] == 1
    assert samples["broker_filter_info"][(("version", "0.1.0"),)] == 1


def test_address_labels_are_bounded(metrics, exporter):
    for i in range(50):
        metrics.address(f"client-made-{i}").received.inc()
    metrics.address("x" * 1000).received.inc()
    received = scrape(exporter)["broker_filter_messages_received_total"]
    labels = {dict(k)["address"] for k in received}
    assert len(labels) == 4  # three distinct + other
    assert OTHER in labels
    assert sum(received.values()) == 51
    assert received[(("address", OTHER),)] == 48


def test_reserved_addresses_keep_their_label():
    labels = AddressLabels(2)
    labels.reserve(["orders", "news"])
    assert labels("late") == OTHER
    assert labels("orders") == "orders"
    assert labels("other") == OTHER  # an address named like the overflow label cannot pose as it
    assert labels.distinct == 2


def test_refusals_reasons_are_bounded(metrics, exporter):
    metrics.refuse_attach("invalid-filter")
    metrics.refuse_attach("invalid-filter")
    metrics.refuse_attach("color = 'red'")  # anything outside the fixed set, e.g. selector text
    metrics.refuse_connection("limit")
    metrics.authentication_failed("plain")
    metrics.upstream_reconnected("socket")
    metrics.upstream_reconnected("anything else")
    samples = scrape(exporter)
    refused = samples["broker_filter_attach_refused_total"]
    assert refused == {(("reason", "invalid-filter"),): 2, (("reason", OTHER),): 1}
    assert samples["broker_filter_connections_refused_total"] == {(("reason", "limit"),): 1}
    assert samples["broker_filter_authentication_failures_total"] == {(("mechanism", "PLAIN"),): 1}
    assert samples["broker_filter_upstream_reconnects_total"] == {(("cause", "socket"),): 1, (("cause", OTHER),): 1}


def test_head_and_a_failing_endpoint_leave_the_exporter_serving(metrics):
    class BrokenHealth(Health):
        def ready(self):
            raise RuntimeError("probe bug")

    with serve_http(metrics, BrokenHealth(metrics), "127.0.0.1", 0) as exporter:
        assert fetch(exporter.url + "/readyz")[::2] == (500, b"internal error\n")
        request = urllib.request.Request(exporter.url + "/metrics", method="HEAD")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert (response.status, response.read()) == (200, b"")
            assert response.headers["Cache-Control"] == "no-store"
        status, headers, body = fetch(exporter.url + "/metrics")
        assert status == 200 and b"broker_filter_connections " in body
        assert headers["Cache-Control"] == "no-store"


def test_state_comes_from_the_published_snapshot(metrics, exporter):
    samples = scrape(exporter)
    assert samples["broker_filter_connections"][()] == 0
    assert samples["broker_filter_upstream_connected"][()] == 0
    metrics.publish(
        Snapshot(
            connections=4,
            links={"consumer": 3, "producer": 1, "weird": 2},
            held={"orders": 7, "a": 1, "b": 1, "c": 1, "d": 1},
            credit={"orders": 10},
            stalled={"orders": True},
            upstream_connected=True,
            spliced=2,
        )
    )
    samples = scrape(exporter)
    assert samples["broker_filter_connections"][()] == 4
    assert samples["broker_filter_spliced_connections"][()] == 2
    assert samples["broker_filter_links"] == {
        (("kind", "consumer"),): 3,
        (("kind", "producer"),): 1,
        (("kind", OTHER),): 2,
    }
    held = samples["broker_filter_messages_held"]
    assert held[(("address", "orders"),)] == 7
    assert held[(("address", OTHER),)] == 2  # a, b take the last two labels; c and d overflow
    assert sum(held.values()) == 11
    assert samples["broker_filter_credit_outstanding"] == {(("address", "orders"),): 10}
    assert samples["broker_filter_address_stalled"] == {(("address", "orders"),): 1}
    assert samples["broker_filter_upstream_connected"][()] == 1


def test_health_and_readiness_endpoints(metrics, exporter):
    assert fetch(exporter.url + "/healthz")[0] == 200
    status, _, body = fetch(exporter.url + "/readyz")
    assert (status, body) == (503, b"upstream not reachable\n")
    metrics.publish(Snapshot(upstream_connected=True))
    assert fetch(exporter.url + "/readyz")[:3:2] == (200, b"ok\n")
    exporter.health.set_ready(False, "shutting down")
    assert fetch(exporter.url + "/readyz")[:3:2] == (503, b"shutting down\n")
    assert fetch(exporter.url + "/healthz")[0] == 200
    assert fetch(exporter.url + "/nope")[0] == 404


def test_liveness_follows_the_event_loop_heartbeat():
    now = [100.0]
    health = Health(ready_check=lambda: True, stale_after=5, clock=lambda: now[0])
    assert health.alive() == (True, "ok")
    health.beat()
    now[0] += 4
    assert health.alive()[0] and health.ready()[0]
    now[0] += 2
    assert health.alive() == (False, "event loop stalled for 6 s")
    assert not health.ready()[0]


def test_a_failing_readiness_check_means_not_ready():
    def broken() -> bool:
        raise RuntimeError("boom")

    assert Health(ready_check=broken).ready() == (False, "readiness check failed")


def test_openmetrics_gzip_and_name_filter(metrics, exporter):
    metrics.address("orders").received.inc()
    status, headers, body = fetch(
        exporter.url + "/metrics?name[]=broker_filter_messages_received_total",
        {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"},
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert 'broker_filter_messages_received_total{address="orders"} 1.0' in text
    assert "broker_filter_connections" not in text
    assert text.rstrip().endswith("# EOF")


def test_exporter_close_releases_the_port(metrics):
    exporter = serve_http(metrics, Health(metrics), "127.0.0.1", 0)
    port = exporter.port
    exporter.close()
    exporter.close()
    again = serve_http(metrics, Health(metrics), "127.0.0.1", port)
    again.close()


def test_busy_port_raises_oserror(metrics, exporter):
    with pytest.raises(OSError):
        serve_http(metrics, Health(metrics), "127.0.0.1", exporter.port)
