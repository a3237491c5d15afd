"""Who may read the metrics listener's `/links`, what it costs the daemon's loop, and what clients of
the listener can hold: over real HTTP, against the exporter alone and against real daemons (one
with a selector holding an account number, one on 0.0.0.0, one polled by many clients, one with 300
half-sent requests)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client import CollectorRegistry
from proton.reactor import Selector

from broker_filter.config import Metrics as MetricsSettings
from broker_filter.metrics import Health, LinksAccess, Metrics, Snapshot, filter_hash, serve_http
from clients import connect
from launcher import Daemon

TOKEN = "s3cr3t-" + uuid.uuid4().hex
SECRET_LITERAL = "DE89370400440532013000"  # an account number in a selector


def get(url: str, token: str | None = None, timeout: float = 10) -> tuple[int, dict, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_for(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {timeout:.0f} s")
        time.sleep(0.05)


def report(n: int = 2) -> dict:
    return {"instance": "test", "truncated": False, "links": [
        {"link": f"l{i}", "address": "orders", "direction": "consumer",
         "filters": [{"key": "selector", "kind": "selector", "text": f"iban = '{SECRET_LITERAL}' AND n > {i}",
                      "evaluated": "here"}]} for i in range(n)]}


class Source:
    """A `/links` source that counts how often it is asked (the daemon's loop would make each)."""

    def __init__(self, n: int = 2, delay: float = 0.0):
        self.calls = 0
        self.n = n
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self) -> dict:
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)  # (the loop's time to make it; not synchronisation)
        return report(self.n)


def exporter(host: str = "127.0.0.1", source=None, **settings):
    metrics = Metrics(CollectorRegistry())
    metrics.links = source or Source()
    return serve_http(metrics, Health(metrics), host, 0, MetricsSettings(**settings))


# -------------------------------------------------------------------------------------------------
# Access


def test_links_needs_the_configured_token_and_shows_texts_with_it():
    with exporter(token=TOKEN) as e:
        for token in (None, "", "wrong", TOKEN + "x", TOKEN[:-1]):
            status, headers, body = get(e.url + "/links", token)
            assert status == 401, (token, status)
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert b"metrics.token" in body and SECRET_LITERAL.encode() not in body
        status, _, body = get(e.url + "/links", TOKEN)
        assert status == 200
        links = json.loads(body)["links"]
        assert links[0]["filters"][0]["text"] == f"iban = '{SECRET_LITERAL}' AND n > 0"
        # The other endpoints stay open to Prometheus and the probes.
        assert get(e.url + "/metrics")[0] == 200 and get(e.url + "/healthz")[0] == 200


def test_without_a_token_loopback_sees_kinds_and_hashes_never_texts():
    with exporter() as e:
        status, _, body = get(e.url + "/links")
        assert status == 200
        assert SECRET_LITERAL.encode() not in body
        shown = json.loads(body)
        f = shown["links"][1]["filters"][0]
        assert "text" not in f
        assert f == {"key": "selector", "kind": "selector", "evaluated": "here",
                     "hash": filter_hash(f"iban = '{SECRET_LITERAL}' AND n > 1")}
        assert shown["links"][0]["filters"][0]["hash"] != f["hash"]  # filters stay told apart
        assert "hidden" in shown["filter_texts"]
        # A token sent to a listener without one configured shows nothing more.
        assert SECRET_LITERAL.encode() not in get(e.url + "/links", TOKEN)[2]


def test_a_listener_beyond_loopback_refuses_links_without_a_token():
    with exporter("0.0.0.0") as e:
        status, _, body = get(f"http://127.0.0.1:{e.port}/links")
        assert status == 403
        assert body.decode().startswith("/links is refused on a metrics listener that is not loopback")
        assert get(f"http://127.0.0.1:{e.port}/metrics")[0] == 200
    with exporter("0.0.0.0", token=TOKEN) as e:
        assert get(f"http://127.0.0.1:{e.port}/links")[0] == 401
        assert get(f"http://127.0.0.1:{e.port}/links", TOKEN)[0] == 200


def test_costliest_filter_label_shows_a_hash_unless_told():
    metrics = Metrics(CollectorRegistry())
    metrics.publish(Snapshot(costliest=(("orders", "selector", f"iban = '{SECRET_LITERAL}' #1a2b3c4d"),)))
    for shown, settings in ((False, {}), (True, {"filter_text_in_labels": True})):
        with serve_http(metrics, Health(metrics), "127.0.0.1", 0, MetricsSettings(**settings)) as e:
            body = get(e.url + "/metrics")[2].decode()
            assert (SECRET_LITERAL in body) is shown
            assert 'filter="#1a2b3c4d"' in body or shown


# -------------------------------------------------------------------------------------------------
# Cost


def test_one_report_per_interval_however_many_clients_poll():
    source = Source(delay=0.05)
    with exporter(source=source, links_interval=60.0) as e:
        bodies = []

        def poll() -> None:
            for _ in range(10):
                bodies.append(get(e.url + "/links")[0])

        threads = [threading.Thread(target=poll) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert bodies == [200] * 80
        assert source.calls == 1  # 80 answers, one report made


def test_the_report_is_made_again_after_the_interval_and_cut_to_the_limit():
    now = [0.0]
    source = Source(n=50)
    access = LinksAccess(source, interval=1.0, limit=10, clock=lambda: now[0])
    first = json.loads(access.body(texts=True))
    assert len(first["links"]) == 10 and first["truncated"]
    now[0] += 0.99
    access.body(texts=False)
    assert source.calls == 1
    now[0] += 0.02
    access.body(texts=False)
    assert source.calls == 2


def test_a_daemon_answers_links_with_the_token_and_hides_texts_without(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    d = Daemon("--metrics", "127.0.0.1:0", "--set", f"metrics.token_file={token_file}")
    try:
        url = d.metrics_url()
        conn = connect(d.url)
        try:
            conn.create_receiver(f"anycast://acct-{uuid.uuid4().hex[:8]}", name="acct", credit=5,
                                 options=Selector(f"iban = '{SECRET_LITERAL}'"))

            def seen():
                status, _, body = get(url + "/links", TOKEN)
                return body if status == 200 and b'"acct"' in body else None

            body = wait_for("the link in /links", seen)
            assert SECRET_LITERAL.encode() in body
            status, _, body = get(url + "/links")
            assert status == 401 and SECRET_LITERAL.encode() not in body
        finally:
            conn.close()
    finally:
        d.stop()
    assert TOKEN not in d.log()  # never logged
    assert "Traceback" not in d.log(), d.log()


def test_a_daemon_on_all_interfaces_without_a_token_refuses_links():
    d = Daemon("--metrics", "0.0.0.0:0")
    try:
        url = d.metrics_url().replace("0.0.0.0", "127.0.0.1")
        status, _, body = get(url + "/links")
        assert status == 403 and b"not loopback" in body
        assert get(url + "/healthz")[0] == 200
    finally:
        d.stop()


def test_the_metrics_listener_is_off_by_default_and_a_bare_port_binds_loopback():
    from broker_filter.config import Config

    assert not Config().metrics.enabled
    d = Daemon("--metrics", ":0")
    try:
        assert d.metrics_url().startswith("http://127.0.0.1:")
    finally:
        d.stop()
    assert "0.0.0.0" not in d.log()


def test_print_config_masks_the_token():
    import subprocess
    import sys

    from launcher import ROOT

    out = subprocess.run([sys.executable, "-m", "broker_filter", "serve", "--print-config"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "BROKER_FILTER_METRICS_TOKEN": TOKEN})
    assert out.returncode == 0, out.stderr
    assert TOKEN not in out.stdout + out.stderr
    assert json.loads(out.stdout)["metrics"]["token"] == "***"


# -------------------------------------------------------------------------------------------------
# Threads and time


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_half_sent_requests_hold_no_thread_and_are_dropped():
    d = Daemon("--metrics", "127.0.0.1:0", "--set", "metrics.request_timeout=2")
    held: list[socket.socket] = []
    try:
        url = d.metrics_url()
        port = int(url.rsplit(":", 1)[1])
        assert get(url + "/metrics")[0] == 200
        before = threads_of(d.proc.pid)
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(s)
        # A scrape still gets through while they hang, and the daemon has no more threads than its pool.
        status, _, body = get(url + "/metrics")
        assert status == 200 and b"broker_filter_connections" in body
        most = threads_of(d.proc.pid)
        assert most <= before + 8, (before, most)

        # Within the request time-out (2 s, plus a poll) every half-sent request is dropped.
        def dropped() -> bool:
            for s in held:
                s.settimeout(0.01)
                try:
                    if s.recv(1) != b"":
                        return False
                except TimeoutError:
                    return False
                except OSError:
                    pass
            return True

        start = time.monotonic()
        wait_for("the half-sent requests dropped", dropped, timeout=15)
        assert time.monotonic() - start < 10
        assert threads_of(d.proc.pid) <= before + 8
        assert get(url + "/healthz")[0] == 200
    finally:
        for s in held:
            s.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_many_slow_clients_leave_the_threads_bounded():
    """Clients that send their request and never read the answer: each holds one of the 8 threads
    until the request time-out, no more; past the queue, 503 at once."""
    metrics = Metrics(CollectorRegistry())
    metrics.links = lambda: {"links": [{"link": "x" * 4_000_000}]}
    before = threading.active_count()
    with serve_http(metrics, Health(metrics), "127.0.0.1", 0, MetricsSettings(request_timeout=1.0)) as e:
        socks = []
        try:
            for _ in range(60):
                s = socket.create_connection(("127.0.0.1", e.port), timeout=10)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.sendall(b"GET /links HTTP/1.0\r\n\r\n")
                socks.append(s)
            peak = threading.active_count()
            assert peak <= before + 1 + 8, (before, peak)
            wait_for("the slow readers dropped", lambda: get(e.url + "/healthz", timeout=5)[0] == 200, timeout=20)
            assert threading.active_count() <= before + 1 + 8
        finally:
            for s in socks:
                s.close()
