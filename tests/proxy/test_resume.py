"""An upstream reconnect the clients do not see (docs/proxy.md "Failures", proxy/resume.py): a relay
between the daemon and RabbitMQ (3.10 and 4.0) cuts the daemon's connection; a consumer on a queue
and a producer through the daemon stay attached, nothing is lost (what was in flight comes again: at
least once), and an attach made while the broker is unreachable is answered when the daemon is
connected again."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest
from proton import Message
from proton.reactor import Selector

from amqp_relay import Relay
from clients import connect, link_name, send_at_least_once
from launcher import Daemon

pytestmark = pytest.mark.rabbitmq

RECONNECTED = "connected ("


@pytest.fixture
def relayed(rabbitmq):
    port = int(rabbitmq.rsplit(":", 1)[1])
    relay = Relay(("127.0.0.1", port))
    d = Daemon("--set", "upstream.reconnect.initial_delay=0.05", "--set", "upstream.reconnect.max_delay=0.5",
               "--set", "upstream.answer_timeout=20", "--set", "metrics.listen=127.0.0.1:0",
               upstream=relay.url())
    d.relay = relay
    d.broker_url = rabbitmq
    yield d
    d.stop()
    relay.close()
    assert "Traceback" not in d.log(), d.log()


def connected_times(d: Daemon) -> int:
    return d.log().count(RECONNECTED)


def wait_reconnected(d: Daemon, before: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while connected_times(d) <= before:
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.05)


def publish_direct(url: str, address: str, numbers) -> None:
    c = connect(url)
    try:
        s = c.create_sender(address)
        for n in numbers:
            s.send(Message(body=n, properties={"n": n}))
    finally:
        c.close()


def receive_all(rcv, wanted: set, timeout: float = 40) -> list:
    """Bodies received (accepted) until every one of `wanted` came; duplicates are kept."""
    got = []
    deadline = time.monotonic() + timeout
    while not wanted <= set(got):
        left = deadline - time.monotonic()
        assert left > 0, f"missing {sorted(wanted - set(got))}"
        m = rcv.receive(timeout=left)
        got.append(m.body)
        rcv.accept()
    return got


def test_a_queue_consumer_stays_attached_across_a_cut_and_loses_nothing(relayed):
    q = f"/queue/resume-{uuid.uuid4().hex[:8]}"
    c = connect(relayed.url)
    try:
        rcv = c.create_receiver(q, name=link_name(), credit=20, options=Selector("n >= 0"))
        publish_direct(relayed.broker_url, q, range(5))
        first = receive_all(rcv, set(range(5)))
        before = connected_times(relayed)
        relayed.relay.cut()
        wait_reconnected(relayed, before)
        publish_direct(relayed.broker_url, q, range(5, 15))
        after = receive_all(rcv, set(range(5, 15)))  # (raises LinkDetached if the link were detached)
        assert set(first + after) == set(range(15))
        assert rcv.link.state & rcv.link.REMOTE_ACTIVE
    finally:
        c.close()
    assert "link(s) resumed" in relayed.log()


def test_a_producer_stays_attached_across_a_cut(relayed):
    q = f"/queue/resume-{uuid.uuid4().hex[:8]}"
    c = connect(relayed.url)
    try:
        snd = c.create_sender(q, name=link_name())
        sent = 0
        before = connected_times(relayed)
        for n in range(20):
            if n == 10:
                relayed.relay.cut()
            send_at_least_once(snd, Message(body=n, properties={"n": n}))  # (again if released)
            sent += 1
        wait_reconnected(relayed, before)
        rcv = c.create_receiver(q, name=link_name(), credit=40)
        got = receive_all(rcv, set(range(20)))
        assert set(got) == set(range(20)) and sent == 20
        assert snd.link.state & snd.link.REMOTE_ACTIVE  # never detached
    finally:
        c.close()


def test_an_attach_while_the_broker_is_unreachable_waits_for_it(relayed):
    q = f"/queue/resume-{uuid.uuid4().hex[:8]}"
    publish_direct(relayed.broker_url, q, [1])
    c = connect(relayed.url)
    result: dict = {}
    try:
        relayed.relay.paused = True
        relayed.relay.cut()
        relayed.wait_for(r"connection lost", 20)

        def attach() -> None:
            try:
                result["receiver"] = c.create_receiver(q, name="waits", credit=5)
            except Exception as e:  # noqa: BLE001 - reported below
                result["error"] = e

        waiter = threading.Thread(target=attach)
        waiter.start()
        relayed.wait_for(re.escape("attach of link 'waits' waits for upstream"), 20)
        relayed.relay.paused = False
        waiter.join(30)
        assert "error" not in result, result.get("error")
        rcv = result["receiver"]
        assert rcv.receive(timeout=20).body == 1
    finally:
        relayed.relay.paused = False
        c.close()
