"""Property filter expressions (filtex) through the daemon, on the embedded broker and on RabbitMQ:
exact echoes, exact sets on a topic, competing filtex consumers on a queue, refusal of an invalid one."""

from __future__ import annotations

import uuid

import pytest
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter
from proton.utils import LinkDetached

from clients import connect, receive_until_quiet, rhea_publish_regions, run_js

PROPS = symbol("amqp:properties-filter")
APP = ulong(0x174)


def messages(n=12):
    # subject "eu.<i>" or "us.<i>"; application property total = i * 10
    return [Message(id=f"m{i}", body=i, subject=("eu." if i % 2 else "us.") + str(i),
                    properties={"total": i * 10, "region": "eu" if i % 2 else "us"}) for i in range(n)]


def test_topic_exact_sets_and_echoes(daemon):
    name = f"fx{uuid.uuid4().hex[:8]}"
    topic = daemon.forms[0].format(name)
    f_props = {symbol("props"): Described(PROPS, {symbol("subject"): "&p:eu."})}
    f_app = {symbol("app"): Described(APP, {"total": 40})}
    f_both = {**f_props, symbol("app2"): Described(symbol("amqp:application-properties-filter"), {"region": "eu"})}
    conns = [connect(daemon.url) for _ in range(4)]
    try:
        receivers = []
        for conn, filters in zip(conns, (f_props, f_app, f_both)):
            r = conn.create_receiver(topic, credit=50, options=Filter(filters))
            echoed = r.link.remote_source.filter
            echoed.rewind()
            echoed.next()
            assert echoed.get_object() == filters  # exactly the filters applied, under the client's keys
            receivers.append(r)
        caps = r.link.remote_source.capabilities
        caps.rewind()
        caps.next()
        assert "AMQP_FILTEX_PROP_V1_0" in {str(c) for c in caps.get_object()}
        assert "AMQP_FILTEX_PROP_V1_0" in {str(c) for c in conns[0].conn.remote_offered_capabilities}
        sender = conns[3].create_sender(topic)
        for m in messages():
            sender.send(m)
        want = [{i for i in range(12) if i % 2}, {4}, {i for i in range(12) if i % 2}]
        for r, w in zip(receivers, want):
            got = [m.body for m in receive_until_quiet(r, at_most=len(w), idle=5, limit=20)]
            got += [m.body for m in receive_until_quiet(r, idle=0.5, limit=2)]
            assert sorted(got) == sorted(w)
    finally:
        for c in conns:
            c.close()


def test_competing_filtex_consumers_on_a_queue_exact_and_lossless(daemon):
    name = f"fxq{uuid.uuid4().hex[:8]}"
    queue = daemon.forms[1].format(name)
    conns = [connect(daemon.url) for _ in range(3)]
    try:
        eu = conns[0].create_receiver(queue, credit=50, options=Filter({symbol("p"): Described(PROPS, {symbol("subject"): "&p:eu."})}))
        us = conns[1].create_receiver(queue, credit=50, options=Filter({symbol("a"): Described(APP, {"region": "us"})}))
        sender = conns[2].create_sender(queue)
        for m in messages(20):
            sender.send(m)
        got_eu = [m.body for m in receive_until_quiet(eu, at_most=10, idle=5, limit=20)] + [m.body for m in receive_until_quiet(eu, idle=0.5, limit=2)]
        got_us = [m.body for m in receive_until_quiet(us, at_most=10, idle=5, limit=20)] + [m.body for m in receive_until_quiet(us, idle=0.5, limit=2)]
        assert sorted(got_eu) == [i for i in range(20) if i % 2]
        assert sorted(got_us) == [i for i in range(20) if not i % 2]
    finally:
        for c in conns:
            c.close()


def test_invalid_property_filter_is_refused(daemon):
    c = connect(daemon.url)
    try:
        bad = {symbol("props"): Described(PROPS, {symbol("content-type"): "text/plain"})}  # must be a symbol
        with pytest.raises(LinkDetached) as e:
            c.create_receiver(daemon.forms[1].format(f"fxbad{uuid.uuid4().hex[:6]}"), options=Filter(bad))
        text = str(e.value)
        assert "amqp:invalid-field" in text and "content-type takes a symbol value" in text
    finally:
        c.close()


@pytest.mark.node
def test_rhea_property_filters(daemon):
    """rhea (an independent AMQP 1.0 implementation) attaches with both property filters."""

    queue = daemon.forms[1].format(f"fxr{uuid.uuid4().hex[:8]}")
    rhea_publish_regions(daemon.port, queue)
    lines = run_js("receive.js", str(daemon.port), queue, 'props:{"subject": "&p:eu."}', "5", "8000")
    assert lines[0]["attached"]["filter_keys"] == ["props"]
    assert "AMQP_FILTEX_PROP_V1_0" in lines[0]["attached"]["capabilities"]
    assert sorted(x["message"]["body"] for x in lines if "message" in x) == ["m1", "m3", "m5", "m7", "m9"]
    lines = run_js("receive.js", str(daemon.port), queue, 'app:{"total": 40}', "1", "8000")
    assert lines[0]["attached"]["filter_keys"] == ["app"]
    assert [x["message"]["body"] for x in lines if "message" in x] == ["m4"]
    # the rest (us. subjects but m4) is still in the queue: nothing was consumed for not matching
    lines = run_js("receive.js", str(daemon.port), queue, "-", "4", "8000")
    assert sorted(x["message"]["body"] for x in lines if "message" in x) == ["m0", "m2", "m6", "m8"]
