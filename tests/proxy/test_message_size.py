"""A receiver's max-message-size (issue 28 item 7): the daemon never sends a link a message larger than
the limit its attach announced.  On a queue the message goes to another link that selects it and can
take it, or stays in the queue like a message nobody selects (a consumer attaching later gets it); on a
topic (the link's own subscription) the copy is rejected for that subscription, with
amqp:link:message-size-exceeded.  On the embedded broker, RabbitMQ 3.10 and 4.0 (`daemon` fixture)."""

from __future__ import annotations

import uuid

from proton import Message
from proton.reactor import LinkOption

from clients import connect, link_name, receive_n_and_extras, receive_until_quiet, receives_nothing

LIMIT = 512 * 1024
BIG = "x" * (1024 * 1024)


class MaxMessageSize(LinkOption):
    """The link's max-message-size, announced in its attach."""

    def __init__(self, size: int):
        self.size = size

    def apply(self, link) -> None:
        link.max_message_size = self.size


def _names(messages) -> list:
    return ["big" if m.body == BIG else m.body for m in messages]


def test_a_limited_receiver_never_gets_a_larger_message_its_neighbour_does(daemon):
    queue = daemon.forms[1].format(f"size-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        limited = c.create_receiver(queue, credit=10, name=link_name(), options=MaxMessageSize(LIMIT))
        assert limited.link.max_message_size == LIMIT
        plain = c.create_receiver(queue, credit=10, name=link_name())
        s = c.create_sender(queue)
        s.send(Message(body=BIG))
        for i in range(4):
            s.send(Message(body=f"small-{i}"))
        got_limited = receive_until_quiet(limited, idle=1.5)
        got_plain = receive_until_quiet(plain, idle=1.5)
        assert "big" not in _names(got_limited)
        assert _names(got_plain).count("big") == 1
        assert sorted(_names(got_limited) + _names(got_plain)) == ["big"] + [f"small-{i}" for i in range(4)]
    finally:
        c.close()


def test_a_message_no_link_can_take_stays_on_the_queue(daemon):
    queue = daemon.forms[1].format(f"size-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        limited = c.create_receiver(queue, credit=10, name=link_name(), options=MaxMessageSize(LIMIT))
        s = c.create_sender(queue)
        s.send(Message(body=BIG))
        s.send(Message(body="small"))
        assert _names(receive_n_and_extras(limited, 1)) == ["small"]
        assert receives_nothing(limited, 1.0)
        limited.close()
        later = connect(daemon.url)
        try:
            plain = later.create_receiver(queue, credit=10, name=link_name())
            assert _names(receive_until_quiet(plain, at_most=1, idle=10)) == ["big"]
        finally:
            later.close()
    finally:
        c.close()


def test_a_subscription_copy_larger_than_the_link_takes_is_not_sent(daemon):
    topic = daemon.forms[0].format(f"size-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        limited = c.create_receiver(topic, credit=10, name=link_name(), options=MaxMessageSize(LIMIT))
        plain = c.create_receiver(topic, credit=10, name=link_name())
        s = c.create_sender(topic)
        s.send(Message(body=BIG))
        s.send(Message(body="small"))
        assert _names(receive_n_and_extras(limited, 1, extra_wait=1.0)) == ["small"]  # (the big one comes first, if at all)
        assert _names(receive_n_and_extras(plain, 2)) == ["big", "small"]
        assert not limited.link.state & limited.link.REMOTE_CLOSED
    finally:
        c.close()
