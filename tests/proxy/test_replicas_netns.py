"""Replicas on three hosts: each `broker-filter serve` in a network namespace of its own (made and
removed here), with its own address on a bridge in this namespace, reaching the others over it.
RabbitMQ listens on this host's 127.0.0.1 only, so a small TCP forwarder here, on the bridge's
address, carries each replica's upstream connection to it.  Root only (ip netns)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from replicas import (Consumer, Forwarder, PipelinedConsumer, ReplicaSet, all_arrive, no_more_arrive, no_traceback,
                      publish_parts, start_consumers, stop_everything, wait_consumers)

from broker_filter.proxy.replicas import owner_of

pytestmark = [pytest.mark.rabbitmq, pytest.mark.broker_agnostic,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (ip netns add)")]

N = 3
NET = "169.254.77"  # link-local: these addresses exist only on the bridge and in the namespaces made here


def ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@pytest.fixture
def namespaces():
    """N namespaces on a bridge: (bridge address, [namespace, ...], [its address, ...])."""
    tag = uuid.uuid4().hex[:6]
    bridge = f"bfb{tag}"
    names = [f"bf-{tag}-{i}" for i in range(N)]
    made: list[str] = []
    try:
        try:
            ip("link", "add", bridge, "type", "bridge")
        except RuntimeError as e:
            if "not permitted" in str(e):
                pytest.skip(f"this machine does not let the tests make network devices: {e}")
            raise
        ip("addr", "add", f"{NET}.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        addrs = []
        for i, ns in enumerate(names):
            ip("netns", "add", ns)
            made.append(ns)
            host_end, ns_end = f"bfh{tag}{i}", f"bfn{tag}{i}"
            ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            ip("link", "set", ns_end, "netns", ns)
            ip("link", "set", host_end, "master", bridge)
            ip("link", "set", host_end, "up")
            addr = f"{NET}.{10 + i}"
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ns_end)
            ip("-n", ns, "link", "set", ns_end, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            addrs.append(addr)
        yield f"{NET}.1", names, addrs
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)  # its veth goes too
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


def netns_replicas(rabbitmq_broker, namespaces, **options) -> tuple[Forwarder, ReplicaSet]:
    """The forwarder to RabbitMQ on the bridge (started), and N replicas (not started), replica i in
    namespace i, logging in with PLAIN (not loopback: for clients and replicas alike)."""
    gateway, names, addrs = namespaces
    forwarder = Forwarder(gateway, rabbitmq_broker.port)
    forwarder.start()
    rs = ReplicaSet(f"amqp://guest:guest@{gateway}:{forwarder.port}", N, hosts=addrs,
                    program_prefix=[["ip", "netns", "exec", ns] for ns in names],
                    login=("replica", uuid.uuid4().hex), **options)
    return forwarder, rs


def kill_the_owner(rabbitmq_broker, rs: ReplicaSet, q: str, owner: int, cs: list, start: int, stop: int) -> None:
    """The owner's host dies (its process, SIGKILL): the new owner sees it gone within 10 s, and the
    consumers get messages start..stop-1 published after it, only the new owner consuming."""
    d = rs.daemons[owner]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    rest = [p for i, p in enumerate(rs.peers) if i != owner]
    new_owner = rs.peers.index(owner_of(q, rest))
    rs.daemons[new_owner].wait_for(re.escape(f"replica {rs.peers[owner]} is gone"), 10)
    publish_parts(rabbitmq_broker.url, q, start, stop)
    all_arrive(cs, stop, 90)
    assert wait_consumers(q.rsplit("/", 1)[1], 1) == 1


def test_replicas_in_three_namespaces_one_owner_failover_and_rejoin(rabbitmq_broker, namespaces):
    forwarder, rs = netns_replicas(rabbitmq_broker, namespaces)
    cs: list[Consumer] = []
    try:
        rs.start_all()
        name = f"replicas-ns-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        owner = rs.peers.index(owner_of(q, rs.peers))
        cs = start_consumers(rs, q)
        publish_parts(rabbitmq_broker.url, q, 0, 1500)
        all_arrive(cs, 1500, 60)
        assert wait_consumers(name, 1) == 1  # only the owner consumes from the queue

        kill_the_owner(rabbitmq_broker, rs, q, owner, cs, 1500, 1800)  # the others take over

        # it comes back and owns the queue again
        ups = {i: rs.daemons[i].log().count(f"replica {rs.peers[owner]} is up") for i in range(N) if i != owner}
        rs.start(owner)
        for i, n in ups.items():
            rs.daemons[i].wait_for(rf"(?s)(?:replica {re.escape(rs.peers[owner])} is up.*){{{n + 1}}}", 30)
        publish_parts(rabbitmq_broker.url, q, 1800, 2100)
        all_arrive(cs, 2100, 90)
        assert wait_consumers(name, 1) == 1
        no_more_arrive(cs, 2100)
    finally:
        logs = stop_everything(cs, rs, forwarder)
    no_traceback(logs)


def test_spliced_replicas_in_three_namespaces_the_owner_killed(rabbitmq_broker, namespaces):
    """`replicas.splice` across hosts: consumer k (attaching with its open) on replica k; the two on
    non-owners are spliced to the owner's address in its namespace, logged in with the replicas'
    PLAIN user.  The owner's host dies: the connections spliced to it end, their clients connect
    again (to the next replica of their list), and every consumer gets every message of its own."""
    forwarder, rs = netns_replicas(rabbitmq_broker, namespaces, splice=True)
    cs: list[PipelinedConsumer] = []
    try:
        rs.start_all()
        name = f"replicas-ns-splice-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        owner = rs.peers.index(owner_of(q, rs.peers))
        cs = [PipelinedConsumer([rs.url((k + i) % N) for i in range(N)], q, f"part = {k}") for k in range(N)]
        for c in cs:
            c.start()
        for c in cs:
            assert c.attached.wait(30), c.errors
        spliced = [rs.daemons[i].log().count("spliced to it") for i in range(N)]
        assert spliced == [0 if i == owner else 1 for i in range(N)], spliced
        publish_parts(rabbitmq_broker.url, q, 0, 900)
        all_arrive(cs, 900, 60)
        assert wait_consumers(name, 1) == 1  # only the owner consumes from the queue

        kill_the_owner(rabbitmq_broker, rs, q, owner, cs, 900, 1200)
        assert all(c.reconnects >= 1 or c.errors for c in cs)  # every connection went with the owner
    finally:
        logs = stop_everything(cs, rs, forwarder)
        for c in cs:
            c.join(10)
    no_traceback(logs)


def test_partition_between_replicas_both_sides_consume_nothing_lost_then_one_owner_again(rabbitmq_broker,
                                                                                          namespaces):
    """The owner cut off from the other two replicas (blackhole routes both ways; every replica still
    reaches RabbitMQ and the clients): after the heartbeat each side owns the queue, both consume
    from it, and every consumer still gets exactly its messages; healed, one owner again."""
    _, names, addrs = namespaces
    forwarder, rs = netns_replicas(rabbitmq_broker, namespaces, heartbeat=2.0)
    cs: list[Consumer] = []
    cut: list[tuple[str, str]] = []
    try:
        rs.start_all()
        name = f"replicas-part-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        owner = rs.peers.index(owner_of(q, rs.peers))
        others = [i for i in range(N) if i != owner]
        cs = start_consumers(rs, q, moving=False)  # each stays on its replica
        publish_parts(rabbitmq_broker.url, q, 0, 600)
        all_arrive(cs, 600, 60)
        assert wait_consumers(name, 1) == 1

        gone = {i: rs.daemons[i].log().count(" is gone") for i in range(N)}
        for i in others:  # cut the owner off from the others, both ways
            cut += [(names[owner], addrs[i]), (names[i], addrs[owner])]
        for ns, addr in cut:
            ip("-n", ns, "route", "add", "blackhole", f"{addr}/32")
        for i in range(N):  # each side sees the other gone after the heartbeat (2 s)
            want = gone[i] + (2 if i == owner else 1)
            rs.daemons[i].wait_for(rf"(?s)(?:is gone.*){{{want}}}", 30)
        assert wait_consumers(name, 2) == 2  # both sides own the queue now
        publish_parts(rabbitmq_broker.url, q, 600, 1200)
        all_arrive(cs, 1200, 90)

        ups = {i: rs.daemons[i].log().count(" is up") for i in range(N)}
        for ns, addr in cut:
            ip("-n", ns, "route", "del", "blackhole", f"{addr}/32")
        cut = []
        for i in range(N):
            want = ups[i] + (2 if i == owner else 1)
            rs.daemons[i].wait_for(rf"(?s)(?:is up.*){{{want}}}", 30)
        assert wait_consumers(name, 1) == 1  # one owner again
        publish_parts(rabbitmq_broker.url, q, 1200, 1500)
        all_arrive(cs, 1500, 90)
        no_more_arrive(cs, 1500)
        for c in cs:
            assert c.reconnects == 0, c.errors
    finally:
        for ns, addr in cut:
            subprocess.run(["ip", "-n", ns, "route", "del", "blackhole", f"{addr}/32"], capture_output=True)
        logs = stop_everything(cs, rs, forwarder)
    no_traceback(logs)


def write_hosts(names: list[str], addrs: list[str]) -> None:
    """What `bf-replicas` resolves to in each namespace (`ip netns exec` mounts /etc/netns/NS/hosts
    over /etc/hosts)."""
    for ns in names:
        folder = Path("/etc/netns") / ns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} bf-replicas\n" for a in addrs))


def test_replicas_named_by_dns_one_owner_failover_and_scale_in(rabbitmq_broker, namespaces):
    """`replicas.dns`: every replica finds the others by resolving one name (as a Kubernetes headless
    Service's), all on one port; the owner killed, the others take over; the name no longer
    resolving to it, they drop it."""
    _, names, addrs = namespaces
    write_hosts(names, addrs)
    forwarder, rs = netns_replicas(rabbitmq_broker, namespaces, dns="bf-replicas")
    cs: list[Consumer] = []
    try:
        rs.start_all()
        for d in rs.daemons:
            assert "replicas.dns bf-replicas" in d.log()
        name = f"replicas-dns-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        owner = rs.peers.index(owner_of(q, rs.peers))
        cs = start_consumers(rs, q)
        publish_parts(rabbitmq_broker.url, q, 0, 900)
        all_arrive(cs, 900, 60)
        assert wait_consumers(name, 1) == 1

        d = rs.daemons[owner]
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        rest = [i for i in range(N) if i != owner]
        for i in rest:
            rs.daemons[i].wait_for(re.escape(f"replica {rs.peers[owner]} is gone"), 10)
        publish_parts(rabbitmq_broker.url, q, 900, 1200)
        all_arrive(cs, 1200, 90)
        assert wait_consumers(name, 1) == 1

        write_hosts(names, [a for i, a in enumerate(addrs) if i != owner])  # scaled in
        for i in rest:
            rs.daemons[i].wait_for(re.escape(f"gone {rs.peers[owner]}"), 20)
        publish_parts(rabbitmq_broker.url, q, 1200, 1500)
        all_arrive(cs, 1500, 90)
        assert wait_consumers(name, 1) == 1
        no_more_arrive(cs, 1500)
    finally:
        logs = stop_everything(cs, rs, forwarder)
        for ns in names:
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    no_traceback(logs)
