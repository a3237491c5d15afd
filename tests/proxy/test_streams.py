"""A RabbitMQ stream is not a queue: a consumer with a selector on a stream through the daemon reads
and skips (each stream consumer has an offset of its own; nothing is taken from the stream), and the
daemon never moves or republishes on a stream — a queue search there would append a copy of every
message it skipped, and the stream keeps every copy for every other reader.

The daemon knows a stream by what RabbitMQ 4 puts on each message it delivers from one: the message
annotation `x-stream-offset` (RabbitMQ 3.10 has no AMQP 1.0 access to streams)."""

from __future__ import annotations

import uuid

import pytest
from proton import Described, Message, symbol
from proton.reactor import Filter, Selector

from clients import connect, declare_queue, delete_queue, queue_exists, receive_n, receive_until_quiet

pytestmark = [pytest.mark.rabbitmq, pytest.mark.rabbitmq4]


def read_whole_stream(url: str, address: str) -> list:
    """Every message in the stream, read directly from its first offset."""
    c = connect(url)
    try:
        r = c.create_receiver(address, credit=100, options=Filter(
            {symbol("rabbitmq:stream-offset-spec"): Described(symbol("rabbitmq:stream-offset-spec"), "first")}))
        return [m.body for m in receive_until_quiet(r, idle=1.0)]
    finally:
        c.close()


def test_a_selective_consumer_on_a_stream_skips_and_the_stream_does_not_grow(rabbitmq4):
    name = f"stream-{uuid.uuid4().hex[:8]}"
    address = f"/queues/{name}"
    declare_queue(rabbitmq4.url, name, "stream")
    from launcher import Daemon

    d = Daemon(upstream=rabbitmq4.url)
    try:
        c = connect(d.url)
        r = c.create_receiver(address, credit=10, options=Selector("n >= 3"))
        s = c.create_sender(address)
        for i in range(5):
            s.send(Message(body=i, properties={"n": i}))
        assert sorted(m.body for m in receive_n(r, 2, timeout=15)) == [3, 4]
        assert receive_until_quiet(r, idle=2.0) == []
        c.close()
        assert read_whole_stream(rabbitmq4.url, address) == [0, 1, 2, 3, 4]  # not one copy more
        assert "a stream" in d.log()
    finally:
        d.stop()
        delete_queue(rabbitmq4.url, name)
    assert "Traceback" not in d.log()


OFFSET = symbol("rabbitmq:stream-offset-spec")


def test_stream_offsets_go_upstream_and_the_echo_is_the_upstreams(rabbitmq4):
    """Filters the daemon does not evaluate go on the upstream attach as the client sent them
    (RabbitMQ's `rabbitmq:stream-offset-spec`): `first` reads the stream from its start, with the
    daemon's selector applied; the echo for that key is RabbitMQ's."""
    from launcher import Daemon

    name = f"stream-{uuid.uuid4().hex[:8]}"
    address = f"/queues/{name}"
    declare_queue(rabbitmq4.url, name, "stream")
    direct = connect(rabbitmq4.url)
    try:
        s = direct.create_sender(address)
        for i in range(6):
            s.send(Message(body=i, properties={"n": i}))
    finally:
        direct.close()
    d = Daemon(upstream=rabbitmq4.url)
    try:
        c = connect(d.url)
        first = {OFFSET: Described(OFFSET, "first"),
                 symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), "n >= 2")}
        r = c.create_receiver(address, credit=10, options=Filter(first))
        echo = r.link.remote_source.filter
        echo.rewind()
        echo.next()
        assert echo.get_object()[OFFSET] == Described(OFFSET, "first")
        assert [m.body for m in receive_n(r, 4, timeout=15)] == [2, 3, 4, 5]
        c.close()
        assert read_whole_stream(rabbitmq4.url, address) == list(range(6))
    finally:
        d.stop()
        delete_queue(rabbitmq4.url, name)
    assert "Traceback" not in d.log()


def test_a_stream_deleted_through_the_management_link_is_gone(rabbitmq4):
    """The tests' `delete_queue` (RabbitMQ 4's HTTP over AMQP 1.0: DELETE /queues/{name}, its body an
    amqp-value null) removes the stream."""
    name = f"stream-{uuid.uuid4().hex[:8]}"
    declare_queue(rabbitmq4.url, name, "stream")
    assert queue_exists(rabbitmq4.url, name)
    assert delete_queue(rabbitmq4.url, name) == "200"
    assert not queue_exists(rabbitmq4.url, name)
