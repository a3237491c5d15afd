"""Queue browsers (distribution-mode `copy` on a queue, Qpid JMS `QueueBrowser`): non-destructive on
the embedded broker, with and without a selector, and the attach reply says `copy`; in front of
RabbitMQ, which cannot browse a classic queue over AMQP 1.0, the link is refused with a condition that
says so and the queue is left as it was."""

from __future__ import annotations

import uuid

import pytest
from proton import Message, Terminus
from proton.reactor import Copy, Selector
from proton.utils import LinkDetached

from clients import connect, receive_n, receive_until_quiet


def fill(conn, q: str, n: int = 6) -> None:
    s = conn.create_sender(q)
    for i in range(n):
        s.send(Message(body=i, properties={"n": i}))


def test_browsing_a_queue_with_a_selector_leaves_every_message_for_its_consumer(daemon):
    q = daemon.forms[1].format(f"browse-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        fill(c, q)
        if daemon.forms[1].startswith("/queue/"):
            with pytest.raises(LinkDetached) as info:
                c.create_receiver(q, credit=10, options=[Copy(), Selector("n >= 3")])
            cond = info.value.link.remote_condition
            assert cond.name == "amqp:not-implemented" and "browsing a queue" in cond.description
        else:
            browser = c.create_receiver(q, credit=10, options=[Copy(), Selector("n >= 3")])
            assert browser.link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
            assert sorted(m.body for m in receive_until_quiet(browser, idle=0.5)) == [3, 4, 5]
            everything = c.create_receiver(q, name="browse-all", credit=10, options=Copy())
            assert [m.body for m in receive_until_quiet(everything, idle=0.5)] == [0, 1, 2, 3, 4, 5]
        consumer = c.create_receiver(q, name="consumer", credit=10)
        assert sorted(m.body for m in receive_n(consumer, 6, timeout=10)) == [0, 1, 2, 3, 4, 5]
        assert receive_until_quiet(consumer, idle=0.5) == []
    finally:
        c.close()


def test_a_browser_sees_messages_published_after_it_attached_and_takes_none(daemon):
    if daemon.forms[1].startswith("/queue/"):
        pytest.skip("RabbitMQ cannot browse a queue: the refusal is tested above")
    q = daemon.forms[1].format(f"browse-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        browser = c.create_receiver(q, credit=10, options=Copy())
        fill(c, q, 3)
        assert [m.body for m in receive_n(browser, 3, timeout=10)] == [0, 1, 2]
        consumer = c.create_receiver(q, name="consumer", credit=10)
        assert [m.body for m in receive_n(consumer, 3, timeout=10)] == [0, 1, 2]
    finally:
        c.close()


def test_a_qpid_jms_queue_browser_on_a_bare_address_browses_or_is_refused(daemon):
    """Qpid JMS's QueueBrowser: copy with the `queue` capability (AmqpConsumerBuilder.configureSource
    and AmqpDestinationHelper.toTypeCapability in qpid-jms-client), here on a bare address."""
    from clients import Capabilities

    q = f"browse-bare-{uuid.uuid4().hex[:8]}"
    c = connect(daemon.url)
    try:
        s = c.create_sender(q, options=Capabilities("queue", target=True))
        for i in range(3):
            s.send(Message(body=i))
        if daemon.forms[1].startswith("/queue/"):
            with pytest.raises(LinkDetached) as info:
                c.create_receiver(q, credit=10, options=[Copy(), Capabilities("queue")])
            assert info.value.link.remote_condition.name == "amqp:not-implemented"
        else:
            browser = c.create_receiver(q, credit=10, options=[Copy(), Capabilities("queue")])
            assert [m.body for m in receive_until_quiet(browser, idle=0.5)] == [0, 1, 2]
        consumer = c.create_receiver(q, name="consumer", credit=10, options=Capabilities("queue"))
        assert [m.body for m in receive_n(consumer, 3, timeout=10)] == [0, 1, 2]
    finally:
        c.close()
