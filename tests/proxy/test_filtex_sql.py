"""The OASIS SQL filter (amqp-sql) through the daemon, on the embedded broker and on RabbitMQ: exact
echoes and exact sets on a topic (symbolic and numeric descriptors), competing SQL consumers on a
queue (exact and lossless), refusal of an invalid expression naming problem and position, rhea."""

from __future__ import annotations

import uuid

import pytest
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter
from proton.utils import LinkDetached

from clients import connect, receive_until_quiet, rhea_publish_regions, run_js

SQL = symbol("amqp:sql-filter")
SQL_CODE = ulong(0x120)


def messages(n=12):
    # subject "eu.<i>" or "us.<i>"; priority i % 10; application properties total = i * 10, region
    return [Message(id=f"m{i}", body=i, subject=("eu." if i % 2 else "us.") + str(i), priority=i % 10,
                    properties={"total": i * 10, "region": "eu" if i % 2 else "us"}) for i in range(n)]


def _echo(receiver):
    echoed = receiver.link.remote_source.filter
    echoed.rewind()
    echoed.next()
    return echoed.get_object()


def _drain(r, n):
    return [m.body for m in receive_until_quiet(r, at_most=n, idle=5, limit=20)] + [m.body for m in receive_until_quiet(r, idle=0.5, limit=2)]


def test_topic_exact_sets_and_echoes(daemon):
    topic = daemon.forms[0].format(f"sq{uuid.uuid4().hex[:8]}")
    cases = [
        ({symbol("sql"): Described(SQL, "p.subject LIKE 'eu.%' AND total >= 50")}, {5, 7, 9, 11}),
        ({symbol("s2"): Described(SQL_CODE, "total % 40 = 0 OR [region] != \"eu\" AND h.priority > 7")}, {0, 4, 8}),
        # beside a JMS selector and a property filter on one link: all must hold
        ({symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), "total < 100"),
          symbol("props"): Described(symbol("amqp:properties-filter"), {symbol("subject"): "&p:us."}),
          symbol("sql"): Described(SQL, "total / 20 IN (1, 2, 3, 4)")}, {2, 4, 6, 8}),
    ]
    conns = [connect(daemon.url) for _ in range(len(cases) + 1)]
    try:
        receivers = []
        for conn, (filters, _) in zip(conns, cases):
            r = conn.create_receiver(topic, credit=50, options=Filter(filters))
            assert _echo(r) == filters  # exactly the filters applied, under the client's keys
            receivers.append(r)
        caps = receivers[0].link.remote_source.capabilities
        caps.rewind()
        caps.next()
        assert "AMQP_FILTEX_SQL_V1_0" in {str(c) for c in caps.get_object()}
        assert "AMQP_FILTEX_SQL_V1_0" in {str(c) for c in conns[0].conn.remote_offered_capabilities}
        sender = conns[-1].create_sender(topic)
        for m in messages():
            sender.send(m)
        for r, (_, want) in zip(receivers, cases):
            assert sorted(_drain(r, len(want))) == sorted(want)
    finally:
        for c in conns:
            c.close()


def test_competing_sql_consumers_on_a_queue_exact_and_lossless(daemon):
    queue = daemon.forms[1].format(f"sqq{uuid.uuid4().hex[:8]}")
    conns = [connect(daemon.url) for _ in range(3)]
    try:
        eu = conns[0].create_receiver(queue, credit=50, options=Filter({symbol("a"): Described(SQL, "region = 'eu'")}))
        us = conns[1].create_receiver(queue, credit=50, options=Filter({symbol("b"): Described(SQL_CODE, "NOT (region = 'eu')")}))
        sender = conns[2].create_sender(queue)
        for m in messages(20):
            sender.send(m)
        got_eu, got_us = _drain(eu, 10), _drain(us, 10)
        assert sorted(got_eu) == [i for i in range(20) if i % 2]
        assert sorted(got_us) == [i for i in range(20) if not i % 2]
    finally:
        for c in conns:
            c.close()


def test_invalid_sql_filter_is_refused(daemon):
    c = connect(daemon.url)
    try:
        # a JMS selector would take `total BETWEEN 1 AND 2`; the SQL filter is always amqp-sql
        bad = {symbol("sql"): Described(SQL, "total BETWEEN 1 AND 2")}
        with pytest.raises(LinkDetached) as e:
            c.create_receiver(daemon.forms[1].format(f"sqbad{uuid.uuid4().hex[:6]}"), options=Filter(bad))
        text = str(e.value)
        assert "amqp:invalid-field" in text and "no BETWEEN" in text and "column 7" in text, text
        assert "Error" not in text.replace("LinkDetached", "")
    finally:
        c.close()


@pytest.mark.node
def test_rhea_sql_filter(daemon):
    queue = daemon.forms[1].format(f"sqr{uuid.uuid4().hex[:8]}")
    rhea_publish_regions(daemon.port, queue)
    lines = run_js("receive.js", str(daemon.port), queue, "sql:p.subject LIKE 'eu.%' AND total > 40", "3", "8000")
    assert lines[0]["attached"]["filter_keys"] == ["sql"]
    assert "AMQP_FILTEX_SQL_V1_0" in lines[0]["attached"]["capabilities"]
    assert sorted(x["message"]["body"] for x in lines if "message" in x) == ["m5", "m7", "m9"]
    lines = run_js("receive.js", str(daemon.port), queue, "-", "7", "8000")
    assert sorted(x["message"]["body"] for x in lines if "message" in x) == ["m0", "m1", "m2", "m3", "m4", "m6", "m8"]
