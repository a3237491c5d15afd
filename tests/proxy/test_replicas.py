"""Replicas (`[replicas]`): three `broker-filter serve` processes in front of one RabbitMQ queue,
consumers with disjoint selectors spread over them.  Only the queue's owner consumes from RabbitMQ;
the others serve their links through it; when the owner is killed or drains, another replica owns
the queue and every consumer still gets exactly its own messages (a message may come twice around
the failover, never not at all); a restarted replica takes its queues back."""

from __future__ import annotations

import re
import signal
import time
import uuid

import pytest

from launcher import metric_value, scrape
from replicas import (Consumer, Forwarder, ReplicaSet, all_arrive, expected, no_more_arrive, no_traceback,
                      publish_parts, start_consumers, stop_everything, wait_consumers)

from broker_filter.proxy.replicas import owner_of

pytestmark = [pytest.mark.rabbitmq, pytest.mark.broker_agnostic]

N = 3


@pytest.fixture
def replica_set(rabbitmq):
    rs = ReplicaSet(rabbitmq, N)
    rs.start_all()
    yield rs
    for log in rs.stop_all():
        assert "Traceback" not in log, log


def fresh() -> tuple[str, str]:
    name = f"replicas-{uuid.uuid4().hex[:10]}"
    return name, f"/queue/{name}"


def test_one_owner_serves_every_replica_exact_sets_and_no_moves(rabbitmq, replica_set):
    rs = replica_set
    name, q = fresh()
    owner = rs.peers.index(owner_of(q, rs.peers))
    cs = start_consumers(rs, q)
    try:
        publish_parts(rabbitmq, q, 0, 900)
        for k, c in enumerate(cs):
            assert c.wait_count(300, 60), f"consumer {k}: {c.count()} of 300; {c.errors}"
        # only the owner consumes from the queue; the others' links go through it
        assert wait_consumers(name, 1) == 1
        time.sleep(0.5)  # extras would show here
        for k, c in enumerate(cs):
            assert sorted(c.got) == sorted(expected(k, 0, 900)), f"consumer {k}"
            assert c.reconnects == 0, c.errors
        changes = "\n".join(line for d in rs.daemons for line in d.log().splitlines()
                             if " is gone" in line or " move " in line or "draining" in line)
        for i, port in enumerate(rs.metrics_ports):
            text = scrape(port)
            assert metric_value(text, "broker_filter_messages_handed_back", address=q) == 0, changes
            received = metric_value(text, "broker_filter_messages_received_total", address=q)
            if i == owner:
                assert received >= 900, changes  # every message of the queue, once
            else:  # only its own consumer's matches crossed from the owner
                assert received == 300, f"replica {i} received {received}; {changes}"
    finally:
        for c in cs:
            c.stopping.set()


@pytest.mark.parametrize("how,who", [("kill", "owner"), ("term", "owner"), ("kill", "other"), ("term", "other")])
def test_replica_lost_mid_stream_nothing_lost_and_it_rejoins(rabbitmq, replica_set, how, who):
    rs = replica_set
    name, q = fresh()
    owner = rs.peers.index(owner_of(q, rs.peers))
    victim = owner if who == "owner" else (owner + 1) % N  # else: one serving its link through the owner
    others = [i for i in range(N) if i != victim]
    cs = start_consumers(rs, q)
    try:
        publish_parts(rabbitmq, q, 0, 3000)
        assert cs[others[0]].wait_count(50, 60)  # mid-stream
        d = rs.daemons[victim]
        lost_at = time.monotonic()
        if how == "kill":
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait(10)
        else:
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(30) == 0
        new_owner = rs.peers.index(owner_of(q, [p for i, p in enumerate(rs.peers) if i != victim]))
        # the owner of the queue among the rest (a new one if the owner went) sees the replica gone
        # within 5 s, and serves the queue from then on
        rs.daemons[new_owner].wait_for(re.escape(f"replica {rs.peers[victim]} is"), 10)
        moved_in = time.monotonic() - lost_at
        publish_parts(rabbitmq, q, 3000, 3300)
        for k in others:  # the other consumers keep receiving, through the new owner
            assert cs[k].wait_set(expected(k, 0, 3300), 90), f"consumer {k}: {cs[k].count()}; {cs[k].errors}"
        # the lost replica's consumer moved to another replica and got its own too
        assert cs[victim].wait_set(expected(victim, 0, 3300), 90), cs[victim].errors
        assert wait_consumers(name, 1) == 1
        for k, c in enumerate(cs):
            got = set(c.got)
            assert got == expected(k, 0, 3300), f"consumer {k}: missing {sorted(expected(k, 0, 3300) - got)[:10]}, " \
                                                f"foreign {sorted(got - expected(k, 0, 3300))[:10]}"
        print(f"{how} {who}: the owner saw the replica gone after {moved_in:.3f} s")
        assert moved_in < 5, f"ownership moved after {moved_in:.1f} s"

        # the lost replica comes back on its port: the others see it (and the owner owns the queue again)
        ups = {i: rs.daemons[i].log().count(f"replica {rs.peers[victim]} is up") for i in others}
        rs.start(victim)
        for i in others:
            rs.daemons[i].wait_for(rf"(?s)(?:replica {re.escape(rs.peers[victim])} is up.*){{{ups[i] + 1}}}", 30)
        publish_parts(rabbitmq, q, 3300, 3600)
        all_arrive(cs, 3600, 90)
        assert wait_consumers(name, 1) == 1
        time.sleep(0.5)
        for k, c in enumerate(cs):
            got = set(c.got)
            assert got == expected(k, 0, 3600), f"consumer {k}"
            assert all(b % N == k for b in c.got)
        # the queue's messages come through its owner
        text = scrape(rs.metrics_ports[owner])
        assert metric_value(text, "broker_filter_messages_received_total", address=q) >= 300
    finally:
        for c in cs:
            c.stopping.set()


def third_through_a_forwarder(rabbitmq: str, port: int) -> tuple[Forwarder, ReplicaSet]:
    """N replicas (not started), replica 2's upstream through a forwarder the test can close."""
    forwarder = Forwarder("127.0.0.1", port)
    forwarder.start()
    user = rabbitmq.split("://", 1)[1].rsplit("@", 1)[0]
    return forwarder, ReplicaSet(rabbitmq, N, upstreams=[rabbitmq, rabbitmq, f"amqp://{user}@127.0.0.1:{forwarder.port}"])


def queue_owned_by(rs: ReplicaSet, i: int) -> tuple[str, str]:
    """A fresh queue (name, address) whose owner is replica i."""
    while True:
        name, q = fresh()
        if owner_of(q, rs.peers) == rs.peers[i]:
            return name, q


def count_in_log(d, text: str) -> int:
    return d.log().count(text)


def wait_more(d, text: str, than: int, timeout: float = 30) -> None:
    """Until `text` is in the daemon's log more than `than` times."""
    d.wait_for(rf"(?s)(?:{re.escape(text)}.*){{{than + 1}}}", timeout)


def test_replica_without_its_upstream_owns_nothing_until_it_is_back(rabbitmq, rabbitmq_broker):
    """The owner's own RabbitMQ connection goes (its forwarder closes): it closes its peer
    connections, the others take the queue; back, it owns it again."""
    forwarder, rs = third_through_a_forwarder(rabbitmq, rabbitmq_broker.port)
    cs: list[Consumer] = []
    try:
        rs.start_all()
        name, q = queue_owned_by(rs, 2)
        cs = start_consumers(rs, q)
        publish_parts(rabbitmq, q, 0, 600)
        all_arrive(cs, 600, 60)
        assert wait_consumers(name, 1) == 1

        gone = {i: count_in_log(rs.daemons[i], f"replica {rs.peers[2]} is gone") for i in (0, 1)}
        forwarder.close()
        for i in (0, 1):
            wait_more(rs.daemons[i], f"replica {rs.peers[2]} is gone", gone[i])
        publish_parts(rabbitmq, q, 600, 1200)
        for k, c in enumerate(cs):  # consumer 2's links were closed by its replica: it went to replica 0
            assert c.wait_set(expected(k, 0, 1200), 60), f"consumer {k}: {c.count()}; {c.errors}"
        assert wait_consumers(name, 1) == 1
        assert "is not connected" in rs.daemons[0].log() + rs.daemons[1].log()  # it refused them meanwhile

        ups = {i: count_in_log(rs.daemons[i], f"replica {rs.peers[2]} is up") for i in (0, 1)}
        forwarder = Forwarder("127.0.0.1", rabbitmq_broker.port, forwarder.port)
        forwarder.start()
        for i in (0, 1):
            wait_more(rs.daemons[i], f"replica {rs.peers[2]} is up", ups[i])
        publish_parts(rabbitmq, q, 1200, 1500)
        all_arrive(cs, 1500, 60)
        assert wait_consumers(name, 1) == 1
        no_more_arrive(cs, 1500)
        received = metric_value(scrape(rs.metrics_ports[2]), "broker_filter_messages_received_total", address=q)
        assert received >= 300  # the last messages came through it
    finally:
        logs = stop_everything(cs, rs, forwarder)
    no_traceback(logs)


def test_a_replica_losing_its_upstream_keeps_the_links_it_serves_through_the_owner(rabbitmq, rabbitmq_broker):
    """Replica 2's own RabbitMQ connection goes while a queue replica 0 owns is consumed on every
    replica: replica 2's consumer is served through the owner, which still has its upstream, so
    its link stays attached (no reconnect) and every message arrives, exactly its set."""
    forwarder, rs = third_through_a_forwarder(rabbitmq, rabbitmq_broker.port)
    cs: list[Consumer] = []
    try:
        rs.start_all()
        name, q = queue_owned_by(rs, 0)
        cs = start_consumers(rs, q)
        publish_parts(rabbitmq, q, 0, 300)
        all_arrive(cs, 300, 60)
        forwarder.close()
        rs.daemons[2].wait_for(r"connection lost", 30)
        publish_parts(rabbitmq, q, 300, 900)
        all_arrive(cs, 900, 60)
        assert cs[2].reconnects == 0, cs[2].errors
        no_more_arrive(cs, 900)
        assert wait_consumers(name, 1) == 1
    finally:
        logs = stop_everything(cs, rs, forwarder)
    no_traceback(logs)


def test_replicas_log_in_with_replicas_user_and_password_alone(rabbitmq):
    """No `[listener.users]` and no hash anywhere in the configuration: each replica's listener takes
    the replicas' login from `replicas.user` and `replicas.password` (hashed at start), so the two
    log in to each other, the non-owner's consumer is served through the owner (one consumer on
    RabbitMQ), and a client with another password is refused."""
    from proton import ConnectionException
    from proton.utils import BlockingConnection

    from replicas import replica_config

    login = ("replica", uuid.uuid4().hex)
    rs = ReplicaSet(rabbitmq, 2, login=login, hashed=False)
    text = replica_config(rs.peers, rs.peers[0], login=login, hashed=False)
    assert "[listener.users]" not in text and "$" not in text
    cs: list[Consumer] = []
    try:
        rs.start_all()  # each waits until it sees the other: they logged in to each other
        name, q = fresh()
        cs = start_consumers(rs, q)
        publish_parts(rabbitmq, q, 0, 400, n=2)
        for k, c in enumerate(cs):
            assert c.wait_set(expected(k, 0, 400, n=2), 60), f"consumer {k}: {c.count()}; {c.errors}"
        assert wait_consumers(name, 1) == 1  # only the owner consumes: the other's link went through it
        for i in range(2):
            with pytest.raises(ConnectionException):
                BlockingConnection(f"amqp://{login[0]}:wrong@{rs.peers[i]}", timeout=10,
                                   allowed_mechs="PLAIN").close()
    finally:
        for c in cs:
            c.stopping.set()
        logs = rs.stop_all()
    no_traceback(logs)
