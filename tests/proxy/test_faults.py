"""Faults with real parts: a client killed mid-stream, a client that never grants credit, garbage on the
socket, and RabbitMQ restarted under the proxy."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from proton import Message
from proton.reactor import Selector

from clients import connect, receive_n_and_extras, receive_until_quiet, send_at_least_once
from launcher import Daemon
from rabbitmq_nodes import amqp10_ready, rabbitmqctl

pytestmark = pytest.mark.rabbitmq

HERE = Path(__file__).resolve().parent


@pytest.fixture
def proxy(proxy):
    """The shared daemon, once it is connected upstream again: a restart test earlier in this module
    restarts the RabbitMQ node under it, and it reconnects with backoff (it refuses links with
    `retry later` until then, which is its promise, not what these tests are about)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            c = connect(proxy.url)
            try:
                c.create_sender(f"/queue/reconnected-{uuid.uuid4().hex[:8]}")
            finally:
                c.close()
            return proxy
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_killed_client_loses_nothing(proxy, address):
    q = f"/queue/{address}"
    c = connect(proxy.url)
    try:
        s = c.create_sender(q)
        for i in range(30):
            s.send(Message(body=i, properties={"even": i % 2 == 0}))
        child = subprocess.Popen([sys.executable, str(HERE / "killed_client.py"), proxy.url, q, "even = TRUE", "6", "2"],
                                 stdout=subprocess.PIPE, text=True)
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line or line.strip() == "ready":
                break
            lines.append(line.split())
        accepted = {int(x[1]) for x in lines if x[0] == "accepted"}
        held = {int(x[1]) for x in lines if x[0] == "holding"}
        assert len(accepted) == 2 and len(held) == 4
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
        r = c.create_receiver(q, credit=50)
        rest = {m.body for m in receive_n_and_extras(r, 28)}
        assert rest == set(range(30)) - accepted  # the unsettled ones came back; nothing else is missing
    finally:
        c.close()


def test_client_without_credit_and_garbage_do_not_disturb_others(proxy, address):
    q = f"/queue/{address}"
    stingy = connect(proxy.url)
    c = connect(proxy.url)
    garbage = socket.create_connection(("127.0.0.1", proxy.port))
    try:
        garbage.sendall(b"AMQP\x00\x01\x00\x00" + os.urandom(64))
        stingy.create_receiver(q, credit=0)
        r = c.create_receiver(q, name="working", credit=10)
        s = c.create_sender(q)
        for i in range(5):
            s.send(Message(body=i))
        assert sorted(m.body for m in receive_until_quiet(r, at_most=5)) == [0, 1, 2, 3, 4]
    finally:
        garbage.close()
        stingy.close()
        c.close()


@pytest.fixture
def own_proxy(rabbitmq):
    p = Daemon(upstream=rabbitmq)
    yield p
    p.stop()


def test_rabbitmq_restart_is_invisible_to_a_queue_consumer_and_producer(own_proxy, address):
    """RabbitMQ restarted under the daemon: its queue consumer and producer stay attached (no detach),
    the daemon reconnects by itself, and every message comes (at least once: one the consumer had not
    settled at the restart may come again)."""
    proxy = own_proxy
    q = f"/queue/{address}"
    c = connect(proxy.url)
    try:
        r = c.create_receiver(q, credit=10, options=Selector("n >= 0"))
        s = c.create_sender(q)
        for i in range(3):
            s.send(Message(body=i, properties={"n": i}))
        assert [m.body for m in receive_until_quiet(r, at_most=3)] == [0, 1, 2]
        connected = proxy.log().count("connected (")
        assert rabbitmqctl("stop_app").returncode == 0
        try:
            proxy.wait_for("connection lost", 30)
        finally:
            assert rabbitmqctl("start_app").returncode == 0
        amqp10_ready(60)
        deadline = time.monotonic() + 60
        while proxy.log().count("connected (") <= connected:  # the daemon reconnects by itself
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.2)
        for i in range(3, 6):  # on the same sending link, kept across the restart
            send_at_least_once(s, Message(body=i, properties={"n": i}))
        got = [m.body for m in receive_until_quiet(r, at_most=6, idle=2.0, limit=40)]
        assert {3, 4, 5} <= set(got), got  # on the same receiving link
        assert r.link.state & r.link.REMOTE_ACTIVE and s.link.state & s.link.REMOTE_ACTIVE
        assert proxy.proc.poll() is None
        assert "link(s) resumed" in proxy.log()
    finally:
        c.close()


def test_publisher_killed_mid_transfer_publishes_nothing_partial(proxy, address):
    q = f"/queue/{address}"
    script = (
        "import sys\n"
        "from proton import Message\n"
        "from proton.utils import BlockingConnection\n"
        "c = BlockingConnection(sys.argv[1], timeout=30)\n"
        "s = c.create_sender(sys.argv[2])\n"
        "print('attached', flush=True)\n"
        "s.send(Message(body=b'x' * (64 * 1024 * 1024)))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, proxy.url, q], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "attached"
        time.sleep(0.5)  # part of the 64 MiB transfer is on its way
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
    c = connect(proxy.url)
    try:
        s = c.create_sender(q)
        s.send(Message(body="after"))
        r = c.create_receiver(q, credit=5)
        assert [m.body for m in receive_n_and_extras(r, 1)] == ["after"]  # nothing partial went upstream
    finally:
        c.close()


def test_undecodable_message_from_a_client_is_rejected_and_not_published(proxy, address):
    from proton import Disposition

    q = f"/queue/{address}"
    c = connect(proxy.url)
    try:
        s = c.create_sender(q)
        c.wait(lambda: s.link.credit > 0, timeout=10)
        dlv = s.link.delivery("bad-1")
        s.link.send(b"\x00\x53\x77\xa1\xff")  # an amqp-value string claiming 255 bytes, with none
        s.link.advance()
        c.wait(lambda: dlv.remote_state != 0, timeout=10)
        assert dlv.remote_state == Disposition.REJECTED
        assert dlv.remote.condition.name == "amqp:decode-error"
        s.send(Message(body="good"))
        r = c.create_receiver(q, credit=5)
        assert [m.body for m in receive_n_and_extras(r, 1)] == ["good"]
    finally:
        c.close()
