"""Replicas with `replicas.splice`: a client connection that attaches first to a queue another
replica owns, with its open (pipelined), goes whole to the owner at the byte level; the owner
serves it as if the client had connected there, and the replica it landed on only copies bytes.
A client that waits for the open's answer before attaching is served through the owner, as
without the setting.  The spliced connection ends with its owner (as after a redirect): the client
reconnects, and gets every message of its own (at least once)."""

from __future__ import annotations

import re
import signal
import time
import uuid

import pytest

from clients import connect, send_messages, sender
from launcher import metric_value, scrape
from replicas import Consumer, PipelinedConsumer, ReplicaSet, expected, parts, publish_parts

from broker_filter.proxy.replicas import owner_of

pytestmark = [pytest.mark.rabbitmq, pytest.mark.broker_agnostic]


def running(rabbitmq: str, n: int):
    """n replicas with `replicas.splice`, started; stopped after the test, their logs clean."""
    rs = ReplicaSet(rabbitmq, n, splice=True)
    rs.start_all()
    yield rs
    for log in rs.stop_all():
        assert "Traceback" not in log, log


@pytest.fixture
def pair(rabbitmq):
    yield from running(rabbitmq, 2)


def queue_owned_by(rs: ReplicaSet, i: int) -> tuple[str, str]:
    while True:
        name = f"splice-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        if owner_of(q, rs.peers) == rs.peers[i]:
            return name, q


def received(rs: ReplicaSet, i: int, q: str) -> float:
    return metric_value(scrape(rs.metrics_ports[i]), "broker_filter_messages_received_total", address=q)


def published(rs: ReplicaSet, i: int, q: str) -> float:
    return metric_value(scrape(rs.metrics_ports[i]), "broker_filter_messages_published_total", address=q)


def test_a_pipelined_client_on_a_non_owner_is_spliced_to_the_owner(rabbitmq, pair):
    rs = pair
    name, q = queue_owned_by(rs, 0)
    spliced = PipelinedConsumer([rs.url(1)], q, "part = 1")
    waiting = Consumer([rs.url(1)], q, "part = 2")  # attaches once its open is answered: the hop
    try:
        for c in (spliced, waiting):
            c.start()
            assert c.attached.wait(30), c.errors
        publish_parts(rabbitmq, q, 0, 600)
        assert spliced.wait_set(expected(1, 0, 600), 60), f"{spliced.count()}; {spliced.errors}"
        assert waiting.wait_set(expected(2, 0, 600), 60), f"{waiting.count()}; {waiting.errors}"
        time.sleep(0.5)  # extras would show here
        assert sorted(spliced.got) == sorted(expected(1, 0, 600))
        assert sorted(waiting.got) == sorted(expected(2, 0, 600))
        assert spliced.reconnects == 0 and waiting.reconnects == 0, (spliced.errors, waiting.errors)
        log1 = rs.daemons[1].log()
        assert log1.count("spliced to it") == 1, log1[-3000:]
        assert metric_value(scrape(rs.metrics_ports[1]), "broker_filter_splices_total") == 1
        # replica 1 received only the waiting client's matches from the owner; the spliced
        # connection's never crossed its proxy, only its bytes
        assert received(rs, 1, q) == 200
        assert received(rs, 0, q) >= 600
    finally:
        for c in (spliced, waiting):
            c.stopping.set()
        for c in (spliced, waiting):
            c.join(10)


def test_a_pipelined_producer_on_a_non_owner_is_spliced_to_the_owner(rabbitmq, pair):
    """A producer whose first link is a sender to a queue another replica owns publishes through
    the owner (whose loop, busy with the queue's consumers, costs less per message than a second
    one woken for each publish); one that waits for the open's answer publishes from where it
    landed, as without the setting.  Either way the queue gets every message, once."""
    rs = pair
    name, q = queue_owned_by(rs, 0)
    consumer = Consumer([rs.url(0)], q, "part >= 0")
    try:
        consumer.start()
        assert consumer.attached.wait(30), consumer.errors
        publish_parts(rs.url(1), q, 0, 300)  # proton's Container: open, begin and attach pipelined
        conn = connect(rs.url(1))  # BlockingConnection: attaches once its open is answered
        try:
            send_messages(sender(conn, q), parts(300, 500))
        finally:
            conn.close()
        assert consumer.wait_set(set(range(500)), 60), f"{consumer.count()}; {consumer.errors}"
        time.sleep(0.5)  # extras would show here
        assert sorted(consumer.got) == list(range(500))
        assert rs.daemons[1].log().count("spliced to it") == 1
        assert published(rs, 0, q) == 300  # the spliced producer's, published by the owner
        assert published(rs, 1, q) == 200  # the waiting producer's, published where it landed
    finally:
        consumer.stopping.set()
        consumer.join(10)


@pytest.fixture
def three(rabbitmq):
    yield from running(rabbitmq, 3)


@pytest.mark.parametrize("how,who", [("kill", "owner"), ("term", "owner"), ("term", "other")])
def test_three_replicas_spliced_consumers_survive_a_replica_going_and_coming_back(rabbitmq, three, how, who):
    """Consumer k (selector `part = k`) on replica k, each attaching with its open: the two on
    non-owners are spliced to the owner.  The owner is killed or drains mid-stream (or a non-owner
    drains): the connections spliced through it or to it end, their clients connect again (the
    next replica of their list), the queue has a new owner within 5 s, and every consumer gets
    every message of its own (at least once).  The replica restarted rejoins."""
    rs = three
    name, q = queue_owned_by(rs, 0)
    victim = 0 if who == "owner" else 1
    cs = [PipelinedConsumer([rs.url((k + i) % 3) for i in range(3)], q, f"part = {k}", credit=20) for k in range(3)]
    try:
        for c in cs:
            c.start()
            assert c.attached.wait(30), c.errors
        assert sum(rs.daemons[k].log().count("spliced to it") for k in (1, 2)) == 2
        publish_parts(rabbitmq, q, 0, 3000)
        assert cs[2].wait_count(50, 60), cs[2].errors  # mid-stream
        d = rs.daemons[victim]
        lost_at = time.monotonic()
        d.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        d.proc.wait(30)
        new_owner = rs.peers.index(owner_of(q, [p for i, p in enumerate(rs.peers) if i != victim]))
        rs.daemons[new_owner].wait_for(re.escape(f"replica {rs.peers[victim]} is"), 10)
        moved_in = time.monotonic() - lost_at
        assert moved_in < 5, f"ownership moved after {moved_in:.1f} s"
        publish_parts(rabbitmq, q, 3000, 3300)
        for k in range(3):
            assert cs[k].wait_set(expected(k, 0, 3300), 90), f"consumer {k}: {cs[k].count()}; {cs[k].errors}"
        lost = [k for k in range(3) if cs[k].reconnects or cs[k].errors]
        assert victim in lost  # (and, with the owner, the two spliced to it)
        others = [i for i in range(3) if i != victim]
        ups = {i: rs.daemons[i].log().count(f"replica {rs.peers[victim]} is up") for i in others}
        rs.start(victim)
        for i in others:
            rs.daemons[i].wait_for(rf"(?s)(?:replica {re.escape(rs.peers[victim])} is up.*){{{ups[i] + 1}}}", 30)
        publish_parts(rabbitmq, q, 3300, 3600)
        for k in range(3):
            assert cs[k].wait_set(expected(k, 0, 3600), 90), f"consumer {k}: {cs[k].count()}; {cs[k].errors}"
        time.sleep(0.5)
        for k, c in enumerate(cs):
            assert set(c.got) == expected(k, 0, 3600), f"consumer {k}"
        duplicates = sum(len(c.got) - len(set(c.got)) for c in cs)
        print(f"{how} {who}: ownership moved after {moved_in:.3f} s; connections lost: consumers {lost}; "
              f"{duplicates} duplicates (at least once allows them)")
    finally:
        for c in cs:
            c.stopping.set()
        for c in cs:
            c.join(10)
