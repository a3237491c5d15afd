"""`broker-filter serve --io engine`: the daemon's handlers on the engine loop, past the 1,024
descriptors that proton's Container (select) cannot go beyond."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from .conftest import client_result, closed_at_once, run_client, start_client

from launcher import Daemon

pytestmark = pytest.mark.rabbitmq

IDLE = 1100


def test_the_daemon_on_the_engine_serves_a_filtered_consumer_past_a_thousand_idle_sockets(rabbitmq):
    limit = IDLE + 1  # the idle sockets and the consumer
    proxy = Daemon("--io", "engine", "--set", f"limits.connections={limit}", upstream=rabbitmq)
    idle: list[socket.socket] = []
    receiver = None
    try:
        assert "io engine" in proxy.log()
        address = f"/topic/engine-{uuid.uuid4().hex[:10]}"
        receiver = start_client(proxy.url, "receive", address, "10", "--selector", "half = 1", "--wait", "60")
        deadline = time.monotonic() + 20
        while "attach" not in proxy.log().lower() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the upstream subscription is in place once the client's attach is answered
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", proxy.port)))
        time.sleep(0.5)
        assert proxy.proc.poll() is None, proxy.log()[-3000:]

        assert closed_at_once(proxy.port, 20) == 20  # the listener is full

        idle.pop().close()  # room for the producer
        time.sleep(0.3)
        assert run_client(proxy.url, "send", address, "20")["ok"]
        got = client_result(receiver, timeout=90)
        assert got["ok"] and got["bodies"] == [f"m{i}" for i in range(1, 20, 2)], got
        assert proxy.proc.poll() is None
    finally:
        for s in idle:
            s.close()
        if receiver is not None and receiver.poll() is None:
            receiver.kill()
        proxy.stop()
    assert proxy.proc.returncode == 0, proxy.log()[-3000:]
    assert "Traceback" not in proxy.log(), proxy.log()[-3000:]
