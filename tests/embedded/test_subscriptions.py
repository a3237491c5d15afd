"""JMS 2.0 shared and durable subscriptions through the daemon, as Qpid JMS requests them.

The broker library supports them (tests/broker/test_addresses.py); the daemon hands the client's
container id, the `shared`/`global` capabilities and the source durability to the embedded
upstream, and a plain detach keeps a durable subscription."""

from __future__ import annotations

import time

import pytest
from proton import Message
from proton.reactor import DurableSubscription

from clients import Capabilities, bodies, connect, receive_n, receives_nothing
from launcher import Daemon

@pytest.fixture(scope="module")
def daemon():
    """A daemon of its own, so the subscriptions these tests leave behind stay here."""
    d = Daemon()
    yield d
    d.stop()


def subscriber(conn, address, link_name, *caps, durable=True):
    options = [Capabilities("topic", *caps)]
    if durable:
        options.append(DurableSubscription())
    return conn.create_receiver(address, name=link_name, credit=10, options=options)


def test_shared_durable_subscription_links_compete(daemon):
    conn = connect(daemon.url, container_id="jms-client-1")
    try:
        a = subscriber(conn, "shared.t", "sub", "shared")
        b = subscriber(conn, "shared.t", "sub|2", "shared")
        snd = conn.create_sender("multicast://shared.t", name="p")
        for i in range(4):
            snd.send(Message(body=i))
        got = []
        for r in (a, b):
            while True:
                try:
                    got.append(r.receive(timeout=0.5).body)
                    r.accept()
                except Exception:
                    break
        assert sorted(got) == [0, 1, 2, 3]  # one subscription: each message once across both links
    finally:
        conn.close()


def test_durable_subscription_keeps_messages_while_detached(daemon):
    conn = connect(daemon.url, container_id="jms-client-2")
    try:
        r = subscriber(conn, "durable.t", "mysub")
        r.link.detach()  # JMS consumer.close(): detach without closing the subscription
        time.sleep(0.2)
        conn.create_sender("multicast://durable.t", name="p").send(Message(body="while-away"))
        again = subscriber(conn, "durable.t", "mysub")
        assert bodies(receive_n(again, 1, timeout=2)) == ["while-away"]
        assert receives_nothing(again, 0.2)
    finally:
        conn.close()
