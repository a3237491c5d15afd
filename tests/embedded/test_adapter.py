"""The embedded upstream through the proxy's Upstream interface, on a deterministic loop."""

from __future__ import annotations

from collections import deque

from broker_filter.amqp import decode_message, encode_message
from broker_filter.filters.base import Filter, FilterEntry
from broker_filter.proxy.forwarding import ACCEPTED, Outcome
from broker_filter.amqp.message import Message, Properties
from broker_filter.proxy.embedded import EmbeddedUpstream, broker_config
from broker_filter.proxy.upstream import ConsumerHandler, ConsumerSpec, PublisherHandler, UpstreamListener


class StepLoop:
    """The Loop protocol run by hand: call_soon queues, run() drains (what ProtonLoop does per turn)."""

    def __init__(self):
        self.soon = deque()

    def call_soon(self, fn):
        self.soon.append(fn)

    def call_later(self, delay, fn):
        self.soon.append(fn)
        return self

    def cancel(self):
        pass

    def run(self, limit=100_000):
        for _ in range(limit):
            if not self.soon:
                return
            self.soon.popleft()()
        raise AssertionError("loop never went idle")


class Recorder(ConsumerHandler, PublisherHandler, UpstreamListener):
    """Consumer, publisher and upstream listener callbacks, recorded."""

    def __init__(self):
        self.events = []
        self.deliveries = []

    def on_upstream_up(self, upstream):
        self.events.append("up")

    def on_consumer_ready(self, consumer, info):
        self.events.append(("ready", info))

    def on_delivery(self, consumer, delivery):
        self.deliveries.append(delivery)

    def on_consumer_closed(self, consumer, error):
        self.events.append(("closed", error))

    def on_publisher_ready(self, publisher):
        self.events.append("publisher-ready")

    def on_publisher_credit(self, publisher):
        pass

    def on_publisher_closed(self, publisher, error):
        self.events.append(("publisher-closed", error))


def data(body, **props) -> bytes:
    return encode_message(Message(application_properties=props, body=body))


def body(delivery) -> object:
    return decode_message(delivery.data).body


def selector_entry(fn, key="jms-selector") -> FilterEntry:
    return FilterEntry(key, "selector", "apache.org:selector-filter:string", "sel", Filter(fn, frozenset({"application_properties"})), "sel")


def started(**kw):
    loop, rec = StepLoop(), Recorder()
    up = EmbeddedUpstream(**kw)
    up.start(loop, rec)
    loop.run()
    return up, loop, rec


def test_ready_after_start_and_every_filter_kind_but_no_local_is_pushable():
    up, loop, rec = started()
    assert rec.events == ["up"] and up.connected and up.name == "embedded"
    assert up.can_evaluate(selector_entry(lambda m, r: True))
    no_local = FilterEntry("no-local", "no-local", "apache.org:no-local-filter:list", "NoLocalFilter{}", Filter(lambda m, r: True), None)
    assert not up.can_evaluate(no_local)


def test_publish_then_consume_with_pushed_down_selector():
    up, loop, rec = started()
    pub = up.open_publisher("orders", rec)
    outcomes = []
    for i, color in enumerate(["blue", "red", "red"]):
        pub.send(data(i, color=color), outcomes.append)
    consumer = up.open_consumer(
        ConsumerSpec("orders", filters=(selector_entry(lambda m, r: m.application_properties.get("color") == "red"),)),
        rec,
    )
    consumer.flow(10)
    loop.run()
    assert outcomes == [ACCEPTED] * 3
    ready = [e for e in rec.events if isinstance(e, tuple) and e[0] == "ready"]
    assert ready and ready[0][1].filters_applied == ("jms-selector",) and ready[0][1].subscription is False
    assert [body(d) for d in rec.deliveries] == [1, 2]
    assert consumer.credit == 8
    for d in rec.deliveries:
        consumer.settle(d, ACCEPTED)
    loop.run()
    plain = up.open_consumer(ConsumerSpec("orders"), rec)
    plain.flow(5)
    loop.run()
    assert [body(d) for d in rec.deliveries[2:]] == [0]  # the non-match waited for another consumer


def test_released_and_undeliverable_here_through_the_interface():
    up, loop, rec = started()
    pub = up.open_publisher("q", rec)
    pub.send(data("m"), lambda o: None)
    a = up.open_consumer(ConsumerSpec("q"), rec)
    a.flow(5)
    loop.run()
    [d] = rec.deliveries
    a.settle(d, Outcome("modified", delivery_failed=True, undeliverable_here=True))
    loop.run()
    assert len(rec.deliveries) == 1
    b = up.open_consumer(ConsumerSpec("q"), rec)
    b.flow(1)
    loop.run()
    assert len(rec.deliveries) == 2 and rec.deliveries[1].redelivered


def test_limits_refuse_with_resource_limit_exceeded():
    from broker_filter.config import Embedded

    up, loop, rec = started(config=broker_config(Embedded(max_messages=2, max_bytes=0)))
    pub = up.open_publisher("full", rec)
    outcomes = []
    for i in range(3):
        pub.send(data(i), outcomes.append)
    loop.run()
    assert [o.kind for o in outcomes] == ["accepted", "accepted", "rejected"]
    assert outcomes[2].error[0] == "amqp:resource-limit-exceeded"


def test_anonymous_publisher_routes_by_to():
    up, loop, rec = started()
    pub = up.open_publisher(None, rec)
    outcomes = []
    pub.send(encode_message(Message(properties=Properties(to="dest"), body="x")), outcomes.append)
    pub.send(data("no-to"), outcomes.append)
    c = up.open_consumer(ConsumerSpec("dest"), rec)
    c.flow(1)
    loop.run()
    assert [o.kind for o in outcomes] == ["accepted", "rejected"] and [body(d) for d in rec.deliveries] == ["x"]


def test_refused_consumer_reports_closed_not_raises():
    from broker_filter.broker import BrokerConfig

    up, loop, rec = started(config=BrokerConfig(auto_create=False))
    up.open_consumer(ConsumerSpec("missing"), rec)
    loop.run()
    [(kind, error)] = [e for e in rec.events if isinstance(e, tuple)]
    assert kind == "closed" and error.condition == "amqp:not-found"


def test_topic_subscription_and_close_returns_unsettled():
    up, loop, rec = started()
    t1 = up.open_consumer(ConsumerSpec("news", capabilities=("topic",)), rec)
    t1.flow(5)
    loop.run()
    assert [e[1].subscription for e in rec.events if isinstance(e, tuple)] == [True]
    pub = up.open_publisher("multicast://news", rec)
    pub.send(data("n1"), lambda o: None)
    loop.run()
    assert [body(d) for d in rec.deliveries] == ["n1"]
    q = up.open_consumer(ConsumerSpec("work"), rec)
    q.flow(1)
    up.open_publisher("work", rec).send(data("w"), lambda o: None)
    loop.run()
    q.close()  # unsettled goes back
    q2 = up.open_consumer(ConsumerSpec("work"), rec)
    q2.flow(1)
    loop.run()
    assert [body(d) for d in rec.deliveries] == ["n1", "w", "w"]


def test_a_failing_handler_does_not_lose_the_message():
    up, loop, rec = started()

    class Broken(Recorder):
        def on_delivery(self, consumer, delivery):
            raise RuntimeError("handler bug")

    bad = up.open_consumer(ConsumerSpec("q"), Broken())
    bad.flow(1)
    up.open_publisher("q", rec).send(data("kept"), lambda o: None)
    loop.run()
    bad.close()
    good = up.open_consumer(ConsumerSpec("q"), rec)
    good.flow(1)
    loop.run()
    assert [body(d) for d in rec.deliveries] == ["kept"]


def test_bad_addresses_get_clear_errors():
    up, loop, rec = started()
    up.open_consumer(ConsumerSpec("x::"), rec)
    outcomes = []
    up.open_publisher("::q", rec).send(data("m"), outcomes.append)
    loop.run()
    [(kind, error)] = [e for e in rec.events if isinstance(e, tuple)]
    assert kind == "closed" and error.condition == "amqp:invalid-field" and "address::queue" in error.description
    assert outcomes[0].kind == "rejected" and outcomes[0].error[0] == "amqp:invalid-field"


def test_dynamic_source_gets_a_temporary_queue_deleted_with_it():
    up, loop, rec = started()
    c = up.open_consumer(ConsumerSpec(None, dynamic=True), rec)
    c.flow(5)
    loop.run()
    [(kind, info)] = [e for e in rec.events if isinstance(e, tuple)]
    assert kind == "ready" and info.address.startswith("temp.")
    up.open_publisher(info.address, rec).send(data("reply"), lambda o: None)
    loop.run()
    assert [body(d) for d in rec.deliveries] == ["reply"]
    c.close()
    assert info.address not in up.broker.addresses and info.address not in up.broker.queues


def test_an_internal_failure_ends_one_link_with_an_answer():
    up, loop, rec = started()

    bad_entry = FilterEntry("k", "selector", "apache.org:selector-filter:string", "v", None, "v")
    object.__setattr__(bad_entry, "filter", None)  # FilterSet cannot combine this entry
    up.open_consumer(ConsumerSpec("q", filters=(bad_entry,)), rec)
    good = up.open_consumer(ConsumerSpec("q"), rec)
    good.flow(1)
    up.open_publisher("q", rec).send(data("fine"), lambda o: None)
    loop.run()
    closed = [e for e in rec.events if isinstance(e, tuple) and e[0] == "closed"]
    assert closed and closed[0][1].condition == "amqp:internal-error"
    assert [body(d) for d in rec.deliveries] == ["fine"]


def test_the_embedded_broker_holds_at_most_max_total_bytes_over_every_address():
    """Per-address caps do not bound many addresses: `embedded.max_total_bytes` does."""
    from broker_filter.config import Embedded

    one = len(data(0))
    up, loop, rec = started(config=broker_config(Embedded(max_total_bytes=3 * one)))
    outcomes = []
    for i in range(4):  # four addresses, one message each: the fourth is over the whole broker's cap
        up.open_publisher(f"addr{i}", rec).send(data(i), outcomes.append)
    loop.run()
    assert [o.kind for o in outcomes] == ["accepted"] * 3 + ["rejected"]
    condition, description = outcomes[3].error
    assert condition == "amqp:resource-limit-exceeded" and "embedded.max_total_bytes" in description
    assert up.broker.total_bytes == 3 * one
