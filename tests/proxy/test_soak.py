"""A random mix of publishers, filtered receivers that come and go (closing or only detaching), and a
small window on one queue behind the proxy: afterwards every published message was received by a
receiver whose selector selects it, or is still in the queue.  Nothing lost, nothing misdelivered,
and, since the daemon is stopped gracefully, no duplicate (the guarantee table allows them only
after a crash); duplicates are counted all the same, in the failure message.

Replayable: the run is a function of its seed and its message count, not of the wall clock
(BROKER_FILTER_SOAK_SEED and BROKER_FILTER_SOAK_MESSAGES replay or widen it)."""

from __future__ import annotations

import collections
import os
import random
import uuid

import pytest
from proton import Message
from proton.reactor import Selector

from clients import connect, receive_until_quiet
from launcher import Daemon

pytestmark = pytest.mark.rabbitmq

SELECTS = {
    "c = 0": lambda c: c == 0,
    "c = 1": lambda c: c == 1,
    "c = 1 OR c = 2": lambda c: c in (1, 2),
}  # c = 3 matches nobody: those wait in the queue, fill the window and get moved to its tail


SEED = int(os.environ.get("BROKER_FILTER_SOAK_SEED", "20261122"))
MESSAGES = int(os.environ.get("BROKER_FILTER_SOAK_MESSAGES", "400"))


def test_random_clients_lose_nothing_and_duplicate_nothing(rabbitmq):
    rnd = random.Random(SEED * 1_000_003 + MESSAGES)
    replay = f"replay: BROKER_FILTER_SOAK_SEED={SEED} BROKER_FILTER_SOAK_MESSAGES={MESSAGES}"
    proxy = Daemon("--set", "limits.upstream_window=8", upstream=rabbitmq)
    q = f"/queue/soak-{uuid.uuid4().hex[:8]}"
    published: set[int] = set()
    received: list[int] = []
    conns = [connect(proxy.url) for _ in range(3)]
    receivers = []
    n = 0
    try:
        while n < MESSAGES:
            c = rnd.choice(conns)
            roll = rnd.random()
            if roll < 0.4:
                s = c.create_sender(q, name=f"s{n}")
                for _ in range(min(rnd.randint(1, 20), MESSAGES - n)):
                    s.send(Message(body=n, properties={"c": n % 4}))
                    published.add(n)
                    n += 1
                s.close()
            elif roll < 0.7:
                text = rnd.choice(list(SELECTS))
                r = c.create_receiver(q, name=f"r{n}-{rnd.random()}", credit=rnd.randint(1, 10),
                                      options=Selector(text))
                receivers.append((r, text))
            elif receivers:
                r, text = receivers.pop(rnd.randrange(len(receivers)))
                for m in receive_until_quiet(r, idle=0.2, limit=2):
                    assert SELECTS[text](m.properties["c"]), (text, m.properties, replay)
                    received.append(m.body)
                if rnd.random() < 0.5:
                    r.close()
                else:
                    r.link.detach()
        for r, text in receivers:
            for m in receive_until_quiet(r, idle=0.2, limit=2):
                assert SELECTS[text](m.properties["c"]), (text, m.properties, replay)
                received.append(m.body)
    finally:
        for c in conns:
            c.close()
        proxy.stop()
    direct = connect(rabbitmq)
    try:
        rest = [m.body for m in receive_until_quiet(direct.create_receiver(q, credit=500), idle=2.0, limit=60)]
    finally:
        direct.close()
    counts = collections.Counter(received + rest)
    duplicates = {body: k - 1 for body, k in counts.items() if k > 1}
    assert set(counts) == published, (sorted(published - set(counts))[:20], replay)  # nothing lost
    assert not set(counts) - published, replay
    assert sum(duplicates.values()) == 0, (f"{sum(duplicates.values())} duplicates after a graceful stop", duplicates,
                                          replay)
    assert any(b % 4 == 3 for b in rest) and received  # both paths were exercised
    assert "Traceback" not in proxy.log()
