"""RabbitMQ's own AMQP 1.0 Python client, unpatched, through the daemon in front of RabbitMQ 4.0 (issue 45
items 1-3).

The client gates features on the server's `version` (rabbitmq-amqp-python-client: filters by
properties and application properties from 4.1.0, SQL filters and direct reply-to from 4.2.0).  In
front of RabbitMQ 4.0 the daemon presents 4.2.0, what it serves itself, with the upstream's own
version beside it (`upstream-version`, `/links`' `upstream_version`, the log): the client then
filters a quorum queue by application properties, by properties and by SQL (the daemon evaluates
them), makes a direct reply-to round trip (the daemon holds the reply address: RabbitMQ 4.0 has no
volatile queues) and consumes from `/exchanges/X/KEY` with a filter (a queue of the daemon's own,
declared, bound and removed over RabbitMQ's `/management` node)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from clients import connect
from launcher import Daemon, free_port, http_get

rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                          reason="RabbitMQ's Python client is in pyproject's `test` extra")
from rabbitmq_amqp_python_client.qpid.proton.utils import SendException  # noqa: E402

pytestmark = pytest.mark.rabbitmq4


@pytest.fixture(scope="module")
def daemon4(rabbitmq4):
    d = Daemon("--set", "upstream.credentials=pass-through", "--metrics", f"127.0.0.1:{free_port()}",
               upstream=rabbitmq4.url)
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


@pytest.fixture
def environment(daemon4):
    env = rmq.Environment(uri=f"amqp://guest:guest@127.0.0.1:{daemon4.port}/")
    yield env
    env.close()


def dial(env):
    connection = env.connection()
    connection.dial()
    return connection


@pytest.fixture
def connection(environment):
    connection = dial(environment)
    yield connection
    connection.close()


class Enough(BaseException):
    pass


class Collect(rmq.AMQPMessagingHandler):
    """Collects message bodies (accepting each) until it has `n`, then leaves `consumer.run()`."""

    def __init__(self, n: int, accept: bool = True):
        super().__init__()
        self.n, self.accept, self.messages = n, accept, []

    def on_amqp_message(self, event) -> None:
        self.messages.append(event.message)
        if self.accept:
            self.delivery_context.accept(event)
        if len(self.messages) == self.n:
            raise Enough()

    on_message = on_amqp_message


def body(message) -> str:
    return rmq.Converter.bytes_to_string(message.body)


def consume(connection, address: str, n: int, options=None) -> list[str]:
    handler = Collect(n)
    consumer = connection.consumer(address, message_handler=handler, consumer_options=options)
    try:
        with pytest.raises(Enough):
            consumer.run()
    finally:
        consumer.close()
    return sorted(body(m) for m in handler.messages)


def test_the_open_frame_presents_4_2_with_the_upstreams_own_version_beside_it(daemon4, rabbitmq4):
    conn = connect(rabbitmq4.url)
    try:
        real = str(conn.conn.remote_properties["version"])
    finally:
        conn.close()
    assert real.startswith("4.0.")
    conn = connect(daemon4.url.replace("amqp://", "amqp://guest:guest@"))  # (pass-through: a login)
    try:
        props = {str(k): v for k, v in conn.conn.remote_properties.items()}
    finally:
        conn.close()
    assert props["product"] == "RabbitMQ" and props["version"] == "4.2.0"
    assert props["upstream-version"] == real
    status, text = http_get(daemon4.metrics_url() + "/links")
    assert status == 200 and json.loads(text)["upstream_version"] == real
    assert "clients are shown RabbitMQ 4.2.0 (what the daemon serves); upstream" in daemon4.log()
    assert f"is RabbitMQ {real}" in daemon4.log()


@pytest.mark.parametrize("kind", ["application-properties", "properties", "sql"])
def test_filters_on_a_quorum_queue(connection, kind):
    management = connection.management()
    queue = f"rmqc-{kind}-{uuid.uuid4().hex[:8]}"
    management.declare_queue(rmq.QuorumQueueSpecification(name=queue))
    try:
        publisher = connection.publisher(rmq.AddressHelper.queue_address(queue))
        for i in range(10):
            publisher.publish(rmq.Message(body=rmq.Converter.string_to_bytes(f"m{i}"),
                                          application_properties={"colour": "red" if i % 2 else "blue"},
                                          subject="red" if i % 2 else "blue"))
        publisher.close()
        if kind == "application-properties":
            options = rmq.StreamFilterOptions(application_properties={"colour": "red"})
        elif kind == "properties":
            options = rmq.StreamFilterOptions(message_properties=rmq.MessageProperties(subject="red"))
        else:
            options = rmq.StreamFilterOptions(sql="colour = 'red'")
        got = consume(connection, rmq.AddressHelper.queue_address(queue), 5,
                      rmq.StreamConsumerOptions(filter_options=options))
        assert got == [f"m{i}" for i in (1, 3, 5, 7, 9)]
        # The others stay in the queue (the daemon's feed gives them back when the consumer goes)
        deadline = time.monotonic() + 10
        while (count := management.queue_info(queue).message_count) != 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert count == 5
    finally:
        management.delete_queue(queue)
        management.close()


def test_direct_reply_to_round_trip(connection, environment):
    """The requester's direct reply-to consumer gets an address the daemon holds; a responder (on a
    connection of its own) consumes the request and replies to `reply_to` with a publisher of its
    own and with the anonymous publisher (`to`): both replies reach the requester, none reaches the
    broker."""
    responding = dial(environment)
    management = connection.management()
    requests = f"rmqc-rpc-{uuid.uuid4().hex[:8]}"
    management.declare_queue(rmq.QuorumQueueSpecification(name=requests))
    try:
        replies = Collect(2, accept=False)  # (pre-settled: direct reply-to)
        requester = connection.consumer(message_handler=replies, consumer_options=rmq.ConsumerOptions(
            settle_strategy=rmq.ConsumerSettleStrategy.DirectReplyTo))
        reply_to = requester.address
        assert reply_to.startswith("/queues/broker-filter.reply-to.")
        publisher = connection.publisher(rmq.AddressHelper.queue_address(requests))
        status = publisher.publish(rmq.Message(body=rmq.Converter.string_to_bytes("ping"), reply_to=reply_to,
                                               id="q1"))
        assert status.remote_state == rmq.OutcomeState.ACCEPTED
        publisher.close()

        handler = Collect(1)
        responder = responding.consumer(rmq.AddressHelper.queue_address(requests), message_handler=handler)
        with pytest.raises(Enough):
            responder.run()
        responder.close()
        request = handler.messages[0]
        assert body(request) == "ping" and request.reply_to == reply_to
        named = responding.publisher(request.reply_to)
        status = named.publish(rmq.Message(body=rmq.Converter.string_to_bytes("pong 1"), correlation_id=request.id))
        assert status.remote_state == rmq.OutcomeState.ACCEPTED
        named.close()
        anonymous = responding.publisher()
        status = anonymous.publish(rmq.Message(body=rmq.Converter.string_to_bytes("pong 2"), correlation_id=request.id,
                                               address=request.reply_to))
        assert status.remote_state == rmq.OutcomeState.ACCEPTED
        with pytest.raises(Enough):
            requester.run()
        assert sorted(body(m) for m in replies.messages) == ["pong 1", "pong 2"]
        assert {m.correlation_id for m in replies.messages} == {"q1"}
        requester.close()
        # The address went with its consumer: a reply now is refused
        deadline = time.monotonic() + 10
        while True:
            try:
                status = anonymous.publish(rmq.Message(body=rmq.Converter.string_to_bytes("late"), address=reply_to))
            except rmq.AmqpMessageRejectedException as e:
                assert "no reply address" in str(e)
                break
            assert time.monotonic() < deadline, "the reply address outlived its consumer"
            time.sleep(0.05)
        anonymous.close()
    finally:
        management.delete_queue(requests)
        management.close()
        responding.close()


def test_a_filtered_consumer_on_an_exchange_and_key(connection, environment, daemon4):
    """`/exchanges/X/KEY` is a subscription: RabbitMQ 4 consumes only queues, so the daemon binds one
    of its own, consumes it with the consumer's filter, and removes it when the consumer goes."""
    management = connection.management()
    exchange = f"rmqc-x-{uuid.uuid4().hex[:8]}"
    management.declare_exchange(rmq.ExchangeSpecification(name=exchange, exchange_type=rmq.ExchangeType.topic))
    try:
        handler = Collect(5)
        consumer = connection.consumer(rmq.AddressHelper.exchange_address(exchange, "orders.*"),
                                       message_handler=handler, consumer_options=rmq.StreamConsumerOptions(
                                           filter_options=rmq.StreamFilterOptions(sql="colour = 'red'")))
        status, text = http_get(daemon4.metrics_url() + "/links")
        queues = [r["feed"]["upstream_address"] for r in json.loads(text)["links"]
                  if r.get("address") == f"/exchanges/{exchange}/orders.%2A"]
        assert len(queues) == 1 and queues[0].startswith("/queues/broker-filter.subscription."), text
        queue = queues[0][len("/queues/"):]
        publishing = dial(environment)  # (a connection of its own: the consumer's handler runs on its own)
        publisher = publishing.publisher()
        for i, key in enumerate(["orders.new", "orders.new", "orders.old", "stock.new", "orders.new", "orders.new",
                                 "orders.old"]):
            message = rmq.Message(body=rmq.Converter.string_to_bytes(f"{key} {i}"),
                                  application_properties={"colour": "red" if i != 1 else "blue"},
                                  address=rmq.AddressHelper.exchange_address(exchange, key))
            if key == "stock.new":  # bound to no queue: RabbitMQ 4 releases it
                with pytest.raises(SendException):
                    publisher.publish(message)
            else:
                publisher.publish(message)
        with pytest.raises(Enough):
            consumer.run()
        got = sorted(body(m) for m in handler.messages)
        assert got == sorted(["orders.new 0", "orders.old 2", "orders.new 4", "orders.new 5", "orders.old 6"]), got
        assert management.queue_info(queue).message_count == 0  # (what was not red was accepted and dropped)
        consumer.close()
        publisher.close()
        publishing.close()
        deadline = time.monotonic() + 10
        while True:  # the subscription's queue goes with it
            try:
                management.queue_info(queue)
            except rmq.ValidationCodeException as e:
                assert "404" in str(e), e
                break
            assert time.monotonic() < deadline, f"queue {queue} outlived its subscription"
            time.sleep(0.1)
    finally:
        management.delete_exchange(exchange)
        management.close()


def test_a_subscription_to_a_missing_exchange_is_refused(daemon4):
    from proton.utils import LinkDetached

    conn = connect(daemon4.url.replace("amqp://", "amqp://guest:guest@"))
    try:
        with pytest.raises(LinkDetached) as e:
            conn.create_receiver(f"/exchanges/missing-{uuid.uuid4().hex[:8]}/k")
        assert "amqp:not-found" in str(e.value) and "binding the subscription's queue to exchange" in str(e.value)
    finally:
        conn.close()
