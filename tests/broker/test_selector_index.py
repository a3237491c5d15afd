"""Queue consumers with real compiled selectors: the equality index never changes a result."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from broker_filter.amqp.types import symbol
from broker_filter.broker import Broker, BrokerConfig, EqualityHint, equality_hint
from broker_filter.filters import compile_selector
from broker_filter.amqp.message import Message

from brokerkit import dispatch_all


@pytest.mark.parametrize(
    "text,hint",
    [
        ("color = 'red'", EqualityHint("color", frozenset({"red"}))),
        ("'red' = color AND n > 3", EqualityHint("color", frozenset({"red"}))),
        ("k IN ('a', 'b') AND x = 'y'", EqualityHint("x", frozenset({"y"}))),
        ("k IN ('a', 'b')", EqualityHint("k", frozenset({"a", "b"}))),
        ("color = 'red' OR n = 1", None),
        ("NOT color = 'red'", None),
        ("k NOT IN ('a')", None),
        ("n = 5", EqualityHint("n", frozenset({5}))),
        ("n = 5.0", None),
        ("n = -5", EqualityHint("n", frozenset({-5}))),
        ("JMSType = 'car'", None),
        ("color <> 'red'", None),
    ],
)
def test_equality_hints_only_where_sound(text, hint):
    assert equality_hint(compile_selector(text)) == hint


def test_no_hint_for_dialects_with_conversions():
    f = compile_selector("convert_string_expressions:color = 'red'", dialect="artemis")
    assert equality_hint(f) is None


VALUES = st.one_of(st.sampled_from(["red", "blue", "x"]), st.sampled_from([symbol("red"), symbol("blue")]),
                   st.integers(-2, 2), st.none(), st.booleans(), st.sampled_from([1.0, b"red"]))
SELECTORS = ["color = 'red'", "color IN ('red', 'blue') AND n > 0", "color = 'red' AND n IS NULL",
             "color = 'blue' AND tag = 'x'", "n > 0", "color = 'red' OR n = 1"]


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(st.fixed_dictionaries({}, optional={"color": VALUES, "n": VALUES, "tag": VALUES}),
                      max_size=40),
    selector=st.sampled_from(SELECTORS),
    releases=st.lists(st.integers(0, 39), max_size=5),
)
def test_indexed_consumer_gets_exactly_what_a_scan_gives(messages, selector, releases):
    """The same queue served with the index and with a plain scan delivers the same messages in
    the same order, including after releases."""

    class Opaque:  # same filter, no AST: forces the scan
        def __init__(self, f):
            self.f, self.reads, self.description = f, f.reads, "opaque"

        def evaluate(self, m, r=None):
            return self.f.evaluate(m, r)

    results = []
    for wrap in (lambda f: f, Opaque):
        broker = Broker(BrokerConfig())
        for i, props in enumerate(messages):
            broker.publish("q", b"", message=Message(application_properties=dict(props), body=i))
        holder = broker.subscribe("q")
        broker.flow(holder, len(releases))
        held = dispatch_all(broker)
        c = broker.subscribe("q", filter=wrap(compile_selector(selector)))
        broker.flow(c, 3)
        got = [e.message.body for _, e in dispatch_all(broker)]
        for _, e in held:
            broker.settle(holder, e, "released")
        broker.close_consumer(holder)
        broker.flow(c, 10**6)
        got += [e.message.body for _, e in dispatch_all(broker)]
        results.append(got)
        if wrap is not Opaque:
            assert c.hint == equality_hint(compile_selector(selector))
    assert results[0] == results[1]


def test_indexed_consumer_skips_non_candidates():
    broker = Broker(BrokerConfig())
    for i in range(20_000):
        broker.publish("q", b"", message=Message(application_properties={"id": f"m{i}"}, body=i))
    c = broker.subscribe("q", filter=compile_selector("id = 'm19999'"))
    broker.flow(c, 5)
    assert [e.message.body for _, e in dispatch_all(broker)] == [19999]
    assert c.evaluations == 1
    broker.publish("q", b"", message=Message(application_properties={"id": "m19999"}, body="again"))
    assert [e.message.body for _, e in dispatch_all(broker)] == ["again"] and c.evaluations == 2


def test_index_is_maintained_while_used_and_dropped_after():
    broker = Broker(BrokerConfig())
    q = broker.declare_queue("q")
    a = broker.subscribe("q", filter=compile_selector("k = 'a'"))
    b = broker.subscribe("q", filter=compile_selector("k = 'b' AND z = 'z'"))
    assert set(q._indexes) == {"k", "z"} or set(q._indexes) == {"k"}
    broker.close_consumer(a)
    broker.close_consumer(b)
    assert q._indexes == {}


def test_random_mix_of_indexed_and_scanning_consumers_keeps_oldest_first():
    rng = random.Random(3)
    broker = Broker(BrokerConfig())
    sels = ["k = 'a'", "k IN ('a', 'b')", "n > 5", "k = 'b' AND n < 5"]
    consumers = [broker.subscribe("q", filter=compile_selector(s)) for s in sels]
    published = []
    for step in range(2000):
        n = len(published)
        props = {"k": rng.choice("abc"), "n": rng.randint(0, 10)}
        broker.publish("q", b"", message=Message(application_properties=props, body=n))
        published.append(props)
        c = rng.choice(consumers)
        queue = broker.queues["q"]
        before = sorted(e.seq for e in queue.entries() if e.holder is None)
        broker.flow(c, c.credit + 1)
        got = dispatch_all(broker)
        for who, e in got:
            for seq in before:
                if seq < e.seq:
                    other = queue._entries.get(seq)
                    assert other is None or other.holder is not None or not who.filter.matches(other.message)
        for who, e in got:
            broker.settle(who, e, rng.choice(["accepted", "released"]))


def test_no_local_filter_set_uses_the_origin_annotation_and_receiver_identity():
    from broker_filter.filters import ORIGIN_ANNOTATION, compile_filter_set

    fs = compile_filter_set({"no-local": {"descriptor": "apache.org:no-local-filter:list", "value": []}})
    broker = Broker(BrokerConfig())
    s = broker.subscribe("t", capabilities=["topic"], filter=fs, receiver="inst/c1")
    for origin in ("inst/c1", "inst/c2"):
        broker.publish("t", b"", capabilities=["topic"],
                       message=Message(message_annotations={ORIGIN_ANNOTATION: origin}, body=origin))
    broker.flow(s, 5)
    assert [e.message.body for _, e in dispatch_all(broker)] == ["inst/c2"]
