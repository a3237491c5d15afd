"""One upstream subscription per topic address, through the daemon, on RabbitMQ 3.10 and 4.0 with real
clients: exact sets per link with mixed filters while RabbitMQ holds ONE subscription queue (with one
consumer) for N links, its consumer gone once the last link leaves; a slow link (no credit) does not stop the
others and gets its messages later; a client process killed with SIGKILL does not lose the others'
messages; a property test (random filter sets and messages) on the daemon."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from proton import Message

from clients import connect, receive_n_and_extras, receive_until_quiet, receiver, send_messages
from launcher import Daemon
from rabbitmq_nodes import bound_queues, rabbitmqctl
from fanout_checks import INDEX_SETTINGS, check_exact_sets, serve_with_index, messages, selected, wait_until

HERE = Path(__file__).parent
WINDOW = 8  # the daemon's upstream window: also each link's buffer in a shared subscription

pytestmark = pytest.mark.rabbitmq


@pytest.fixture(scope="module")
def fanout_daemon(rabbitmq):
    p = Daemon("--set", f"limits.upstream_window={WINDOW}", upstream=rabbitmq)
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


def subscription_queues(topic: str) -> list[str]:
    """The queues bound to amq.topic under `topic`: one per upstream subscription on /topic/<topic>."""
    return bound_queues(None, "amq.topic", topic)


def consumers(queues: list[str]) -> int:
    out = rabbitmqctl("list_queues", "-q", "name", "consumers").stdout
    return sum(int(cols[1]) for cols in (line.split("\t") for line in out.splitlines())
               if len(cols) == 2 and cols[0] in queues and cols[1].isdigit())


def ended(topic: str, queues: list[str]) -> bool:
    """The daemon's upstream subscriptions on `topic` ended: no consumer is left on their queues.
    (RabbitMQ 3.10 and 4.0 both keep a v1 `/topic/` subscription queue, non-exclusive and not
    auto-delete, after its link detaches, for a direct client too: the daemon leaves one queue per
    shared subscription where direct clients leave one per receiver.)"""
    return consumers(queues) == 0 and set(subscription_queues(topic)) <= set(queues)


MIXED = [None, "customer = 'c1'", "customer = 'c1'", "customer IN ('c2', 'c3')", "customer LIKE 'c4%'",
         "k > 3 AND customer <> 'c0'", "customer = 'c5' OR k = 0"]


def test_mixed_filters_exact_sets_one_upstream_subscription_gone_with_the_last_link(fanout_daemon):
    topic = f"fan{uuid.uuid4().hex[:10]}"
    conns = [connect(fanout_daemon.url) for _ in range(3)]
    try:
        rcvs = [receiver(conns[j % 3], f"/topic/{topic}", credit=100, selector=s) for j, s in enumerate(MIXED)]
        assert wait_until(lambda: len(subscription_queues(topic)) == 1, 10)
        queues = subscription_queues(topic)
        assert len(queues) == 1 and consumers(queues) == 1, queues  # ONE for seven links
        msgs = messages(60)
        send_messages(conns[0].create_sender(f"/topic/{topic}"), msgs)
        for r, s in zip(rcvs, MIXED):
            want = selected(s, msgs)
            got = [m.body for m in receive_until_quiet(r, at_most=len(want), idle=5, limit=30)]
            got += [m.body for m in receive_until_quiet(r, idle=0.3, limit=2)]
            assert got == want, f"{s!r}: got {got}, expected {want}"
        # links leave one by one: the subscription stays while one is left, then goes
        for r in rcvs[:-1]:
            r.close()
        time.sleep(0.5)
        assert subscription_queues(topic) == queues and consumers(queues) == 1
        rcvs[-1].close()
        assert wait_until(lambda: ended(topic, queues), 20), subscription_queues(topic)
    finally:
        for c in conns:
            c.close()


def test_a_slow_link_does_not_stop_the_others_and_gets_its_messages_later(fanout_daemon, request):
    topic = f"fan{uuid.uuid4().hex[:10]}"
    conns = [connect(fanout_daemon.url) for _ in range(3)]
    try:
        slow = receiver(conns[0], f"/topic/{topic}", credit=0, selector="k >= 0")
        fast = receiver(conns[1], f"/topic/{topic}", credit=200, selector="k >= 0")
        assert wait_until(lambda: len(subscription_queues(topic)) == 1, 10)
        n = 6 * WINDOW
        msgs = [Message(id=f"m{i}", body=i, properties={"k": i}) for i in range(n)]
        snd = conns[2].create_sender(f"/topic/{topic}")
        send_messages(snd, msgs)
        got = [m.body for m in receive_until_quiet(fast, at_most=n, idle=5, limit=30)]
        assert got == list(range(n))  # the slow link held nobody back
        # the slow link left the shared subscription for one of its own, with what it had not received
        assert wait_until(lambda: len(subscription_queues(topic)) == 2, 10)
        # its own subscription takes over once the shared one reaches the first message both have:
        # that takes one more publish
        send_messages(snd, [Message(id="marker", body=n, properties={"k": n})])
        assert [m.body for m in receive_until_quiet(fast, at_most=1, idle=5)] == [n]
        late = [m.body for m in receive_n_and_extras(slow, n + 1, limit=60)]
        assert late == list(range(n + 1))  # nothing lost, nothing twice, in order
        # messages published now reach both, once each
        more = [Message(id=f"x{i}", body=1000 + i, properties={"k": i}) for i in range(5)]
        send_messages(snd, more)
        assert [m.body for m in receive_until_quiet(fast, at_most=5, idle=5)] == [1000 + i for i in range(5)]
        assert [m.body for m in receive_n_and_extras(slow, 5, limit=20)] == [1000 + i for i in range(5)]
        assert consumers(subscription_queues(topic)) == 2
        queues = subscription_queues(topic)
        declared = request.node.callspec.id.startswith("rabbitmq4")
        if declared:  # in front of RabbitMQ 4 both are queues the daemon declared ...
            assert all(q.startswith("broker-filter.subscription.") for q in queues), queues
        slow.close()
        fast.close()
        assert wait_until(lambda: ended(topic, queues), 20), subscription_queues(topic)
        if declared:  # ... and deleted: none is left behind
            assert wait_until(lambda: not subscription_queues(topic), 20), subscription_queues(topic)
    finally:
        for c in conns:
            c.close()


def test_a_killed_client_does_not_lose_the_others_messages(fanout_daemon):
    topic = f"fan{uuid.uuid4().hex[:10]}"
    killed = subprocess.Popen([sys.executable, str(HERE / "killed_client.py"), fanout_daemon.url, f"/topic/{topic}",
                               "k >= 0", "4", "1"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    conns = [connect(fanout_daemon.url) for _ in range(2)]
    try:
        others = [receiver(conns[0], f"/topic/{topic}", credit=100, selector="k >= 0"),
                  receiver(conns[0], f"/topic/{topic}", credit=100, selector="k < 10")]
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "attached" not in lines:  # (its attach answered: one subscription for all three)
            lines.append(killed.stdout.readline().strip())
        assert "attached" in lines, lines
        assert wait_until(lambda: consumers(subscription_queues(topic)) == 1, 15)
        snd = conns[1].create_sender(f"/topic/{topic}")
        send_messages(snd, [Message(id=f"m{i}", body=i, properties={"k": i}) for i in range(20)])
        while time.monotonic() < deadline and "ready" not in lines:
            lines.append(killed.stdout.readline().strip())
        assert "ready" in lines, lines
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        send_messages(snd, [Message(id=f"m{i}", body=i, properties={"k": i}) for i in range(20, 30)])
        got0 = [m.body for m in receive_until_quiet(others[0], at_most=30, idle=5, limit=30)]
        got1 = [m.body for m in receive_n_and_extras(others[1], 10, limit=20)]
        assert got0 == list(range(30))
        assert got1 == list(range(10))
        assert len(subscription_queues(topic)) == 1
    finally:
        if killed.poll() is None:
            killed.kill()
        for c in conns:
            c.close()


@pytest.fixture(scope="module", params=list(INDEX_SETTINGS.values()), ids=list(INDEX_SETTINGS))
def index_daemon(request, rabbitmq):
    """A daemon on the broker of this run with the shared subscriptions' index and cache on or off."""
    yield from serve_with_index(request.param, upstream=rabbitmq)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000))
def test_property_links_receive_exactly_what_their_filter_selects(index_daemon, seed):
    topic = f"fan{uuid.uuid4().hex[:10]}"
    check_exact_sets(index_daemon.url, f"/topic/{topic}", seed, lambda: len(subscription_queues(topic)))


def test_rhea_and_proton_links_share_one_upstream_subscription(fanout_daemon):
    """rhea receivers (each in its own node process) and a proton receiver on one /topic/ address:
    one upstream subscription, each gets exactly what its filter selects."""
    node = shutil.which("node")
    js = HERE.parent / "js"
    if node is None or not (js / "node_modules" / "rhea").is_dir():
        pytest.fail("node and rhea are required (scripts/setup.sh installs them)")
    topic = f"fan{uuid.uuid4().hex[:10]}"
    msgs = messages(40, seed=7)
    rhea_selectors = ["customer = 'c1'", "customer IN ('c2', 'c3')", "customer LIKE 'c4%'", "k > 4"]
    procs = [subprocess.Popen([node, str(js / "receive.js"), str(fanout_daemon.port), f"/topic/{topic}", s,
                               str(len(selected(s, msgs))), "20000"], stdout=subprocess.PIPE, text=True)
             for s in rhea_selectors]
    conn = connect(fanout_daemon.url)
    try:
        for p in procs:
            assert "attached" in json.loads(p.stdout.readline())
        mine = receiver(conn, f"/topic/{topic}", credit=100, selector="customer = 'c5'")
        queues = subscription_queues(topic)
        assert len(queues) == 1 and consumers(queues) == 1, queues
        send_messages(conn.create_sender(f"/topic/{topic}"), msgs)
        for p, s in zip(procs, rhea_selectors):
            out, _ = p.communicate(timeout=30)
            got = [json.loads(line)["message"]["body"] for line in out.splitlines() if '"message"' in line]
            assert got == selected(s, msgs), s
        want = selected("customer = 'c5'", msgs)
        assert [m.body for m in receive_until_quiet(mine, at_most=len(want), idle=5)] == want
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        conn.close()
