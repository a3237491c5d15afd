"""Random filter sets and messages for the shared-subscription tests (daemon on RabbitMQ and on the
embedded broker): which messages a selector selects, and the check that each link gets exactly those."""

from __future__ import annotations

import random
import time

from proton import Message

from broker_filter.filters import compile_selector
from clients import connect, receive_until_quiet, receiver, send_messages
from launcher import Daemon

# the daemon's shared-subscription index and its cache, on and off (pytest params and ids)
INDEX_SETTINGS = {"index-cache": ("true", "1024"), "index-no-cache": ("true", "0"), "no-index": ("false", "0")}


def serve_with_index(setting: tuple[str, str], **kw):
    """Yield a daemon with one of INDEX_SETTINGS (keyword arguments go to Daemon); stop it after."""
    indexed, cache = setting
    p = Daemon("--set", f"limits.subscription_index={indexed}", "--set", f"limits.index_cache_size={cache}", **kw)
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


def wait_until(check, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return check()


def messages(n: int, seed: int = 1) -> list[Message]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        props = {"i": i, "k": rnd.randint(0, 6)}
        if rnd.random() < 0.9:
            props["customer"] = f"c{rnd.randint(0, 5)}"
        out.append(Message(id=f"m{i}", body=i, properties=props))
    return out


def selected(selector: str | None, msgs: list[Message]) -> list[int]:
    from broker_filter.amqp.message import Message as Decoded

    if selector is None:
        return [m.body for m in msgs]
    f = compile_selector(selector)
    return [m.body for m in msgs
            if f.evaluate(Decoded(application_properties=dict(m.properties))) is True]


SELECTORS = ["customer = 'c{n}'", "customer IN ('c{n}', 'c{m}')", "customer LIKE 'c{n}%'", "k > {n}",
             "customer = 'c{n}' AND k < {m}", "customer <> 'c{n}'"]


def check_exact_sets(url: str, address: str, seed: int, count_queues=None) -> None:
    """Random filters on `address` (each link on one of two connections), 30 random messages: each link
    gets exactly, and in order, the messages its filter selects."""
    rnd = random.Random(seed)
    texts = [rnd.choice(SELECTORS).format(n=rnd.randint(0, 5), m=rnd.randint(0, 5)) for _ in range(rnd.randint(2, 8))]
    conns = [connect(url) for _ in range(2)]
    try:
        rcvs = [receiver(conns[j % 2], address, credit=100, selector=t) for j, t in enumerate(texts)]
        if count_queues is not None:
            assert wait_until(lambda: count_queues() == 1, 10)
        msgs = messages(30, seed)
        send_messages(conns[0].create_sender(address), msgs)
        for r, t in zip(rcvs, texts):
            want = selected(t, msgs)
            got = [m.body for m in receive_until_quiet(r, at_most=len(want), idle=3, limit=20)]
            got += [m.body for m in receive_until_quiet(r, idle=0.2, limit=1)]
            assert got == want, t
    finally:
        for c in conns:
            c.close()
