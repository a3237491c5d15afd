"""Each filter type end to end: proton clients publish and receive through the proxy, RabbitMQ behind."""

from __future__ import annotations

import uuid

import pytest
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter, Selector

from clients import connect, receive_n_and_extras, receive_until_quiet, send_outcomes
from launcher import Daemon

pytestmark = pytest.mark.rabbitmq

SELECTOR = symbol("apache.org:selector-filter:string")
DIRECT = symbol("apache.org:legacy-amqp-direct-binding:string")
TOPIC = symbol("apache.org:legacy-amqp-topic-binding:string")
HEADERS = symbol("apache.org:legacy-amqp-headers-binding:map")


def _tag() -> str:
    return "t" + uuid.uuid4().hex[:8]


def _bodies(messages) -> list:
    return [m.body for m in messages]


def test_selector_on_a_queue_with_jms_headers(proxy, address):
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/queue/{address}", credit=50,
                              options=Selector("JMSType = 'order' AND JMSPriority > 5 AND qty BETWEEN 2 AND 4"))
        s = c.create_sender(f"/queue/{address}")
        for i in range(10):
            s.send(Message(body=i, subject="order" if i % 2 == 0 else "quote", priority=9 if i < 6 else 1,
                           properties={"qty": i % 5}))
        got = receive_n_and_extras(r, 2)
        # even i, priority 9 (i < 6), qty in 2..4: i in {2, 4}
        assert sorted(_bodies(got)) == [2, 4]
        assert all(m.subject == "order" for m in got)
    finally:
        c.close()


def unroutable(rabbitmq_broker) -> str:
    """The outcome the proxy passes on for a message no queue is bound for: RabbitMQ 3.10 accepts
    and drops it, RabbitMQ 4 releases it (it tells the publisher that nobody got it)."""
    return "released" if rabbitmq_broker.major >= 4 else "accepted"


def test_direct_binding_on_an_exchange_becomes_the_binding_key(proxy, rabbitmq_broker):
    tag = _tag()
    c = connect(proxy.url)
    try:
        r = c.create_receiver("/exchange/amq.direct", credit=50,
                              options=Filter({symbol("binding"): Described(DIRECT, f"{tag}.k1")}))
        s = c.create_sender("/exchange/amq.direct")
        outcomes = send_outcomes(s, [Message(body=i, subject=key)
                                     for i, key in enumerate([f"{tag}.k1", f"{tag}.k2", f"{tag}.k1", "other"])])
        assert outcomes == ["accepted", unroutable(rabbitmq_broker), "accepted", unroutable(rabbitmq_broker)]
        assert _bodies(receive_n_and_extras(r, 2)) == [0, 2]
    finally:
        c.close()


def test_topic_binding_on_an_exchange_with_wildcards(proxy, rabbitmq_broker):
    tag = _tag()
    c = connect(proxy.url)
    try:
        r = c.create_receiver("/exchange/amq.topic", credit=50,
                              options=Filter({symbol("t"): Described(ulong(0x0000468C00000001), f"{tag}.*.x")}))
        s = c.create_sender("/exchange/amq.topic")
        keys = [f"{tag}.a.x", f"{tag}.a.b.x", f"{tag}.b.x", f"{tag}.x", "zz.a.x"]
        outcomes = send_outcomes(s, [Message(body=i, subject=key) for i, key in enumerate(keys)])
        # the binding key is the filter's pattern: only the keys it matches reach a queue
        nobody = unroutable(rabbitmq_broker)
        assert outcomes == ["accepted", nobody, "accepted", nobody, nobody]
        assert _bodies(receive_n_and_extras(r, 2)) == [0, 2]
    finally:
        c.close()


def test_topic_binding_evaluated_locally_on_a_topic_subscription(proxy):
    tag = _tag()
    c = connect(proxy.url)
    try:
        # RabbitMQ binds '<tag>.#'; the proxy evaluates the narrower topic binding on the subject.
        r = c.create_receiver(f"/topic/{tag}.#", credit=50,
                              options=Filter({symbol("t"): Described(TOPIC, f"{tag}.a.#")}))
        s = c.create_sender("/exchange/amq.topic")
        for i, key in enumerate([f"{tag}.a", f"{tag}.b", f"{tag}.a.b.c", f"{tag}.ab", f"{tag}.a.z"]):
            s.send(Message(body=i, subject=key))
        assert _bodies(receive_n_and_extras(r, 3)) == [0, 2, 4]
    finally:
        c.close()


def test_headers_binding(proxy):
    tag = _tag()
    binding = {"x-match": "any", "region": "eu", "tier": "gold"}
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/topic/{tag}", credit=50, options=Filter({symbol("h"): Described(HEADERS, binding)}))
        s = c.create_sender(f"/topic/{tag}")
        props = [{"region": "eu"}, {"region": "us"}, {"tier": "gold"}, {"tier": "silver", "region": "us"}, {}]
        for i, p in enumerate(props):
            s.send(Message(body=i, subject=tag, properties=p))
        assert _bodies(receive_n_and_extras(r, 2)) == [0, 2]
    finally:
        c.close()


def test_or_and_not_filters(proxy):
    tag = _tag()
    either = Described(symbol("apache.org:or-filter:list"),
                       [Described(SELECTOR, "n < 2"), Described(SELECTOR, "n > 7")])
    negated = Described(symbol("apache.org:not-filter:list"), [Described(SELECTOR, "n = 9")])
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/topic/{tag}", credit=50,
                              options=Filter({symbol("either"): either, symbol("not9"): negated}))
        s = c.create_sender(f"/topic/{tag}")
        for i in range(10):
            s.send(Message(body=i, subject=tag, properties={"n": i}))
        assert _bodies(receive_n_and_extras(r, 3)) == [0, 1, 8]
    finally:
        c.close()


def test_no_local_with_two_connections(proxy):
    tag = _tag()
    no_local = Described(ulong(0x0000468C00000003), [])
    a = connect(proxy.url)
    b = connect(proxy.url)
    try:
        mine = a.create_receiver(f"/topic/{tag}", credit=50, options=Filter({symbol("no-local"): no_local}))
        everything = a.create_receiver(f"/topic/{tag}", name="all", credit=50)
        sa = a.create_sender(f"/topic/{tag}")
        sb = b.create_sender(f"/topic/{tag}")
        for i in range(6):
            (sa if i % 2 == 0 else sb).send(Message(body=i, subject=tag))
        assert _bodies(receive_n_and_extras(mine, 3)) == [1, 3, 5]
        assert _bodies(receive_n_and_extras(everything, 6)) == [0, 1, 2, 3, 4, 5]
    finally:
        a.close()
        b.close()


def test_published_messages_carry_the_origin_annotation(proxy, address):
    c = connect(proxy.url)
    try:
        s = c.create_sender(f"/queue/{address}")
        s.send(Message(body="x", annotations={symbol("x-opt-keep"): 1}))
        r = c.create_receiver(f"/queue/{address}", credit=5)
        (m,) = receive_until_quiet(r, at_most=1)
        origin = m.annotations[symbol("x-opt-broker-filter-origin")]
        assert isinstance(origin, str) and "/" in origin
        assert m.annotations[symbol("x-opt-keep")] == 1
        assert m.body == "x"
    finally:
        c.close()


def test_configured_virtual_address_and_multicast_rule(rabbitmq, tmp_path):
    tag = _tag()
    conf = tmp_path / "proxy.toml"
    conf.write_text(
        f'[virtual_addresses.reds-{tag}]\nupstream = "/queue/{tag}"\nselector = "color = \'red\'"\n\n'
        f'[[address_rules]]\npattern = "fan-{tag}.#"\nrouting_type = "multicast"\nupstream = "/topic/{{address}}"\n'
    )
    p = Daemon("--config", str(conf), upstream=rabbitmq)
    c = connect(p.url)
    try:
        # a virtual address: the configured filter AND the client's own
        r = c.create_receiver(f"reds-{tag}", credit=20, options=Selector("n > 1"))
        s = c.create_sender(f"/queue/{tag}")
        for i in range(6):
            s.send(Message(body=i, properties={"n": i, "color": "red" if i % 2 else "blue"}))
        assert _bodies(receive_n_and_extras(r, 2)) == [3, 5]
        # an address rule: rewritten upstream, multicast, so two receivers each get every message
        r1 = c.create_receiver(f"fan-{tag}.x", name="r1", credit=20)
        r2 = c.create_receiver(f"fan-{tag}.x", name="r2", credit=20, options=Selector("n < 2"))
        s2 = c.create_sender(f"fan-{tag}.x")
        for i in range(4):
            s2.send(Message(body=i, subject=f"fan-{tag}.x", properties={"n": i}))
        assert _bodies(receive_n_and_extras(r1, 4)) == [0, 1, 2, 3]
        assert _bodies(receive_n_and_extras(r2, 2)) == [0, 1]
    finally:
        c.close()
        p.stop()


def test_upstream_refusal_reaches_the_client_as_an_attach_refusal(proxy):
    from proton.utils import LinkDetached

    c = connect(proxy.url)
    try:
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(f"/exchange/missing-{_tag()}", options=Selector("a = 1"))
        assert info.value.link.remote_condition.name == "amqp:not-found"
        with pytest.raises(LinkDetached) as info:
            c.create_sender(f"/exchange/missing-{_tag()}")
        assert info.value.link.remote_condition.name == "amqp:not-found"
    finally:
        c.close()


def test_large_message_both_ways_unchanged(proxy, address):
    body = bytes(range(256)) * 4096  # 1 MiB: many transfer frames each way
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/queue/{address}", credit=2, options=Selector("big = TRUE"))
        s = c.create_sender(f"/queue/{address}")
        s.send(Message(body=body, properties={"big": True}))
        (m,) = receive_until_quiet(r, at_most=1, idle=5.0)
        assert bytes(m.body) == body
    finally:
        c.close()


def test_at_most_once_both_ways(proxy, address):
    from proton.reactor import AtMostOnce

    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/queue/{address}", credit=10, options=[AtMostOnce(), Selector("n >= 2")])
        assert r.link.remote_snd_settle_mode == 1  # the proxy agreed to send pre-settled
        s = c.create_sender(f"/queue/{address}", options=AtMostOnce())
        for i in range(4):
            s.send(Message(body=i, properties={"n": i}))
        got = receive_n_and_extras(r, 2, accept=False)
        assert [m.body for m in got] == [2, 3]
    finally:
        c.close()
    # consumed upstream: a second receiver finds only the two the selector did not select
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/queue/{address}", credit=10)
        assert sorted(m.body for m in receive_n_and_extras(r, 2)) == [0, 1]
    finally:
        c.close()


def test_links_per_connection_limit_counts_attached_links_only(rabbitmq, address):
    from proton.utils import LinkDetached


    p = Daemon("--set", "limits.links_per_connection=2", upstream=rabbitmq)
    c = connect(p.url)
    try:
        for i in range(4):  # attach and detach more links than the limit, one at a time
            r = c.create_receiver(f"/queue/{address}", name=f"r{i}")
            r.close()
        a = c.create_receiver(f"/queue/{address}", name="a")
        b = c.create_receiver(f"/queue/{address}", name="b")
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(f"/queue/{address}", name="c")
        assert info.value.link.remote_condition.name == "amqp:resource-limit-exceeded"
        assert a and b
    finally:
        c.close()
        p.stop()


def test_drain_is_answered(proxy, address):
    c = connect(proxy.url)
    try:
        s = c.create_sender(f"/queue/{address}")
        for i in range(3):
            s.send(Message(body=i, properties={"n": i}))
        r = c.create_receiver(f"/queue/{address}", credit=0, options=Selector("n >= 1"))
        r.link.drain(10)
        c.wait(lambda: not r.link.draining(), timeout=10)  # answered: what the proxy had, then drained
        assert r.link.credit == 0
        assert sorted(m.body for m in receive_n_and_extras(r, 2)) == [1, 2]
    finally:
        c.close()


def test_detached_link_is_released_and_its_name_reusable(proxy, address):
    c = connect(proxy.url)
    try:
        s = c.create_sender(f"/queue/{address}")
        s.send(Message(body="kept", properties={"n": 1}))
        r = c.create_receiver(f"/queue/{address}", name="again", credit=5, options=Selector("n = 1"))
        m = r.receive(timeout=10)
        assert m.body == "kept"
        r.link.detach()  # not closed: the unsettled message goes back, the name is free again
        try:
            c.wait(lambda: False, timeout=0.5)  # let the detach go out and be answered
        except Exception:
            pass
        r2 = c.create_receiver(f"/queue/{address}", name="again", credit=5, options=Selector("n = 1"))
        assert [x.body for x in receive_n_and_extras(r2, 1)] == ["kept"]
    finally:
        c.close()
