"""`broker-filter serve` on its default I/O, the engine loop: past the 1,024 descriptors that proton's
Container (select) cannot go beyond, a limit that refuses with a clean close, and a connection that
sends half a frame and goes silent closed at the handshake deadline.

CI size: 500 AMQP connections (rhea) and enough idle TCP sockets for 1,100 connections in all.  The
full size, as in test_scale.py:
    BROKER_FILTER_ENGINE_SCALE=5000,2000 pytest tests/engine/test_daemon.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from .conftest import (client_result, closed_at_once, descriptors, end_many, rss_kib, run_client, start_client,
                       wait_attached)

from launcher import Daemon

pytestmark = pytest.mark.rabbitmq

JS = Path(__file__).resolve().parents[1] / "js"
AMQP_CONNECTIONS, IDLE_SOCKETS = (int(n) for n in os.environ.get("BROKER_FILTER_ENGINE_SCALE", "500,200").split(","))
IDLE = max(IDLE_SOCKETS, 1100 - AMQP_CONNECTIONS)  # past select()'s 1,024 in all
EXTRA = 20


@pytest.fixture
def many_files():
    """Descriptors for the test's own sockets and for the daemon it starts (which inherits the limit)."""
    with descriptors(2 * (AMQP_CONNECTIONS + IDLE + EXTRA) + 1024):
        yield


def _wait_for(predicate, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.mark.node
def test_the_daemon_serves_a_filtered_consumer_past_a_thousand_connections_and_refuses_beyond_its_limit(
        rabbitmq, many_files):
    node = shutil.which("node")
    assert node, "node is needed (scripts/setup.sh)"
    limit = AMQP_CONNECTIONS + IDLE + 1  # the rhea connections, the idle sockets and the consumer
    proxy = Daemon("--set", f"limits.connections={limit}", "--set", "limits.handshake_timeout=600", upstream=rabbitmq)
    idle: list[socket.socket] = []
    receiver = many = None
    try:
        address = f"/topic/engine-{uuid.uuid4().hex[:10]}"
        receiver = start_client(proxy.url, "receive", address, "10", "--selector", "half = 1", "--wait", "120")
        wait_attached(receiver)  # the upstream subscription is in place once the client's attach is answered
        rss_before = rss_kib(proxy.proc.pid)
        many = subprocess.Popen([node, str(JS / "many_connections.js"), str(proxy.port), str(AMQP_CONNECTIONS), "-"],
                                cwd=JS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        report = json.loads(many.stdout.readline())
        assert report["opened"] == AMQP_CONNECTIONS and report["failed"] == 0, report
        rss_amqp = rss_kib(proxy.proc.pid)
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", proxy.port)))
        time.sleep(0.5)
        assert proxy.proc.poll() is None, proxy.log()[-3000:]
        rss_full = rss_kib(proxy.proc.pid)
        print(f"\ndaemon RSS {rss_before // 1024} MiB; {AMQP_CONNECTIONS} AMQP connections: "
              f"{(rss_amqp - rss_before) / AMQP_CONNECTIONS:.1f} KiB each; {IDLE} idle sockets: "
              f"{(rss_full - rss_amqp) / IDLE:.1f} KiB each; all: {rss_full // 1024} MiB")

        assert closed_at_once(proxy.port, EXTRA) == EXTRA  # the listener is full: a clean close, at once

        idle.pop().close()  # room for the producer
        time.sleep(0.3)
        assert run_client(proxy.url, "send", address, "20")["ok"]
        got = client_result(receiver, timeout=120)
        assert got["ok"] and got["bodies"] == [f"m{i}" for i in range(1, 20, 2)], got

        many.stdin.write("?\n")
        many.stdin.flush()
        assert json.loads(many.stdout.readline()) == {"alive": AMQP_CONNECTIONS}  # none dropped
        assert proxy.proc.poll() is None
    finally:
        for s in idle:
            s.close()
        end_many(many)
        if receiver is not None and receiver.poll() is None:
            receiver.kill()
        proxy.stop()
    assert proxy.proc.returncode == 0, proxy.log()[-3000:]
    assert "Traceback" not in proxy.log(), proxy.log()[-3000:]


def test_pass_through_logins_are_checked_upstream_past_a_thousand_descriptors(rabbitmq, many_files):
    """With `upstream.credentials = "pass-through"` each client's PLAIN credentials are checked by
    logging in upstream: that check is one more connection of the loop, so it works with more than
    1,024 descriptors open in the daemon (a select()-based check fails there)."""
    idle_count = 1100
    proxy = Daemon("--set", "upstream.credentials=pass-through", "--set", "listener.allow_anonymous=false",
                   "--set", f"limits.connections={idle_count + 10}", "--set", "limits.handshake_timeout=600",
                   upstream=rabbitmq)
    idle: list[socket.socket] = []
    try:
        for _ in range(idle_count):
            idle.append(socket.create_connection(("127.0.0.1", proxy.port)))
        time.sleep(0.5)
        login = ("--user", "guest", "--password", "guest", "--mechs", "PLAIN")
        address = f"/topic/pass-through-{uuid.uuid4().hex[:10]}"
        receiver = start_client(proxy.url, "receive", address, "3", "--wait", "60", *login)
        wait_attached(receiver)  # with the receiver's own upstream connection and subscription
        assert run_client(proxy.url, "send", address, "3", *login)["ok"]
        got = client_result(receiver, timeout=60)
        assert got["ok"] and got["bodies"] == ["m0", "m1", "m2"], got
        wrong = run_client(proxy.url, "send", address, "1", "--user", "guest", "--password", "not-guest",
                           "--mechs", "PLAIN")
        assert not wrong["ok"] and "unauthorized-access" in wrong["error"], wrong
        assert proxy.proc.poll() is None
    finally:
        for s in idle:
            s.close()
        proxy.stop()
    assert proxy.proc.returncode == 0, proxy.log()[-3000:]
    assert "Traceback" not in proxy.log() and "not-guest" not in proxy.log(), proxy.log()[-3000:]


def _read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float | None]:
    """What the daemon sent, and after how many seconds it closed (None: still open at `timeout`)."""
    sock.settimeout(0.2)
    start = time.monotonic()
    received = b""
    while time.monotonic() - start < timeout:
        try:
            data = sock.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return received, time.monotonic() - start
        if not data:
            return received, time.monotonic() - start
        received += data
    return received, None


def test_half_a_frame_then_silence_is_closed_at_the_handshake_deadline_and_counted(rabbitmq):
    proxy = Daemon("--set", "limits.handshake_timeout=1", "--metrics", "127.0.0.1:0", upstream=rabbitmq)
    try:
        metrics_url = proxy.metrics_url()
        # SASL: the protocol header, then half of a sasl-init frame (8 of its announced 64 bytes).
        with_sasl = socket.create_connection(("127.0.0.1", proxy.port))
        with_sasl.sendall(b"AMQP\x03\x01\x00\x00" + b"\x00\x00\x00\x40\x02\x01\x00\x00")
        # Without SASL: the AMQP header, then half of an open frame.
        plain = socket.create_connection(("127.0.0.1", proxy.port))
        plain.sendall(b"AMQP\x00\x01\x00\x00" + b"\x00\x00\x00\x40\x02\x00\x00\x00")
        # Nothing at all.
        silent = socket.create_connection(("127.0.0.1", proxy.port))
        for sock in (with_sasl, plain, silent):
            with sock:
                _, closed_after = _read_until_closed(sock, 15)
                assert closed_after is not None, "the daemon kept a connection that never opened AMQP"
        # A client that opens AMQP is served all the same.
        address = f"/topic/handshake-{uuid.uuid4().hex[:10]}"
        receiver = start_client(proxy.url, "receive", address, "2", "--wait", "60")
        wait_attached(receiver)
        time.sleep(1.2)  # past the 1 s handshake deadline of its connection (the wait itself is what is tested)
        assert run_client(proxy.url, "send", address, "2")["ok"]
        assert client_result(receiver, timeout=60)["ok"]
        refused = _metric(metrics_url, r'broker_filter_connections_refused_total\{reason="handshake-timeout"\} (\S+)')
        assert refused == 3.0
        assert proxy.proc.poll() is None
    finally:
        proxy.stop()
    assert proxy.proc.returncode == 0, proxy.log()[-3000:]


def _metric(url: str, pattern: str) -> float:
    from urllib.request import urlopen

    with urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    m = re.search(pattern, text)
    assert m, text[-3000:]
    return float(m.group(1))
