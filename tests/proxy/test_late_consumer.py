"""A plain consumer attaching after two filtered ones on a RabbitMQ queue gets what they left, promptly.

Two filtered consumers (an SQL filter `color = 'red'`, an application-properties filter `color` blue)
take their 10 each of 30 messages on `/queue/q`; the 10 green ones are left held, moved to the queue's
tail or waiting for the next pass of the search.  A plain consumer attaching then is a new filter: it
must get all 10 green ones within 2 s, whether they are held, moves in flight or behind a finished
pass (docs/proxy.md: a held message is offered again when a link attaches)."""

from __future__ import annotations

import time
import uuid

from proton import Described, Message, symbol
from proton import Timeout
from proton.reactor import Filter

from clients import connect, publish_many, receive_n
from launcher import Daemon

import pytest

pytestmark = pytest.mark.rabbitmq

SQL = symbol("amqp:sql-filter")
APP = symbol("amqp:application-properties-filter")
COLOURS = ("red", "blue", "green")


@pytest.fixture(scope="module")
def own_proxy(rabbitmq):
    d = Daemon(upstream=rabbitmq)
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_a_plain_consumer_after_two_filtered_ones_gets_the_rest_within_2_s(own_proxy, rabbitmq):
    q = f"/queue/late-{uuid.uuid4().hex[:10]}"
    conns = [connect(own_proxy.url) for _ in range(3)]
    try:
        red = conns[0].create_receiver(q, credit=100, options=Filter({symbol("sql-filter"): Described(SQL, "color = 'red'")}))
        blue = conns[1].create_receiver(q, credit=100, options=Filter({symbol("app"): Described(APP, {"color": "blue"})}))
        publish_many(rabbitmq, q, [Message(body=i, properties={"color": COLOURS[i % 3]}) for i in range(30)])
        assert sorted(m.body for m in receive_n(red, 10, timeout=20)) == list(range(0, 30, 3))
        assert sorted(m.body for m in receive_n(blue, 10, timeout=20)) == list(range(1, 30, 3))
        plain = conns[2].create_receiver(q, credit=100)
        start = time.monotonic()
        got = []
        while len(got) < 10 and time.monotonic() - start < 2.0:
            try:
                got.append(plain.receive(timeout=max(0.01, 2.0 - (time.monotonic() - start))).body)
                plain.accept()
            except Timeout:
                break
        assert sorted(got) == list(range(2, 30, 3)), f"{len(got)} of the 10 green ones within 2 s"
    finally:
        for c in conns:
            c.close()
