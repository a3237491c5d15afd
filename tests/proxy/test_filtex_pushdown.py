"""Filter expressions (OASIS filtex) pushed down as the attach reply decides.

Every upstream consumer attach carries the client's property and SQL filters; the upstream
evaluates one only when its attach reply offers the filter's capability AND echoes the filter under
the client's key.  Counted at the front daemon: `messages_received` is what crossed the upstream
connection, so it tells who filtered."""

from __future__ import annotations

import time
import uuid

import pytest
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter

from clients import connect, declare_queue, delete_queue, receive_until_quiet
from launcher import Daemon, free_port, metric_value, scrape

PROPS = symbol("amqp:properties-filter")
APP = ulong(0x174)
SQL = symbol("amqp:sql-filter")


def messages(n=12):
    # subject "eu.<i>" or "us.<i>"; application properties region and total = i * 10
    return [Message(id=f"m{i}", body=i, subject=("eu." if i % 2 else "us.") + str(i),
                    properties={"total": i * 10, "region": "eu" if i % 2 else "us"}) for i in range(n)]


def collect(r, want):
    got = [m.body for m in receive_until_quiet(r, at_most=len(want), idle=5, limit=20)]
    return sorted(got + [m.body for m in receive_until_quiet(r, idle=0.5, limit=2)])


def counted(mport, address, name, at_least, limit=10.0):
    deadline = time.monotonic() + limit
    while True:
        n = metric_value(scrape(mport), name, address=address)
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


def pushdown(mport, kind, result):
    return metric_value(scrape(mport), "broker_filter_filter_pushdown_total", kind=kind, result=result)


@pytest.fixture
def chained():
    """A daemon (with metrics) whose upstream is another broker-filter (its embedded broker)."""
    upstream = Daemon()
    mport = free_port()
    front = Daemon("--metrics", f"127.0.0.1:{mport}", upstream=upstream.url)
    front.mport = mport
    yield front
    front.stop()
    upstream.stop()
    assert "Traceback" not in front.log() + upstream.log()


def test_chained_broker_filter_evaluates_the_pushed_filters_on_a_topic(chained):
    topic = f"multicast://fxp{uuid.uuid4().hex[:8]}"
    conns = [connect(chained.url) for _ in range(3)]
    try:
        f_props = {symbol("p"): Described(PROPS, {symbol("subject"): "&p:eu."})}
        f_sql = {symbol("s"): Described(SQL, "total >= 60 AND region = 'us'")}
        r_props = conns[0].create_receiver(topic, credit=50, options=Filter(f_props))
        r_sql = conns[1].create_receiver(topic, credit=50, options=Filter(f_sql))
        sender = conns[2].create_sender(topic)
        for m in messages():
            sender.send(m)
        assert collect(r_props, [1, 3, 5, 7, 9, 11]) == [1, 3, 5, 7, 9, 11]
        assert collect(r_sql, [6, 8, 10]) == [6, 8, 10]
        # only the matches crossed the upstream connection: 6 + 3 of 2 x 12
        assert counted(chained.mport, topic, "broker_filter_messages_forwarded_total", 9) == 9
        text = scrape(chained.mport)
        assert metric_value(text, "broker_filter_messages_received_total", address=topic) == 9
        assert metric_value(text, "broker_filter_messages_filtered_out_total", address=topic) == 0
        assert pushdown(chained.mport, "properties", "upstream") == 1
        assert pushdown(chained.mport, "sql", "upstream") == 1
        assert pushdown(chained.mport, "sql", "local") == 0
        assert "evaluates properties filter p on" in chained.log()
    finally:
        for c in conns:
            c.close()


def test_chained_queue_links_with_other_filters_never_share_a_pushed_down_feed(chained):
    """Two competing links on one queue with different filters: each upstream consumer asks for
    its own link's filter, so neither gets what the upstream selected for the other; lossless."""
    queue = f"anycast://fxq{uuid.uuid4().hex[:8]}"
    conns = [connect(chained.url) for _ in range(4)]
    try:
        eu = conns[0].create_receiver(queue, credit=50, options=Filter({symbol("p"): Described(PROPS, {symbol("subject"): "&p:eu."})}))
        us = conns[1].create_receiver(queue, credit=50, options=Filter({symbol("a"): Described(APP, {"region": "us"})}))
        eu2 = conns[2].create_receiver(queue, credit=50, options=Filter({symbol("p"): Described(PROPS, {symbol("subject"): "&p:eu."})}))
        sender = conns[3].create_sender(queue)
        for m in messages(20):
            sender.send(m)
        got_eu = [m.body for r in (eu, eu2) for m in receive_until_quiet(r, idle=1.5, limit=20)]
        assert sorted(got_eu) == [i for i in range(20) if i % 2]
        assert collect(us, list(range(0, 20, 2))) == list(range(0, 20, 2))
        text = scrape(chained.mport)
        assert metric_value(text, "broker_filter_messages_received_total", address=queue) == 20  # each once
        assert metric_value(text, "broker_filter_messages_filtered_out_total", address=queue) == 0
        assert pushdown(chained.mport, "properties", "upstream") == 1  # eu and eu2 share one feed
        assert pushdown(chained.mport, "application-properties", "upstream") == 1
    finally:
        for c in conns:
            c.close()


@pytest.mark.rabbitmq
@pytest.mark.parametrize("form", ["/queue/{}", "/topic/{}", "stream"])
def test_rabbitmq_echoes_without_the_capability_so_the_filters_stay_local(rabbitmq_broker, form):
    """RabbitMQ 3.10 and 4.0 echo filter expressions (queue, topic, a 4.0 stream) and offer no
    capability for them: the daemon evaluates them, exact sets, nothing refused."""
    name = f"fxr{uuid.uuid4().hex[:8]}"
    if form == "stream":
        if rabbitmq_broker.major < 4:
            pytest.skip("RabbitMQ 3.10 has no AMQP 1.0 access to streams")
        declare_queue(rabbitmq_broker.url, name, "stream")
        address = f"/queues/{name}"
    else:
        address = form.format(name)
    mport = free_port()
    front = Daemon("--metrics", f"127.0.0.1:{mport}", upstream=rabbitmq_broker.url)
    conns = [connect(front.url) for _ in range(3)]
    try:
        f_both = {symbol("p"): Described(PROPS, {symbol("subject"): "&p:eu."}),
                  symbol("s"): Described(SQL, "total >= 60")}
        r = conns[0].create_receiver(address, credit=50, options=Filter(f_both))
        echoed = r.link.remote_source.filter
        echoed.rewind()
        echoed.next()
        assert echoed.get_object() == f_both
        sender = conns[1].create_sender(address)
        for m in messages():
            sender.send(m)
        assert collect(r, [7, 9, 11]) == [7, 9, 11]
        if form == "/queue/{}":
            r.close()  # a queue keeps what the link did not select, for other consumers
            rest = conns[2].create_receiver(address, credit=50)
            assert collect(rest, [0, 1, 2, 3, 4, 5, 6, 8, 10]) == [0, 1, 2, 3, 4, 5, 6, 8, 10]
        elif form == "stream":  # every message crossed the upstream connection (a stream keeps them all)
            assert counted(mport, address, "broker_filter_messages_received_total", 12) >= 12
        else:  # a subscription of the link's own: every message crossed, the daemon filtered
            assert counted(mport, address, "broker_filter_messages_filtered_out_total", 9) == 9
            assert metric_value(scrape(mport), "broker_filter_messages_received_total", address=address) == 12
        assert pushdown(mport, "properties", "local") == 1 and pushdown(mport, "sql", "local") == 1
        assert pushdown(mport, "properties", "upstream") == 0 and pushdown(mport, "sql", "upstream") == 0
    finally:
        for c in conns:
            c.close()
        front.stop()
        if form == "stream":
            _delete(rabbitmq_broker.url, name)
    assert "Traceback" not in front.log()


def _delete(url, name):
    try:
        delete_queue(url, name)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


@pytest.mark.rabbitmq
@pytest.mark.rabbitmq_latest
def test_rabbitmq_stream_evaluates_the_filters_its_attach_reply_offers(rabbitmq_latest):
    """RabbitMQ 4.1+ offers AMQP_FILTEX_PROP_V1_0 and AMQP_FILTEX_SQL_V1_0 on a stream's attach reply
    and echoes what it applies (one property filter per section, or SQL alone, and SQL only under the
    key `sql-filter`): those are pushed down, and only their matches cross the upstream connection.
    A SQL filter under another key is not echoed although the capability is offered, and a classic
    queue echoes the filter without the capability: both evaluated in the daemon."""
    url = rabbitmq_latest.url
    stream, classic = f"fxs{uuid.uuid4().hex[:8]}", f"fxc{uuid.uuid4().hex[:8]}"
    declare_queue(url, stream, "stream")
    declare_queue(url, classic, "classic")
    mport = free_port()
    front = Daemon("--metrics", f"127.0.0.1:{mport}", upstream=url)
    conns = [connect(front.url) for _ in range(4)]
    try:
        on_stream = f"/queues/{stream}"
        r_props = conns[0].create_receiver(on_stream, credit=50, options=Filter(
            {symbol("p"): Described(PROPS, {symbol("subject"): "&p:eu."}), symbol("a"): Described(APP, {"total": 70})}))
        r_sql = conns[1].create_receiver(on_stream, credit=50, options=Filter(
            {symbol("sql-filter"): Described(SQL, "total >= 60 AND p.subject LIKE 'us.%'")}))
        r_other_key = conns[2].create_receiver(on_stream, credit=50, options=Filter(
            {symbol("s"): Described(SQL, "total = 110")}))
        on_queue = f"/queues/{classic}"
        r_queue = conns[2].create_receiver(on_queue, credit=50, options=Filter({symbol("s"): Described(SQL, "total = 30")}))
        s_stream, s_queue = conns[3].create_sender(on_stream), conns[3].create_sender(on_queue)
        for m in messages():
            s_stream.send(m)
        for m in messages():
            s_queue.send(m)
        assert collect(r_props, [7]) == [7]
        assert collect(r_sql, [6, 8, 10]) == [6, 8, 10]
        assert collect(r_other_key, [11]) == [11]
        assert collect(r_queue, [3]) == [3]
        # the stream sent the first two links only their matches (1 + 3), the third every message (12)
        assert counted(mport, on_stream, "broker_filter_messages_filtered_out_total", 11) == 11
        text = scrape(mport)
        assert metric_value(text, "broker_filter_messages_received_total", address=on_stream) == 1 + 3 + 12
        assert metric_value(text, "broker_filter_messages_forwarded_total", address=on_stream) == 1 + 3 + 1
        assert metric_value(text, "broker_filter_messages_received_total", address=on_queue) >= 12  # not pushed
        assert pushdown(mport, "properties", "upstream") == 1
        assert pushdown(mport, "application-properties", "upstream") == 1
        assert pushdown(mport, "sql", "upstream") == 1
        assert pushdown(mport, "sql", "local") == 2  # key `s` on the stream, and the classic queue's
        assert f"evaluates sql filter sql-filter on {on_stream}" in front.log()
    finally:
        for c in conns:
            c.close()
        front.stop()
        _delete(url, stream)
        _delete(url, classic)
    assert "Traceback" not in front.log()


# ---------------------------------------------------------------------------- the rule, on its own
def _entries(filters):
    from broker_filter.amqp.types import Described as D, symbol as sym, ulong as ul
    from broker_filter.filters import compile_filter_set

    return compile_filter_set({sym(k): D(sym(d) if isinstance(d, str) else ul(d), v) for k, (d, v) in filters.items()},
                              "amqp-sql").entries


def test_reply_rule_needs_the_capability_and_the_echo_under_the_key():
    from broker_filter.amqp.types import Described as D, symbol as sym
    from broker_filter.proxy.upstream import evaluated_offers

    props, sql = _entries({"p": ("amqp:properties-filter", {sym("subject"): "a"}), "sql-filter": (0x120, "n > 1")})
    both = ("AMQP_FILTEX_PROP_V1_0", "AMQP_FILTEX_SQL_V1_0")
    echo = {sym("p"): props.value, sym("sql-filter"): sql.value}
    assert evaluated_offers((props, sql), both, echo) == (props, sql)
    assert evaluated_offers((props, sql), (), echo) == ()  # the echo alone proves nothing
    assert evaluated_offers((props, sql), ("AMQP_FILTEX_SQL_V1_0",), echo) == (sql,)
    assert evaluated_offers((props, sql), both, {sym("p"): props.value}) == (props,)  # SQL left out
    assert evaluated_offers((props, sql), both, {sym("p"): D(sym("amqp:properties-filter"), {sym("subject"): "b"})},
                            ) == ()  # another value under the key
    assert evaluated_offers((props,), both, None) == ()


def test_attach_reply_capabilities_are_read_from_the_frame_trace():
    """RabbitMQ 4.1+ puts the filter capabilities in the attach's own offered-capabilities, which
    python-qpid-proton does not expose: the upstream reads them from proton's frame trace (this line
    is one, as proton prints a RabbitMQ 4.3 stream's attach reply)."""
    from broker_filter.proxy.remote import RemoteUpstream

    up = RemoteUpstream("amqp://127.0.0.1:1")
    waiting = type("Consumer", (), {"offer_pending": True})
    up._endpoints = {'c"q\'1-1': waiting(), "other-2": waiting(), "publisher-3": object()}
    up._on_trace(None, 'FRAME: 0 <- @attach(18) [name="c\\x22q\\x271-1", handle=0x0, role=false, '
                 'source=@source(40) [address="/queues/s", filter={:p=@:"amqp:properties-filter" {:subject="x"}}, '
                 'outcomes=@<symbol>[:"amqp:accepted:list", :"amqp:released:list"]], initial-delivery-count=0x0, '
                 'offered-capabilities=@<symbol>[:"AMQP_FILTEX_PROP_V1_0", :"AMQP_FILTEX_SQL_V1_0"]]')
    up._on_trace(None, 'FRAME: 0 <- @attach(18) [name="other-2", handle=0x1, role=false, '
                 'offered-capabilities=:AMQP_FILTEX_PROP_V1_0]')
    for name in ("unknown-4", "publisher-3"):
        up._on_trace(None, f'FRAME: 0 <- @attach(18) [name="{name}", handle=0x2, role=true, '
                     'offered-capabilities=:AMQP_FILTEX_PROP_V1_0]')
    assert up._traced == {'c"q\'1-1': {"AMQP_FILTEX_PROP_V1_0", "AMQP_FILTEX_SQL_V1_0"},
                          "other-2": {"AMQP_FILTEX_PROP_V1_0"}}
