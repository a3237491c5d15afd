"""Which client links share an upstream consumer, through the daemon: a conformance matrix.

Address forms (embedded: `multicast://`, `anycast://`, FQQN, a wildcard subscription, capabilities
`topic` / `queue`, address rules; a daemon chained in front of another; RabbitMQ `/topic/`,
`/exchange/`, `/queue/` on RabbitMQ 3.10 and 4.0; RabbitMQ 4's v2 `/queues/` and `/exchanges/`) x receiver pairs (two plain, two with the same selector, two with different
selectors, one plain and one filtered), each receiver on its own connection.  Every cell asserts the
exact set each receiver gets: on a subscription every receiver gets every message its filter
selects; on a queue the receivers' sets are disjoint, each holds only what its filter selects, and
together they hold every message some receiver selects.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from proton import Message
from proton.reactor import Selector

from clients import Capabilities, bind_queue, connect, declare_queue, receive_until_quiet
from launcher import Daemon

N = 12  # messages per cell: i = 0..11, k = i % 3

RECEIVER_PAIRS = {
    "two-plain": (None, None),
    "same-selector": ("k = 1", "k = 1"),
    "different-selectors": ("k = 1", "k = 2"),
    "plain-and-filtered": (None, "k = 0"),
}


def selects(selector: str | None, i: int) -> bool:
    return selector is None or i % 3 == int(selector.split("=")[1])


class Form:
    """An address form: where receivers attach, where the sender publishes, and what it is."""

    def __init__(self, name: str, receive_at, send_to, subscription: bool, capabilities: tuple = (),
                 prepare=None):
        self.name = name
        self.receive_at = receive_at
        self.send_to = send_to
        self.subscription = subscription
        self.capabilities = capabilities
        self.prepare = prepare  # (broker URL, name): what must exist upstream first


def _declare_and_bind(url: str, name: str) -> None:
    declare_queue(url, name)
    bind_queue(url, name, "amq.topic", name)


EMBEDDED_FORMS = [
    Form("multicast-prefix", lambda n: f"multicast://{n}", lambda n: f"multicast://{n}", True),
    Form("anycast-prefix", lambda n: f"anycast://{n}", lambda n: f"anycast://{n}", False),
    Form("fqqn", lambda n: f"{n}::{n}-q", lambda n: f"{n}::{n}-q", False),
    Form("wildcard", lambda n: f"multicast://{n}.#", lambda n: f"multicast://{n}.sport", True),
    Form("capability-topic", lambda n: n, lambda n: n, True, ("topic",)),
    Form("capability-queue", lambda n: n, lambda n: n, False, ("queue",)),
    Form("rule-multicast", lambda n: f"ruled-multi.{n}", lambda n: f"ruled-multi.{n}", True),
    Form("rule-anycast", lambda n: f"ruled-any.{n}", lambda n: f"ruled-any.{n}", False),
    Form("default-routing", lambda n: n, lambda n: n, False),  # embedded.default_routing_type = anycast
]

CHAINED_FORMS = [
    Form("chained-multicast-prefix", lambda n: f"multicast://{n}", lambda n: f"multicast://{n}", True),
    Form("chained-anycast-prefix", lambda n: f"anycast://{n}", lambda n: f"anycast://{n}", False),
    # A bare name whose routing only the upstream daemon knows (its default is multicast): the
    # upstream's reply (distribution mode copy) tells the proxy it is a subscription.
    Form("chained-upstream-default-multicast", lambda n: n, lambda n: n, True),
]

RABBITMQ_FORMS = [
    Form("rabbitmq-topic", lambda n: f"/topic/{n}", lambda n: f"/topic/{n}", True),
    Form("rabbitmq-exchange", lambda n: f"/exchange/amq.topic/{n}", lambda n: f"/topic/{n}", True),
    Form("rabbitmq-queue", lambda n: f"/queue/{n}", lambda n: f"/queue/{n}", False),
]

# RabbitMQ 4's v2 addresses: a source is a queue that must exist (`/queues/q`); a target is a queue
# or an exchange with a routing key (`/exchanges/x/key`).
RABBITMQ4_FORMS = [
    Form("rabbitmq4-v2-queue", lambda n: f"/queues/{n}", lambda n: f"/queues/{n}", False, prepare=declare_queue),
    Form("rabbitmq4-v2-exchange-to-bound-queue", lambda n: f"/queues/{n}", lambda n: f"/exchanges/amq.topic/{n}",
         False, prepare=_declare_and_bind),
    Form("rabbitmq4-v2-exchange-to-topic", lambda n: f"/topic/{n}", lambda n: f"/exchanges/amq.topic/{n}", True),
]

RULES = """
[[address_rules]]
pattern = "ruled-multi.#"
routing_type = "multicast"

[[address_rules]]
pattern = "ruled-any.#"
routing_type = "anycast"
"""


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharing") / "rules.toml"
    path.write_text(RULES)
    return str(path)


@pytest.fixture(scope="module")
def embedded_daemon(rules_file):
    p = Daemon("--config", rules_file)
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture(scope="module")
def chained_daemon():
    inner = Daemon("--set", "embedded.default_routing_type=multicast")
    outer = Daemon(upstream=inner.url)
    yield outer
    outer.stop()
    inner.stop()
    for p in (outer, inner):
        assert "Traceback" not in p.log(), p.log()


@pytest.fixture(scope="module")
def rabbitmq_daemon(rabbitmq):
    p = Daemon(upstream=rabbitmq)
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


def run_cell(url: str, form: Form, pair: tuple, broker_url: str | None = None) -> None:
    name = f"s{uuid.uuid4().hex[:10]}"
    if form.prepare is not None:
        form.prepare(broker_url, name)
    conns = [connect(url) for _ in range(3)]
    try:
        receivers = []
        for conn, selector in zip(conns, pair):
            options = [Selector(selector)] if selector else []
            if form.capabilities:
                options.append(Capabilities(*form.capabilities))
            receivers.append(conn.create_receiver(form.receive_at(name), credit=2 * N, options=options))
        sender = conns[2].create_sender(form.send_to(name))
        for i in range(N):
            sender.send(Message(id=f"m{i}", body=i, properties={"k": i % 3}))
        selected = [{i for i in range(N) if selects(s, i)} for s in pair]
        if form.subscription:
            got = [[m.body for m in receive_until_quiet(r, at_most=len(want), idle=5, limit=20)] for r, want in zip(receivers, selected)]
            got = [g + [m.body for m in receive_until_quiet(r, idle=0.3, limit=2)] for g, r in zip(got, receivers)]
            for g, want, selector in zip(got, selected, pair):
                assert sorted(g) == sorted(want), f"{form.name}: receiver {selector!r} got {sorted(g)}"
        else:
            want_all = set().union(*selected)
            got = [[] for _ in receivers]
            for _ in range(40):
                for g, r in zip(got, receivers):
                    g.extend(m.body for m in receive_until_quiet(r, idle=0.1, limit=1))
                if sum(len(g) for g in got) >= len(want_all):
                    break
            for g, r in zip(got, receivers):
                g.extend(m.body for m in receive_until_quiet(r, idle=0.3, limit=2))
            seen = [i for g in got for i in g]
            assert len(seen) == len(set(seen)), f"{form.name}: a queue message went to both receivers: {got}"
            assert set(seen) == want_all, f"{form.name}: receivers got {got}, expected together {sorted(want_all)}"
            for g, want, selector in zip(got, selected, pair):
                assert set(g) <= want, f"{form.name}: receiver {selector!r} got messages it does not select: {g}"
    finally:
        for c in conns:
            c.close()


@pytest.mark.parametrize("pair", list(RECEIVER_PAIRS.values()), ids=list(RECEIVER_PAIRS))
@pytest.mark.parametrize("form", EMBEDDED_FORMS, ids=[f.name for f in EMBEDDED_FORMS])
def test_embedded(embedded_daemon, form, pair):
    run_cell(embedded_daemon.url, form, pair)


@pytest.mark.parametrize("pair", list(RECEIVER_PAIRS.values()), ids=list(RECEIVER_PAIRS))
@pytest.mark.parametrize("form", CHAINED_FORMS, ids=[f.name for f in CHAINED_FORMS])
def test_chained(chained_daemon, form, pair):
    run_cell(chained_daemon.url, form, pair)


@pytest.mark.rabbitmq
@pytest.mark.parametrize("pair", list(RECEIVER_PAIRS.values()), ids=list(RECEIVER_PAIRS))
@pytest.mark.parametrize("form", RABBITMQ_FORMS, ids=[f.name for f in RABBITMQ_FORMS])
def test_rabbitmq(rabbitmq_daemon, form, pair):
    run_cell(rabbitmq_daemon.url, form, pair)


@pytest.mark.rabbitmq
@pytest.mark.rabbitmq4
@pytest.mark.parametrize("pair", list(RECEIVER_PAIRS.values()), ids=list(RECEIVER_PAIRS))
@pytest.mark.parametrize("form", RABBITMQ4_FORMS, ids=[f.name for f in RABBITMQ4_FORMS])
def test_rabbitmq4_v2(proxy4, rabbitmq4, form, pair):
    run_cell(proxy4.url, form, pair, broker_url=rabbitmq4.url)


def test_embedded_500_connections_two_subscribers_each(embedded_daemon):
    """500 connections x 2 filtered receivers on one multicast address (100 and 50 distinct
    selectors, each shared by 5 or 10 receivers): every receiver gets exactly what it selects."""
    import json
    import subprocess

    conns, messages = 500, 400
    address = f"multicast://fan{uuid.uuid4().hex[:8]}"
    script = Path(__file__).with_name("fanout_client.py")
    out = subprocess.run([sys.executable, str(script), embedded_daemon.url, address, str(conns), str(messages), "150"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] == messages
    wrong = {}
    for c in range(conns):
        for which, modulus in (("a", 100), ("b", 50)):
            want = [i for i in range(messages) if i % modulus == c % modulus]
            got = sorted(result["got"][f"{c}{which}"])
            if got != want:
                wrong[f"{c}{which}"] = (got, want)
    assert not wrong, f"{len(wrong)} of {2 * conns} receivers got the wrong set, e.g. {list(wrong.items())[:3]}"
