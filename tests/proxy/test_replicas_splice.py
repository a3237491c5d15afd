"""Replicas with `replicas.splice`: a client connection that attaches first to a queue another
replica owns, with its open (pipelined), goes whole to the owner at the byte level; the owner
serves it as if the client had connected there, and the replica it landed on only copies bytes.
A client that waits for the open's answer before attaching is served through the owner, as
without the setting.  The spliced connection ends with its owner (as after a redirect): the client
reconnects, and gets every message of its own (at least once)."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from proton import Message

from clients import publish_many
from launcher import metric_value, scrape
from replicas import Consumer, PipelinedConsumer, ReplicaSet, expected

from broker_filter.proxy.replicas import owner_of

pytestmark = pytest.mark.rabbitmq

PARTS = 3


@pytest.fixture
def pair(rabbitmq):
    rs = ReplicaSet(rabbitmq, 2, splice=True)
    rs.start_all()
    yield rs
    for log in rs.stop_all():
        assert "Traceback" not in log, log


def queue_owned_by(rs: ReplicaSet, i: int) -> tuple[str, str]:
    while True:
        name = f"splice-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        if owner_of(q, rs.peers) == rs.peers[i]:
            return name, q


def publish(upstream: str, q: str, start: int, stop: int) -> None:
    publish_many(upstream, q, [Message(body=i, properties={"part": i % PARTS}) for i in range(start, stop)])


def received(rs: ReplicaSet, i: int, q: str) -> float:
    return metric_value(scrape(rs.metrics_ports[i]), "broker_filter_messages_received_total", address=q)


def test_a_pipelined_client_on_a_non_owner_is_spliced_to_the_owner(rabbitmq, pair):
    rs = pair
    name, q = queue_owned_by(rs, 0)
    spliced = PipelinedConsumer([rs.url(1)], q, "part = 1")
    waiting = Consumer([rs.url(1)], q, "part = 2")  # attaches once its open is answered: the hop
    try:
        for c in (spliced, waiting):
            c.start()
            assert c.attached.wait(30), c.errors
        publish(rabbitmq, q, 0, 600)
        assert spliced.wait_set(expected(1, 0, 600), 60), f"{spliced.count()}; {spliced.errors}"
        assert waiting.wait_set(expected(2, 0, 600), 60), f"{waiting.count()}; {waiting.errors}"
        time.sleep(0.5)  # extras would show here
        assert sorted(spliced.got) == sorted(expected(1, 0, 600))
        assert sorted(waiting.got) == sorted(expected(2, 0, 600))
        assert spliced.reconnects == 0 and waiting.reconnects == 0, (spliced.errors, waiting.errors)
        log1 = rs.daemons[1].log()
        assert log1.count("spliced to it") == 1, log1[-3000:]
        # replica 1 received only the waiting client's matches from the owner; the spliced
        # connection's never crossed its proxy, only its bytes
        assert received(rs, 1, q) == 200
        assert received(rs, 0, q) >= 600
    finally:
        for c in (spliced, waiting):
            c.stopping.set()
        for c in (spliced, waiting):
            c.join(10)


@pytest.mark.parametrize("how", ["kill", "term"])
def test_a_spliced_connection_ends_with_its_owner_and_the_client_gets_all_its_messages(rabbitmq, pair, how):
    rs = pair
    name, q = queue_owned_by(rs, 0)
    spliced = PipelinedConsumer([rs.url(1)], q, "part = 1", credit=10)
    try:
        spliced.start()
        assert spliced.attached.wait(30), spliced.errors
        publish(rabbitmq, q, 0, 1500)
        assert spliced.wait_count(30, 60), spliced.errors  # mid-stream
        owner = rs.daemons[0]
        owner.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        owner.proc.wait(30)
        # its connection went with the owner; it connects again (to replica 1, the owner now)
        publish(rabbitmq, q, 1500, 1800)
        assert spliced.wait_set(expected(1, 0, 1800), 90), f"{spliced.count()}; {spliced.errors}; reconnects {spliced.reconnects}; {rs.daemons[1].log()[-4000:]}"
        assert spliced.reconnects >= 1
        assert set(spliced.got) == expected(1, 0, 1800)
        duplicates = len(spliced.got) - len(set(spliced.got))
        print(f"{how}: {duplicates} duplicates after the owner went (at least once allows them)")
    finally:
        spliced.stopping.set()
        spliced.join(10)
