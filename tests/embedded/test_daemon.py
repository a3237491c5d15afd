"""Real proton clients against `broker-filter serve` with the embedded broker."""

from __future__ import annotations

import time
import uuid

from proton import Message

from clients import bodies, connect, publish_outcomes, receive_n, receiver, receives_nothing, send_bodies, sender
from launcher import Daemon


def fresh(prefix: str = "a") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def test_queue_keeps_order_and_holds_until_a_consumer_comes(daemon):
    q = fresh("q")
    conn = connect(daemon.url)
    try:
        send_bodies(sender(conn, q), *range(5))
        r = receiver(conn, q)
        assert bodies(receive_n(r, 5)) == [0, 1, 2, 3, 4]
    finally:
        conn.close()


def test_competing_consumers_share_a_queue(daemon):
    q = fresh("q")
    conn = connect(daemon.url)
    try:
        a = receiver(conn, q, credit=2)
        b = receiver(conn, q, credit=2)
        send_bodies(sender(conn, q), *range(4))
        got = bodies(receive_n(a, 2)) + bodies(receive_n(b, 2))
        assert sorted(got) == [0, 1, 2, 3]
        assert receives_nothing(a, 0.3) and receives_nothing(b, 0.1)
    finally:
        conn.close()


def test_topic_gives_each_subscriber_a_copy(daemon):
    t = fresh("t")
    conn = connect(daemon.url)
    try:
        a = receiver(conn, t, caps=("topic",))
        b = receiver(conn, f"multicast://{t}")
        send_bodies(sender(conn, f"multicast://{t}"), "x", "y")
        assert bodies(receive_n(a, 2)) == ["x", "y"] and bodies(receive_n(b, 2)) == ["x", "y"]
    finally:
        conn.close()


def test_wildcard_subscriptions(daemon):
    base = fresh("news")
    conn = connect(daemon.url)
    try:
        everything = receiver(conn, f"multicast://{base}.#")
        sport = receiver(conn, f"multicast://{base}.*.sport")
        for a in (f"{base}.uk", f"{base}.uk.sport", f"{base}.fr.sport", f"{base}.a.b.sport"):
            send_bodies(sender(conn, f"multicast://{a}"), a)
        assert bodies(receive_n(everything, 4)) == [f"{base}.uk", f"{base}.uk.sport", f"{base}.fr.sport", f"{base}.a.b.sport"]
        assert bodies(receive_n(sport, 2)) == [f"{base}.uk.sport", f"{base}.fr.sport"]
        assert receives_nothing(sport, 0.3)
    finally:
        conn.close()


def test_fqqn_reads_one_queue(daemon):
    addr = fresh("orders")
    conn = connect(daemon.url)
    try:
        send_bodies(sender(conn, f"{addr}::east"), "e1")
        send_bodies(sender(conn, f"{addr}::west"), "w1")
        assert bodies(receive_n(receiver(conn, f"{addr}::west"), 1)) == ["w1"]
        assert bodies(receive_n(receiver(conn, f"{addr}::east"), 1)) == ["e1"]
    finally:
        conn.close()


def test_selector_takes_oldest_match_and_leaves_the_rest(daemon):
    q = fresh("q")
    conn = connect(daemon.url)
    try:
        snd = sender(conn, q)
        for i, color in enumerate(["blue", "red", "green", "red", "blue"]):
            snd.send(Message(body=i, properties={"color": color}))
        red = receiver(conn, q, selector="color = 'red'")
        assert bodies(receive_n(red, 2)) == [1, 3]
        assert receives_nothing(red, 0.3)
        rest = receiver(conn, q)
        assert bodies(receive_n(rest, 3)) == [0, 2, 4]
    finally:
        conn.close()


def test_selective_consumer_finds_one_match_deep_in_the_queue(daemon):
    q = fresh("deep")
    conn = connect(daemon.url)
    try:
        snd = sender(conn, q)
        msgs = [Message(body=i, properties={"id": f"m{i}", "n": i}) for i in range(2000)]
        for m in msgs:
            snd.send(m)
        needle = receiver(conn, q, selector="n = 1999")
        assert bodies(receive_n(needle, 1)) == [1999]
        other = receiver(conn, q, selector="id = 'm1000'")
        assert bodies(receive_n(other, 1)) == [1000]
    finally:
        conn.close()


def test_released_goes_back_in_place(daemon):
    q = fresh("q")
    conn = connect(daemon.url)
    try:
        send_bodies(sender(conn, q), "first", "second", "third")
        r = receiver(conn, q, credit=1)
        m = r.receive(timeout=5)
        assert m.body == "first"
        r.release()
        r.close()  # what the client prefetched meanwhile goes back too
        assert bodies(receive_n(receiver(conn, q), 3)) == ["first", "second", "third"]
    finally:
        conn.close()


def test_address_limit_refuses_and_rejected_goes_to_dead_letters():
    d = Daemon("--set", "embedded.max_messages=3", "--set", "embedded.dead_letter_address=DLQ")
    try:
        outcomes = publish_outcomes(d.url, "limited", [1, 2, 3, 4])
        assert outcomes[:3] == [("accepted", None)] * 3
        assert outcomes[3] == ("rejected", "amqp:resource-limit-exceeded")
        conn = connect(d.url)
        r = receiver(conn, "limited", credit=1)
        assert bodies(receive_n(r, 1)) == [1]
        m = r.receive(timeout=5)  # also carries the accept of 1 to the daemon (blocking clients flush on I/O)
        assert m.body == 2
        r.reject()
        assert bodies(receive_n(receiver(conn, "DLQ"), 1)) == [2]
        for _ in range(50):  # room again once the daemon applied the accept (bounded wait)
            if publish_outcomes(d.url, "limited", [5]) == [("accepted", None)]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("address stayed full after an accept")
        conn.close()
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_no_local_subscriber_skips_its_own_connection(daemon):
    from proton import Described, symbol
    from proton.reactor import Filter

    t = fresh("t")
    mine, other = connect(daemon.url), connect(daemon.url)
    try:
        no_local = Filter({symbol("no-local"): Described(symbol("apache.org:no-local-filter:list"), [])})
        r = mine.create_receiver(f"multicast://{t}", name="nl", credit=10, options=[no_local])
        mine.create_sender(f"multicast://{t}", name="p1").send(Message(body="own"))
        other.create_sender(f"multicast://{t}", name="p2").send(Message(body="theirs"))
        assert bodies(receive_n(r, 1)) == ["theirs"]
        assert receives_nothing(r, 0.3)
    finally:
        mine.close()
        other.close()


def test_legacy_bindings_are_evaluated_by_the_embedded_broker(daemon):
    from proton import Described, symbol
    from proton.reactor import Filter

    q = fresh("q")
    conn = connect(daemon.url)
    try:
        snd = sender(conn, q)
        for subject in ("news.uk", "sport.uk", "news.fr"):
            snd.send(Message(body=subject, subject=subject))
        binding = Filter({symbol("topic"): Described(symbol("apache.org:legacy-amqp-topic-binding:string"), "news.*")})
        r = conn.create_receiver(q, name=fresh("lb"), credit=10, options=[binding])
        assert bodies(receive_n(r, 2)) == ["news.uk", "news.fr"]
        assert bodies(receive_n(receiver(conn, q), 1)) == ["sport.uk"]
    finally:
        conn.close()
