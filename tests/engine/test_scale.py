"""Thousands of connections on one engine loop: AMQP clients (rhea, in a process of its own) plus
idle TCP sockets that never send a byte, a limit that refuses the rest with a clean close, and a
python-qpid-proton client served throughout.

CI size: 500 AMQP connections and 200 idle sockets.  The full size (5,000 and 2,000):
    BROKER_FILTER_ENGINE_SCALE=5000,2000 pytest tests/engine/test_scale.py -s
(it prints the server's RSS per connection for bench/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from broker_filter.engine.loop import Limits
from broker_filter.engine.streams import ServerSasl

from .apps import EchoServer
from .conftest import client_result, closed_at_once, descriptors, end_many, rss_kib, start_client

JS = Path(__file__).resolve().parents[1] / "js"
AMQP_CONNECTIONS, IDLE_SOCKETS = (int(n) for n in os.environ.get("BROKER_FILTER_ENGINE_SCALE", "500,200").split(","))
EXTRA = 50


@pytest.fixture
def many_files():
    with descriptors(2 * (AMQP_CONNECTIONS + IDLE_SOCKETS + EXTRA) + 1024):
        yield


@pytest.mark.node
def test_thousands_of_connections_and_idle_sockets_stay_up_refuse_beyond_the_limit_and_serve(
        loop_thread, many_files):
    node = shutil.which("node")
    assert node, "node is needed (scripts/setup.sh)"
    limit = AMQP_CONNECTIONS + IDLE_SOCKETS + 1  # + the proton receiver
    echo = EchoServer()
    listener = loop_thread.call(lambda: loop_thread.loop.listen(
        "127.0.0.1", 0, echo, sasl=ServerSasl(("ANONYMOUS",), allow_skip=True),
        limits=Limits(max_connections=limit, handshake_timeout=600)))
    url = f"amqp://127.0.0.1:{listener.port}"
    rss_before = rss_kib()

    receiver = start_client(url, "receive", "served", "20", "--wait", "120")
    deadline = time.monotonic() + 30
    while loop_thread.call(lambda: listener.active) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)

    idle: list[socket.socket] = []
    many = None
    try:
        for _ in range(IDLE_SOCKETS):
            idle.append(socket.create_connection(("127.0.0.1", listener.port)))
        deadline = time.monotonic() + 60
        while loop_thread.call(lambda: listener.active) < IDLE_SOCKETS + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        rss_idle = rss_kib()
        many = subprocess.Popen([node, str(JS / "many_connections.js"), str(listener.port), str(AMQP_CONNECTIONS)],
                                cwd=JS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        report = json.loads(many.stdout.readline())
        assert report["opened"] == AMQP_CONNECTIONS and report["failed"] == 0, report
        deadline = time.monotonic() + 60
        while loop_thread.call(lambda: listener.active) < limit and time.monotonic() < deadline:
            time.sleep(0.1)
        assert loop_thread.call(lambda: listener.active) == limit
        rss_full = rss_kib()

        assert closed_at_once(listener.port, EXTRA) == EXTRA  # the listener is full
        assert loop_thread.call(lambda: listener.refused["limit"]) == EXTRA

        idle.pop().close()  # room for one: a sender, served while every other slot is taken
        deadline = time.monotonic() + 30
        while loop_thread.call(lambda: listener.active) == limit and time.monotonic() < deadline:
            time.sleep(0.05)
        sender = start_client(url, "send", "served", "20")
        assert client_result(sender)["ok"]

        got = client_result(receiver, timeout=180)
        assert got["ok"] and got["bodies"] == [f"m{i}" for i in range(20)], got

        many.stdin.write("?\n")
        many.stdin.flush()
        assert json.loads(many.stdout.readline()) == {"alive": AMQP_CONNECTIONS}  # none dropped
        print(f"\nserver RSS {rss_before // 1024} MiB; {IDLE_SOCKETS} idle sockets: "
              f"{(rss_idle - rss_before) / IDLE_SOCKETS:.1f} KiB each; {AMQP_CONNECTIONS} AMQP connections "
              f"(session, receiver link, credit 1): {(rss_full - rss_idle) / AMQP_CONNECTIONS:.1f} KiB each; "
              f"all: {rss_full // 1024} MiB")
    finally:
        for s in idle:
            s.close()
        end_many(many)
        if receiver.poll() is None:
            receiver.kill()
    deadline = time.monotonic() + 60
    while loop_thread.call(lambda: listener.active) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert loop_thread.call(lambda: listener.active) == 0
    assert loop_thread.call(lambda: len(loop_thread.loop.connections)) == 0
