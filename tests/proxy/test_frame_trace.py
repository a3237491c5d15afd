"""Answers read from proton's frame trace (broker_filter.proxy.frametrace), on trace lines as
proton's tracer handed them to a Python tracer: RabbitMQ 4.0's and 3.10's answers to a drain without
credit on a queue holding 6 messages and their attach replies (captured from the brokers the tests
use), and a RabbitMQ 4.3 stream's attach reply (as in tests/proxy/test_filtex_pushdown.py)."""

from __future__ import annotations

import pytest

from broker_filter.proxy.frametrace import parse_attach_capabilities, parse_available

R4_DRAIN = ("FRAME: 0 <- @flow(19) [next-incoming-id=0x0, incoming-window=0x190, next-outgoing-id=0xfffffffc, "
            "outgoing-window=0xffffffff, handle=0x0, delivery-count=0xfffffffb, link-credit=0x0, available=0x6, "
            "drain=true]")
R3_DRAIN = ("FRAME: 0 <- @flow(19) [next-incoming-id=0x0, incoming-window=0xffff, next-outgoing-id=0x0, "
            "outgoing-window=0xffff, handle=0x0, delivery-count=0x0, link-credit=0x0, available=0x6, drain=true]")
R4_CREDIT = ("FRAME: 0 <- @flow(19) [next-incoming-id=0x0, incoming-window=0x190, next-outgoing-id=0xfffffffc, "
             "outgoing-window=0xffffffff, handle=0x0, delivery-count=0x0, link-credit=0xaa]")
R3_CREDIT = ("FRAME: 0 <- @flow(19) [next-incoming-id=0x0, incoming-window=0xffff, next-outgoing-id=0x0, "
             "outgoing-window=0xffff, handle=0x0, link-credit=0x10000, drain=false, echo=false]")
R4_ATTACH = ('FRAME: 0 <- @attach(18) [name="81635ae4-d6d4-4e5a-8522-c154c9c84595-/queue/bf-trace-probe-5682", '
             'handle=0x0, role=false, snd-settle-mode=0x0, rcv-settle-mode=0x0, source=@source(40) '
             '[address="/queue/bf-trace-probe-5682", durable=0x0, timeout=0x0, dynamic=false, '
             'default-outcome=@released(38) [], outcomes=@<symbol>[:"amqp:accepted:list", :"amqp:rejected:list", '
             ':"amqp:released:list", :"amqp:modified:list"]], initial-delivery-count=0xfffffffb, max-message-size=0x0]')
R3_ATTACH = ('FRAME: 0 <- @attach(18) [name="cb07f762-ffe7-40ea-b52b-b69961a89378-/queue/bf-trace-probe-5672", '
             'handle=0x0, role=false, snd-settle-mode=0x0, rcv-settle-mode=0x0, source=@source(40) '
             '[address="/queue/bf-trace-probe-5672", durable=0x0, timeout=0x0, dynamic=false, '
             'default-outcome=@released(38) [], outcomes=@<symbol>[:"amqp:accepted:list", :"amqp:rejected:list", '
             ':"amqp:released:list"]], initial-delivery-count=0x0]')
R43_STREAM_ATTACH = (
    'FRAME: 0 <- @attach(18) [name="c\\x22q\\x271-1", handle=0x0, role=false, '
    'source=@source(40) [address="/queues/s", filter={:p=@:"amqp:properties-filter" {:subject="x"}}, '
    'outcomes=@<symbol>[:"amqp:accepted:list", :"amqp:released:list"]], initial-delivery-count=0x0, '
    'offered-capabilities=@<symbol>[:"AMQP_FILTEX_PROP_V1_0", :"AMQP_FILTEX_SQL_V1_0"]]')
# What the proxy sends itself: the same frames outgoing (`->`), never an answer
OUTGOING_DRAIN = R4_DRAIN.replace("<-", "->")
OUTGOING_ATTACH = R43_STREAM_ATTACH.replace("<-", "->")


@pytest.mark.parametrize("line, count", [
    (R4_DRAIN, 6),
    (R3_DRAIN, 6),
    (R4_DRAIN.replace("available=0x6", "available=0x1f4"), 500),
    (R4_DRAIN.replace("available=0x6", "available=12"), 12),
    (R4_DRAIN.replace("available=0x6", "available=0x0"), 0),
    (R4_CREDIT, None),  # a flow granting credit to a publisher: no count
    (R3_CREDIT, None),
    (R4_DRAIN.replace("drain=true", "drain=false"), None),  # not the answer to a drain
    (OUTGOING_DRAIN, None),
    (R4_ATTACH, None),
])
def test_parse_available(line, count):
    assert parse_available(line) == count


@pytest.mark.parametrize("line, parsed", [
    (R43_STREAM_ATTACH, ('c"q\'1-1', {"AMQP_FILTEX_PROP_V1_0", "AMQP_FILTEX_SQL_V1_0"})),
    (R4_ATTACH, ("81635ae4-d6d4-4e5a-8522-c154c9c84595-/queue/bf-trace-probe-5682", set())),
    (R3_ATTACH, ("cb07f762-ffe7-40ea-b52b-b69961a89378-/queue/bf-trace-probe-5672", set())),
    ('FRAME: 0 <- @attach(18) [name="other-2", handle=0x1, role=false, offered-capabilities=:AMQP_FILTEX_PROP_V1_0]',
     ("other-2", {"AMQP_FILTEX_PROP_V1_0"})),
    ('FRAME: 0 <- @attach(18) [name="q-3", handle=0x1, role=false, offered-capabilities=:"AMQP_FILTEX_SQL_V1_0"]',
     ("q-3", {"AMQP_FILTEX_SQL_V1_0"})),
    ('FRAME: 0 <- @attach(18) [name="caf\\xc3\\xa9-4", handle=0x1, role=false]', ("café-4", set())),
    (OUTGOING_ATTACH, None),
    (R4_DRAIN, None),
])
def test_parse_attach_capabilities(line, parsed):
    got = parse_attach_capabilities(line)
    assert got == (None if parsed is None else (parsed[0], frozenset(parsed[1])))


def test_only_the_attach_own_capabilities_count():
    """A source's capabilities come before the attach's own offered-capabilities: not read as them."""
    line = ('FRAME: 0 <- @attach(18) [name="c-5", handle=0x0, role=false, source=@source(40) '
            '[address="/queues/s", capabilities=@<symbol>[:queue]], initial-delivery-count=0x0]')
    assert parse_attach_capabilities(line) == ("c-5", frozenset())
