"""The pure parts of `broker_filter.proxy.topology`: which addresses a durable subscription's queue
is bound for, and the queue's name (the requests themselves run against RabbitMQ 4 in
test_durable_on_broker.py)."""

from __future__ import annotations

import pytest

from broker_filter.proxy.topology import QUEUE_PREFIX, Reply, _failure, durable_queue, exchange_binding, queue_path


@pytest.mark.parametrize("address, binding", [
    ("/topic/orders.eu", ("amq.topic", "orders.eu")),
    ("/topic/orders.*", ("amq.topic", "orders.*")),
    ("/exchange/amq.direct/red", ("amq.direct", "red")),
    ("/exchange/prices", ("prices", "")),
    ("/exchange/prices/a/b", ("prices", "a/b")),
    ("/exchanges/my%20ex/key%2F1", ("my ex", "key/1")),
    ("/exchanges/amq.fanout", ("amq.fanout", "")),
    ("/queue/q", None),
    ("/queues/q", None),
    ("/amq/queue/q", None),
    ("orders", None),
    ("/exchange/", None),
    ("", None),
    (None, None),
])
def test_the_exchange_and_key_a_subscription_address_stands_for(address, binding):
    assert exchange_binding(address) == binding


def test_a_durable_subscriptions_queue_is_named_from_its_client_and_name():
    assert durable_queue("client-1.sub") == QUEUE_PREFIX + "client-1.sub"
    long_name = "c" * 150 + "." + "s" * 100
    named = durable_queue(long_name)
    assert named.startswith(QUEUE_PREFIX) and len(named) == len(QUEUE_PREFIX) + 64
    assert named == durable_queue(long_name) != durable_queue(long_name + "x")
    assert len(named.encode()) <= 255  # RabbitMQ's limit on a queue name


def test_queue_paths_are_percent_encoded():
    assert queue_path("broker-filter.durable.a/b c") == "/queues/broker-filter.durable.a%2Fb%20c"


@pytest.mark.parametrize("reply, condition, text", [
    (Reply("409", "inequivalent arg 'x-expires'"), "amqp:precondition-failed", "the broker answered status 409: inequivalent"),
    (Reply("403", "access refused"), "amqp:unauthorized-access", "status 403: access refused"),
    (Reply("500", {"x": 1}), "amqp:internal-error", "status 500"),
    (Reply(None, error="upstream u did not answer PUT /queues/q within 5 s"), "amqp:link:detach-forced",
     "did not answer PUT /queues/q within 5 s"),
])
def test_a_failed_request_refuses_with_a_condition_naming_what_failed(reply, condition, text):
    got = _failure("declaring the durable subscription's queue 'q'", reply)
    assert got[0] == condition
    assert got[1].startswith("declaring the durable subscription's queue 'q': ")
    assert text in got[1]
