"""Drain (AMQP 1.0 2.6.7): a receiver that sets drain with credit gets every message available that
its link selects, then its credit is used up (drained); messages no client received keep
first-acquirer true and delivery-count 0 (3.2.1)."""

from __future__ import annotations

import uuid

import pytest
from proton import Message
from proton.reactor import Selector

from clients import connect, receive_until_quiet, run_js


def _queue(daemon) -> str:
    return daemon.forms[1].format(f"drain-{uuid.uuid4().hex[:10]}")


def _publish(daemon, q: str, colors) -> None:
    conn = connect(daemon.url)
    try:
        snd = conn.create_sender(q)
        for i, color in enumerate(colors):
            # first-acquirer true on the wire (its default, false, is what a message without a header has)
            snd.send(Message(body=f"{color}-{i}", properties={"color": color}, first_acquirer=True))
    finally:
        conn.close()


def _drain_link(conn, rcv, credit: int) -> list[Message]:
    """Drain `rcv` with `credit`; the messages received (accepted) once the drain is answered."""
    rcv.link.drain(credit)
    conn.wait(lambda: rcv.link.credit == 0 and not rcv.link.draining(), timeout=15,
              msg="the drain was never answered")
    out = []
    while rcv.fetcher.has_message:
        out.append(rcv.fetcher.pop())
        rcv.accept()
    return out


def _drain(daemon, q: str, selector: str, credit: int, linger: float = 0.0) -> list[Message]:
    """Drain with `credit` on a fresh link; the messages received, once the link's credit is 0
    (and `linger` seconds more with the link open)."""
    conn = connect(daemon.url)
    try:
        rcv = conn.create_receiver(q, credit=0, options=Selector(selector))
        out = _drain_link(conn, rcv, credit)
        if linger:
            try:
                conn.wait(lambda: False, timeout=linger)
            except Exception:
                pass
        assert rcv.link.credit == 0
        return out
    finally:
        conn.close()


def _rest(daemon, q: str, n: int) -> list[Message]:
    conn = connect(daemon.url)
    try:
        rcv = conn.create_receiver(q, credit=20)
        return receive_until_quiet(rcv, at_most=n + 1, idle=3.0)
    finally:
        conn.close()


def _fresh(daemon, messages) -> list[tuple]:
    """(body, first-acquirer, delivery-count) of each message, sorted.  RabbitMQ marks every message
    that goes back to a queue redelivered (first-acquirer false), even one the proxy held and
    returned with `released`; so first-acquirer is only checked on the embedded broker, which the
    proxy tells that nobody received it."""
    embedded = daemon.forms[0].startswith("multicast")
    return sorted((m.body, m.first_acquirer if embedded else True, m.delivery_count) for m in messages)


def test_drain_delivers_what_the_link_selects_then_drained(daemon):
    q = _queue(daemon)
    _publish(daemon, q, ["red", "blue", "red", "blue", "red"])
    got = _drain(daemon, q, "color = 'red'", 5)
    assert sorted(m.body for m in got) == ["red-0", "red-2", "red-4"]
    assert all(m.first_acquirer and m.delivery_count == 0 for m in got)
    # the rest, never received by a client, is new to the next consumer
    assert _fresh(daemon, _rest(daemon, q, 2)) == [("blue-1", True, 0), ("blue-3", True, 0)]


def test_drain_with_less_credit_than_matches(daemon):
    q = _queue(daemon)
    _publish(daemon, q, ["red", "blue", "red", "red"])
    got = _drain(daemon, q, "color = 'red'", 2)
    assert [m.body for m in got] == ["red-0", "red-2"]
    assert _fresh(daemon, _rest(daemon, q, 2)) == [("blue-1", True, 0), ("red-3", True, 0)]


def test_drain_again_after_an_empty_drain(daemon):
    """Nothing selected: drained at once, and the link stays usable: a later drain gets what came."""
    q = _queue(daemon)
    _publish(daemon, q, ["blue", "blue"])
    conn = connect(daemon.url)
    try:
        rcv = conn.create_receiver(q, credit=0, options=Selector("color = 'red'"))
        for expected in ([], ["red-0"]):
            if expected:
                _publish(daemon, q, ["red"])
            assert [m.body for m in _drain_link(conn, rcv, 5)] == expected
    finally:
        conn.close()
    assert _fresh(daemon, _rest(daemon, q, 2)) == [("blue-0", True, 0), ("blue-1", True, 0)]


def test_rhea_drain(daemon):
    q = _queue(daemon)
    _publish(daemon, q, ["red", "blue", "red", "red"])
    port = daemon.url.rsplit(":", 1)[1].split("/")[0]
    out = run_js("drain.js", port, q, "color = 'red'")
    assert out[-1].get("timeout") is None, out
    assert sorted(out[-1]["got"]) == ["red-0", "red-2", "red-3"]
    assert out[-1]["credit"] == 0
    assert _fresh(daemon, _rest(daemon, q, 1)) == [("blue-1", True, 0)]


def test_topic_drain_delivers_what_its_subscription_has(daemon):
    topic = daemon.forms[0].format(f"drain-{uuid.uuid4().hex[:10]}")
    conn = connect(daemon.url)
    try:
        rcv = conn.create_receiver(topic, credit=0, options=Selector("color = 'red'"))
        _publish(daemon, topic, ["red", "blue", "red"])
        assert [m.body for m in _drain_link(conn, rcv, 5)] == ["red-0", "red-2"]
    finally:
        conn.close()
