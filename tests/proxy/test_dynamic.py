"""Dynamic sources (issue 28 item 2): on the embedded broker a receiver with a dynamic source gets
a temporary node of its own, named in the attach reply; RabbitMQ 3.10 and 4.0 answer a dynamic
source by ending the session ("Dynamic sources not supported"), so in front of them the daemon
holds the address itself (issue 45, proxy/replies.py; tested further in test_reply.py).  Dynamic
targets are refused in front of RabbitMQ."""

from __future__ import annotations

import uuid

import pytest
from proton import Data, Message, Terminus
from proton.reactor import AtMostOnce, LinkOption
from proton.utils import LinkDetached

from tests.support.clients import connect, receive_n, receives_nothing


def _dynamic(conn):
    return conn.create_receiver(None, dynamic=True, credit=10)


def _refused_and_the_connection_lives_on(daemon, conn, attach, text: str) -> None:
    """In front of RabbitMQ: `attach(conn)` is refused amqp:not-implemented with `text`, and the
    connection still carries an ordinary queue's round trip."""
    with pytest.raises(LinkDetached) as e:
        attach(conn)
    assert "amqp:not-implemented" in str(e.value)
    assert text in str(e.value)
    q = daemon.forms[1].format(f"dyn-{uuid.uuid4().hex[:8]}")
    rcv = conn.create_receiver(q, credit=10)
    conn.create_sender(q).send(Message(body="still works"))
    assert [m.body for m in receive_n(rcv, 1)] == ["still works"]


def test_dynamic_source_gets_an_address_that_reaches_it(daemon):
    conn = connect(daemon.url)
    try:
        rcv = _dynamic(conn)
        address = rcv.link.remote_source.address
        assert address, "the attach reply names the dynamic node"
        if daemon.forms[1].startswith("/queue"):  # RabbitMQ: an address the daemon holds (test_reply.py)
            assert address.startswith("/queues/broker-filter.reply-to.")
        other = _dynamic(conn)
        assert other.link.remote_source.address not in (None, address)
        # (sent pre-settled: in front of RabbitMQ a reply's outcome is its receiver's, which this
        # one thread gives only in receive_n below)
        conn.create_sender(address, options=AtMostOnce()).send(Message(body="direct"))
        conn.create_sender(None, options=AtMostOnce()).send(Message(address=address, body="relayed", reply_to=address))
        assert [m.body for m in receive_n(rcv, 2)] == ["direct", "relayed"]
        assert receives_nothing(other)
    finally:
        conn.close()


def test_dynamic_node_goes_with_its_link(daemon):
    conn = connect(daemon.url)
    try:
        rcv = _dynamic(conn)
        address = rcv.link.remote_source.address
        rcv.close()
        # The node is gone: publishing to the name again makes an ordinary address, with no
        # consumer; a new dynamic receiver gets another name.
        again = _dynamic(conn)
        assert again.link.remote_source.address != address
    finally:
        conn.close()


class TemporaryQueueCreator(LinkOption):
    """Qpid JMS's temporary queue (qpid-jms-client `AmqpTemporaryDestinationBuilder`): a sender
    named `qpid-jms:temp-queue-creator:<id>` whose target is dynamic, capability `temporary-queue`,
    durability none, expiry policy link-detach."""

    def apply(self, link) -> None:
        link.target.dynamic = True
        link.target.durability = Terminus.NONDURABLE
        link.target.expiry_policy = Terminus.EXPIRE_WITH_LINK
        link.target.capabilities.put_array(False, Data.SYMBOL)
        link.target.capabilities.enter()
        link.target.capabilities.put_symbol("temporary-queue")
        link.target.capabilities.exit()


def _creator(conn):
    return conn.create_sender(None, name=f"qpid-jms:temp-queue-creator:{uuid.uuid4().hex[:8]}",
                              options=TemporaryQueueCreator())


def test_dynamic_target_is_a_temporary_queue_until_its_creator_goes(daemon):
    conn = connect(daemon.url)
    try:
        if daemon.forms[1].startswith("/queue"):
            _refused_and_the_connection_lives_on(daemon, conn, _creator,
                                                 "dynamic targets (temporary queues) are not supported by upstream")
            return
        creator = _creator(conn)
        address = creator.link.remote_target.address
        assert address and creator.link.remote_target.dynamic, "the attach reply names the temporary queue"
        assert _creator(conn).link.remote_target.address not in (None, address)
        rcv = conn.create_receiver(address, credit=10)
        creator.send(Message(body="one"))
        assert [m.body for m in receive_n(rcv, 1)] == ["one"]
        rcv.close()  # consumers come and go: the queue stays while its creator is attached
        creator.send(Message(body="kept"))
        rcv = conn.create_receiver(address, credit=10)
        assert [m.body for m in receive_n(rcv, 1)] == ["kept"]
        rcv.close()
        creator.send(Message(body="gone with the queue"))
        creator.close()
        rcv = conn.create_receiver(address, credit=10)
        assert receives_nothing(rcv)
    finally:
        conn.close()
