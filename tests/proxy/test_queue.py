"""A shared queue with competing filtered consumers: no loss, no misdelivery, no redelivery loop, and
messages nobody matches wait for a later consumer whose filter matches."""

from __future__ import annotations

import pytest
from proton import Message
from proton.reactor import Selector

from clients import connect, receive_from_each, receive_n_and_extras, receive_until_quiet
from launcher import Daemon
from rabbitmq_nodes import rabbitmqctl

pytestmark = pytest.mark.rabbitmq

COLORS = ["red", "blue", "green", None]


@pytest.fixture(scope="module")
def small_window_proxy(rabbitmq):
    # A window far smaller than the backlog, so holding, blocking and recycling all happen.
    p = Daemon("--set", "limits.upstream_window=20", upstream=rabbitmq)
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


def test_competing_filtered_consumers(small_window_proxy, rabbitmq, address):
    proxy = small_window_proxy
    q = f"/queue/{address}"
    n = 200
    a, b, c, direct = connect(proxy.url), connect(proxy.url), connect(proxy.url), connect(rabbitmq)
    try:
        red = a.create_receiver(q, credit=10, options=Selector("color = 'red'"))
        blue = b.create_receiver(q, credit=10, options=Selector("color = 'blue'"))
        sender = c.create_sender(q)
        for i in range(n):
            color = COLORS[i % 4]
            sender.send(Message(body=i, properties={"i": i, **({"color": color} if color else {})}))

        got = receive_from_each({"red": red, "blue": blue}, expect=n // 2)
        reds = [m.body for m in got["red"]]
        blues = [m.body for m in got["blue"]]
        assert sorted(reds) == [i for i in range(n) if i % 4 == 0]  # every red, once, to red only
        assert sorted(blues) == [i for i in range(n) if i % 4 == 1]
        assert all(m.properties["color"] == "red" for m in got["red"])

        # A consumer arriving later gets the messages that waited for it.
        green = c.create_receiver(q, credit=10, options=Selector("color = 'green'"))
        greens = [m.body for m in receive_from_each({"green": green}, expect=n // 4)["green"]]
        assert sorted(greens) == [i for i in range(n) if i % 4 == 2]

        # Nobody took the colourless ones: they are all still in the queue, exactly once each.
        a.close()
        b.close()
        c.close()
        rest = receive_n_and_extras(direct.create_receiver(q, credit=100), n // 4)
        assert sorted(m.body for m in rest) == [i for i in range(n) if i % 4 == 3]
    finally:
        for conn in (a, b, c, direct):
            try:
                conn.close()
            except Exception:
                pass


def test_released_message_goes_to_the_next_matching_consumer(proxy, address):
    q = f"/queue/{address}"
    a, b = connect(proxy.url), connect(proxy.url)
    try:
        first = a.create_receiver(q, credit=1, options=Selector("n >= 0"))
        s = a.create_sender(q)
        s.send(Message(body="only", properties={"n": 1}))
        m = first.receive(timeout=5)
        assert m.body == "only"
        first.release()
        a.close()
        second = b.create_receiver(q, credit=5, options=Selector("n = 1"))
        assert [x.body for x in receive_until_quiet(second, at_most=1)] == ["only"]
    finally:
        for conn in (a, b):
            try:
                conn.close()
            except Exception:
                pass


def test_topic_fan_out_to_twenty_receivers_with_different_selectors(proxy):
    import uuid

    tag = "fan" + uuid.uuid4().hex[:6]
    conn = connect(proxy.url)
    try:
        receivers = {}
        for k in range(20):
            # receiver k: multiples of k+1 (the boolean property m<k>) below 40 + k
            receivers[k] = conn.create_receiver(f"/topic/{tag}", name=f"r{k}", credit=100,
                                                options=Selector(f"m{k} AND n < {40 + k}"))
        s = conn.create_sender(f"/topic/{tag}")
        for i in range(60):
            s.send(Message(body=i, subject=tag, properties={"n": i, **{f"m{k}": i % (k + 1) == 0 for k in range(20)}}))
        for k, r in receivers.items():
            want = [i for i in range(60) if i % (k + 1) == 0 and i < 40 + k]
            got = [m.body for m in receive_n_and_extras(r, len(want), extra_wait=0.1)]
            assert got == want, k
        # nothing extra arrives
        for r in receivers.values():
            assert receive_until_quiet(r, idle=0.2) == []
    finally:
        conn.close()


def test_upstream_holds_never_exceed_client_credit_plus_window(rabbitmq, address):
    """Against RabbitMQ's own count of unacknowledged messages: the proxy takes at most credit + window."""
    import time


    p = Daemon("--set", "limits.upstream_window=20", upstream=rabbitmq)
    q = f"/queue/{address}"
    c = connect(p.url)
    direct = connect(rabbitmq)
    try:
        s = direct.create_sender(q)
        for i in range(300):
            s.send(Message(body=i, properties={"n": i}))
        c.create_receiver(q, credit=5, options=Selector("n >= 0"))  # grants 5, never more (no receive_until_quiet())
        time.sleep(1.5)
        out = rabbitmqctl("list_queues", "name", "messages_unacknowledged").stdout
        (unacked,) = [int(line.split()[1]) for line in out.splitlines() if line.startswith(address)]
        # 5 sent to the client and unsettled there, at most the window more held in the proxy
        assert 5 <= unacked <= 5 + 20, unacked
    finally:
        c.close()
        direct.close()
        p.stop()
