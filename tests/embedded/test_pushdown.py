"""A second daemon pointed at an embedded one pushes selectors down instead of evaluating them."""

from __future__ import annotations

import time

import pytest
from proton import Message

from clients import bodies, connect, receive_n, receiver, receives_nothing
from launcher import Daemon, InProcessDaemon


@pytest.fixture(scope="module")
def chain():
    upstream = InProcessDaemon()
    front = Daemon(upstream=upstream.url)
    yield upstream, front
    front.stop()
    upstream.stop()
    assert "Traceback" not in front.log(), front.log()


def evaluations(broker, queue: str) -> int:
    q = broker.queues.get(queue)
    return sum(c.evaluations for c in q.consumers) if q is not None else 0


def test_selector_is_evaluated_once_per_message_by_the_embedded_upstream(chain):
    upstream, front = chain
    conn = connect(front.url)
    try:
        snd = conn.create_sender("chained", name="producer")
        for i in range(10):
            snd.send(Message(body=i, properties={"n": i}))
        r = receiver(conn, "chained", selector="n > 6")
        assert bodies(receive_n(r, 3)) == [7, 8, 9]
        assert receives_nothing(r, 0.3)
        # The upstream consumer carries the selector and looked at each message exactly once ...
        [consumer] = upstream.broker.queues["chained"].consumers
        assert consumer.filter is not None and "n > 6" in consumer.filter.description.replace("(", "").replace(")", "")
        assert evaluations(upstream.broker, "chained") == 10
        # ... and the non-matching messages never left the upstream queue, still in order.
        direct = connect(upstream.url)
        try:
            assert bodies(receive_n(receiver(direct, "chained"), 7)) == [0, 1, 2, 3, 4, 5, 6]
        finally:
            direct.close()
    finally:
        conn.close()


def test_front_daemon_echoes_the_pushed_selector(chain):
    upstream, front = chain
    conn = connect(front.url)
    try:
        r = receiver(conn, "echoed", selector="color = 'red'")
        remote = r.link.remote_source.filter
        remote.rewind()
        remote.next()
        assert "color = 'red'" in str(remote.get_object())
        for _ in range(50):
            q = upstream.broker.queues.get("echoed")
            if q is not None and q.consumers:
                break
            time.sleep(0.05)
        assert upstream.broker.queues["echoed"].consumers[0].hint is not None  # equality index in use upstream
    finally:
        conn.close()


def test_virtual_address_filter_is_pushed_down_with_the_clients_own(tmp_path):
    """A virtual address served from a filtering upstream: its filter AND the client's go upstream,
    so a message that passes the client's filter but not the virtual one stays in the upstream
    queue for others instead of being held by the front daemon."""
    upstream = InProcessDaemon()
    conf = tmp_path / "front.toml"
    conf.write_text('[virtual_addresses.reds]\nupstream = "paints"\nselector = "color = \'red\'"\n')
    front = Daemon("--config", str(conf), upstream=upstream.url)
    conn = connect(front.url)
    try:
        snd = conn.create_sender("paints", name="producer")
        for i in range(6):
            snd.send(Message(body=i, properties={"n": i, "color": "red" if i % 2 else "blue"}))
        r = receiver(conn, "reds", selector="n > 1")
        assert bodies(receive_n(r, 2)) == [3, 5]
        [consumer] = upstream.broker.queues["paints"].consumers
        described = consumer.filter.description
        assert "color = 'red'" in described and "n > 1" in described, described
        # The front link is still attached: blue 2 and 4 (which pass "n > 1") were never taken.
        direct = connect(upstream.url)
        try:
            assert bodies(receive_n(receiver(direct, "paints"), 4)) == [0, 1, 2, 4]
        finally:
            direct.close()
        # The echo is the client's own filter only.
        remote = r.link.remote_source.filter
        remote.rewind()
        remote.next()
        echoed = str(remote.get_object())
        assert "n > 1" in echoed and "red" not in echoed, echoed
    finally:
        conn.close()
        front.stop()
        upstream.stop()
    assert "Traceback" not in front.log(), front.log()
