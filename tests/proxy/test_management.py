"""RabbitMQ 4's `/management` link pair through the daemon (issue 29 item 2).

In front of RabbitMQ 4.0 with pass-through logins, RabbitMQ's own Python AMQP 1.0 client
(`rabbitmq-amqp-python-client`, the `test` extra) declares a queue and an exchange, binds them,
publishes through the exchange and consumes with a selector: the management calls pass through to
RabbitMQ unchanged (link names, `paired`, one session) and the consumer gets exactly its selected
messages.  The pair's frames are checked with proton too (link name and `paired` echoed by RabbitMQ).
On the embedded broker and in front of RabbitMQ 3.10 `/management` is refused with
`amqp:not-implemented` saying it is RabbitMQ 4's.
"""

from __future__ import annotations

import time
import uuid

import pytest
from proton import Message, symbol
from proton.reactor import LinkOption
from proton.utils import LinkDetached

from clients import connect
from launcher import Daemon

MANAGEMENT = "/management"


@pytest.fixture(scope="module")
def passthrough4(rabbitmq4):
    d = Daemon("--set", "upstream.credentials=pass-through", upstream=rabbitmq4.url)
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


class _Paired(LinkOption):
    """The link options of the client's management pair (rabbitmq_amqp_python_client/options.py:
    `SenderOption`, `ReceiverOption`): pre-settled, `paired = true`, both termini `/management`."""

    def apply(self, link) -> None:
        from proton import Link, PropertyDict
        link.source.address = MANAGEMENT
        link.target.address = MANAGEMENT
        link.snd_settle_mode = Link.SND_SETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        link.properties = PropertyDict({symbol("paired"): True})


def _request(snd, rcv, path: str, method: str, body=None) -> Message:
    snd.send(Message(id=str(uuid.uuid4()), body=body, inferred=False, reply_to="$me", address=path,
                     subject=method, durable=False))
    return rcv.receive(timeout=10)  # (pre-settled, as RabbitMQ sends replies on the pair)


@pytest.mark.rabbitmq4
def test_the_pair_passes_through_with_its_link_name_and_paired_property(passthrough4):
    conn = connect(passthrough4.url.replace("amqp://", "amqp://guest:guest@"))
    try:
        name = f"mgmt-{uuid.uuid4().hex[:8]}"
        snd = conn.create_sender(MANAGEMENT, name=name, options=_Paired())
        rcv = conn.create_receiver(MANAGEMENT, name=name, options=_Paired(), credit=1)
        assert snd.link.session == rcv.link.session
        for link in (snd.link, rcv.link):
            assert link.remote_properties == {symbol("paired"): True}
        queue = f"mgmt-{uuid.uuid4().hex[:10]}"
        put = _request(snd, rcv, f"/queues/{queue}", "PUT", {"durable": True, "exclusive": False,
                                                            "auto_delete": False, "arguments": {"x-expires": 600_000}})
        assert put.subject in ("200", "201"), (put.subject, put.body)
        assert put.body["name"] == queue
        again = _request(snd, rcv, f"/queues/{queue}", "PUT", {"durable": True, "exclusive": False,
                                                              "auto_delete": False, "arguments": {"x-expires": 600_000}})
        assert again.subject == "200", (again.subject, again.body)  # it exists now
        assert again.body["name"] == queue
    finally:
        conn.close()


@pytest.mark.rabbitmq4
def test_rabbitmqs_client_declares_binds_publishes_and_consumes_with_a_selector(passthrough4):
    rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                              reason="RabbitMQ's Python client is in pyproject's `test` extra")
    from rabbitmq_amqp_python_client.qpid.proton._data import Described

    class SelectorOptions(rmq.StreamConsumerOptions):
        """A selector in the consumer's filter set, attached by the client's own
        `ReceiverOptionUnsettledWithFilters` (rabbitmq_amqp_python_client/options.py)."""

        def __init__(self, selector: str):
            self._filter_option = None
            self._filter_set = {rmq.symbol("jms-selector"):
                                Described(rmq.symbol("apache.org:selector-filter:string"), selector)}

        def validate(self, versions) -> None:
            pass

    class Enough(BaseException):
        pass

    class Collect(rmq.AMQPMessagingHandler):
        def __init__(self, n: int):
            super().__init__()
            self.n, self.bodies = n, []

        def on_amqp_message(self, event) -> None:
            self.bodies.append(rmq.Converter.bytes_to_string(event.message.body))
            self.delivery_context.accept(event)
            if len(self.bodies) == self.n:
                raise Enough()  # out of consumer.run(), as the client's own tests do

        on_message = on_amqp_message

    env = rmq.Environment(uri=f"amqp://guest:guest@127.0.0.1:{passthrough4.port}/")
    queue, exchange = f"mgmt-q-{uuid.uuid4().hex[:8]}", f"mgmt-x-{uuid.uuid4().hex[:8]}"
    try:
        connection = env.connection()
        connection.dial()
        management = connection.management()
        management.declare_queue(rmq.ClassicQueueSpecification(name=queue))
        management.declare_exchange(rmq.ExchangeSpecification(name=exchange))
        management.bind(rmq.ExchangeToQueueBindingSpecification(source_exchange=exchange,
                                                                 destination_queue=queue, binding_key="k"))
        publisher = connection.publisher(rmq.AddressHelper.exchange_address(exchange, "k"))
        for i in range(10):
            publisher.publish(rmq.Message(body=rmq.Converter.string_to_bytes(f"m{i}"),
                                          application_properties={"half": i % 2}))
        publisher.close()
        assert management.queue_info(queue).message_count == 10
        handler = Collect(5)
        consumer = connection.consumer(rmq.AddressHelper.queue_address(queue), message_handler=handler,
                                       consumer_options=SelectorOptions("half = 1"))
        with pytest.raises(Enough):
            consumer.run()  # until the handler has 5
        consumer.close()
        assert sorted(handler.bodies) == [f"m{i}" for i in (1, 3, 5, 7, 9)]
        # The other half goes back to the queue when the daemon's feed ends with the consumer's
        # detach, which the client does not wait for: wait (bounded) for the count to say so.
        deadline = time.monotonic() + 10
        while (count := management.queue_info(queue).message_count) != 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert count == 5  # the other half, left in the queue
        management.delete_queue(queue)
        management.delete_exchange(exchange)
        management.close()
        connection.close()
    finally:
        env.close()


def test_deleting_a_queue_with_a_publisher_attached_answers_the_call_first(passthrough4):
    """RabbitMQ's client deletes a queue its publisher is still attached to (as its own tests do):
    the broker detaches the publisher (`amqp:resource-deleted`) and answers the call; the client
    must see the answer first, as directly, or the detach breaks the call waiting for it."""
    rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                              reason="RabbitMQ's Python client is in pyproject's `test` extra")
    for round in range(3):  # (a connection each: directly too, the detach reaches the client's next call)
        env = rmq.Environment(uri=f"amqp://guest:guest@127.0.0.1:{passthrough4.port}/")
        try:
            connection = env.connection()
            connection.dial()
            management = connection.management()
            queue = f"mgmt-del-{round}-{uuid.uuid4().hex[:8]}"
            management.declare_queue(rmq.QuorumQueueSpecification(name=queue))
            publisher = connection.publisher(rmq.AddressHelper.queue_address(queue))
            status = publisher.publish(rmq.Message(body=rmq.Converter.string_to_bytes("m")))
            assert status.remote_state == rmq.OutcomeState.ACCEPTED
            assert management.purge_queue(queue) == 1
            management.delete_queue(queue)  # raised LinkDetached when the detach came first
        finally:
            env.close()


@pytest.mark.parametrize("where", ["embedded", pytest.param("rabbitmq3", marks=pytest.mark.rabbitmq)])
def test_elsewhere_management_is_refused_as_rabbitmq_4s(request, where):
    d = Daemon() if where == "embedded" else Daemon(upstream=request.getfixturevalue("rabbitmq3").url)
    try:
        conn = connect(d.url)
        try:
            with pytest.raises(LinkDetached):
                conn.create_sender(MANAGEMENT, name="mgmt", options=_Paired())
        finally:
            conn.close()
        assert "refused link 'mgmt': amqp:not-implemented: /management is RabbitMQ 4's management node: " \
               "it passes through only in front of RabbitMQ 4" in d.log()
    finally:
        d.stop()
