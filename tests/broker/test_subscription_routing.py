"""Multicast routing through the subscription index: for random filter sets and messages, the
subscriptions that receive a published message are exactly those whose filter selects it (index on
and off, cache on and off), including wildcard subscriptions, no-local and subscriptions that come
and go; and a publish to 10,000 filtered subscriptions evaluates only the candidates."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker_filter.broker import Broker, BrokerConfig
from broker_filter.filters import compile_selector

sys.path.insert(0, str(Path(__file__).parent.parent / "core"))
import test_subscription_index as T  # noqa: E402  (the filter and message strategies of the index tests)

from brokerkit import FnFilter  # noqa: E402

VARIANTS = [(True, 64), (True, 0), (False, 0)]


def brokers():
    return [Broker(BrokerConfig(default_routing_type="multicast", subscription_index=indexed, index_cache_size=cache))
            for indexed, cache in VARIANTS]


def expected(f, message, receiver):
    return T.expected(f, message, receiver)


def received(broker, consumers):
    """Which consumers got a message since the last call (their queues are emptied)."""
    got = []
    for i, c in consumers.items():
        q = c.queue
        if len(q):
            got.append(i)
            q.purge()
    return got


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(T.filters(), st.none()), min_size=1, max_size=10),
       st.lists(T.index_messages(), min_size=1, max_size=5), st.lists(st.booleans(), max_size=10))
@example(T.TYPED_FILTERS, T.TYPED_MESSAGES, [True, False, True])
def test_subscriptions_receive_exactly_what_their_filter_selects(filter_list, messages, drop_mask):
    runs = []
    for broker in brokers():
        consumers = {}
        for i, f in enumerate(filter_list):
            address = "orders" if i % 4 else ("orders.#", "*", "#")[i % 3]  # every fourth: a wildcard subscription
            consumers[i] = broker.subscribe(address, filter=f, receiver="me" if i % 3 == 0 else None)
        runs.append((broker, consumers))

    def check():
        for m in messages + messages:
            want = [i for i, c in runs[0][1].items() if expected(filter_list[i], m, c.queue.filter_receiver)]
            for broker, consumers in runs:
                assert broker.publish("orders", b"", message=m) == len(want)
                assert received(broker, consumers) == want

    check()
    for broker, consumers in runs:
        for i, d in zip(sorted(consumers), drop_mask):
            if d:
                broker.close_consumer(consumers.pop(i))
    check()
    for broker, consumers in runs:
        for i, f in enumerate(filter_list[:3]):
            if i not in consumers:
                consumers[i] = broker.subscribe("orders", filter=f, receiver="me" if i % 3 == 0 else None)
    check()


def test_ten_thousand_subscriptions_evaluate_only_candidates():
    broker = Broker(BrokerConfig(default_routing_type="multicast"))
    counted = []
    for i in range(10_000):
        broker.subscribe("orders", filter=compile_selector(f"customer = 'c{i}'"))
    like = FnFilter(lambda m, r: (m.application_properties or {}).get("customer", "").startswith("c99"))
    broker.subscribe("orders", filter=like)  # no indexable part: evaluated every time
    index = broker.addresses["orders"].index
    for i in (5, 9_990, 77):
        m = T._message_of(customer=f"c{i}")
        counted.append(broker.publish("orders", b"", message=m))
    assert counted == [1, 2, 1]
    assert like.calls == 3
    stats = index.stats()
    assert stats["filters"] == 10_001 and stats["evaluations_per_message"] == 2.0
    assert broker.stats()["addresses"]["orders"]["subscription_index"] == stats


def test_wildcard_subscriptions_are_indexed_per_pattern():
    broker = Broker(BrokerConfig(default_routing_type="multicast"))
    filters = {}
    for i in range(1000):
        f = FnFilter(lambda m, r, i=i: (m.application_properties or {}).get("customer") == f"c{i}")
        f.terms = (("jms", "customer", f"c{i}"),)  # as a compiled `customer = 'c<i>'` offers
        filters[i] = f
        broker.subscribe(("orders.#", "#")[i % 2], filter=f)
    plain = broker.subscribe("orders.eu", filter=FnFilter(lambda m, r: True))
    assert broker.publish("orders.eu", b"", message=T._message_of(customer="c7")) == 2
    assert sum(f.calls for f in filters.values()) == 1 and len(plain.queue) == 1
    assert broker.publish("orders.eu", b"", message=T._message_of(customer="c8")) == 2
    for c in [c for q in list(broker.queues.values()) if q.address.name == "#" for c in q.consumers]:
        broker.close_consumer(c)  # the pattern's last subscription takes the pattern with it
    assert broker.publish("orders.eu", b"", message=T._message_of(customer="c7")) == 1  # c7 was on `#`
    assert list(broker._wildcards.patterns()) == ["orders.#"]


def test_topic_bindings_split_on_dots_whatever_the_address_delimiter():
    broker = Broker(BrokerConfig(default_routing_type="multicast", delimiter="/"))
    topic = T._fs(topic="orders.*")
    c = broker.subscribe("orders", filter=topic)
    assert broker.publish("orders", b"", message=T._message_of(subject="orders.eu")) == 1
    assert broker.publish("orders", b"", message=T._message_of(subject="orders/eu")) == 0
    assert len(c.queue) == 1


def test_index_off_evaluates_every_subscription():
    broker = Broker(BrokerConfig(default_routing_type="multicast", subscription_index=False))
    filters = [FnFilter(lambda m, r, i=i: (m.application_properties or {}).get("customer") == f"c{i}") for i in range(50)]
    for f in filters:
        broker.subscribe("orders", filter=f)
    assert broker.publish("orders", b"", message=T._message_of(customer="c3")) == 1
    assert sum(f.calls for f in filters) == 50
