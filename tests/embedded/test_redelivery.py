"""A message delivered again by the embedded broker says so in its header: first-acquirer false and
delivery-count raised by every failed attempt (modified{delivery-failed}, a consumer detaching with it
unsettled), not by `released` (AMQP 1.0 §3.4.4: the delivery-count of a released message is not
incremented).  JMS clients read JMSRedelivered / JMSXDeliveryCount from it."""

from __future__ import annotations

from proton import Message

from broker_filter.amqp.types import uint
from broker_filter.amqp import decode_message, encode_message
from broker_filter.amqp.message import Header, Message as BFMessage, Properties
from broker_filter.amqp import redelivery_bytes

from clients import connect, link_name, receiver


def _first(rcv, timeout: float = 5.0):
    return rcv.receive(timeout=timeout)


def _failed(rcv) -> None:
    """Settle the oldest unsettled delivery as modified{delivery-failed} (what Qpid JMS sends on
    recover / rollback; proton's own release(delivered=True) leaves delivery-failed unset)."""
    from proton import Delivery

    dlv = rcv.fetcher.unsettled.popleft()
    dlv.local.failed = True
    dlv.update(Delivery.MODIFIED)
    dlv.settle()


def test_released_then_modified_then_detached_message_carries_its_history(daemon):
    address = f"redeliver-{link_name()}"
    conn = connect(daemon.url)
    try:
        snd = conn.create_sender(address, name=link_name())
        snd.send(Message(body="m", properties={"color": "red"}, durable=True, priority=7, ttl=60.0,
                         first_acquirer=True))
        r = receiver(conn, address, credit=1)

        m = _first(r)
        assert (m.body, m.first_acquirer, m.delivery_count) == ("m", True, 0)  # first delivery: untouched
        r.release(delivered=False)  # released: available again, not a failed attempt

        m = _first(r)
        assert (m.body, m.first_acquirer, m.delivery_count) == ("m", False, 0)
        _failed(r)  # modified{delivery-failed}: one failed attempt

        m = _first(r)
        assert (m.first_acquirer, m.delivery_count) == (False, 1)
        assert (m.body, m.properties, m.durable, m.priority) == ("m", {"color": "red"}, True, 7)
        r.close()  # detached with the message unsettled: another failed attempt

        r2 = receiver(conn, address, credit=1)
        m = _first(r2)
        assert (m.body, m.first_acquirer, m.delivery_count) == ("m", False, 2)
        r2.accept()
        snd.send(Message(body="fresh", first_acquirer=True))
        m = _first(r2)
        assert (m.body, m.first_acquirer, m.delivery_count) == ("fresh", True, 0)  # only that message changed
        r2.accept()
    finally:
        conn.close()


def test_redelivery_bytes_rewrite_only_the_header():
    base = BFMessage(properties=Properties(message_id="id-1"), application_properties={"n": 1}, body=b"payload")
    data = encode_message(base)
    again = decode_message(redelivery_bytes(data, 3))
    assert again.header == Header(first_acquirer=False, delivery_count=uint(3))  # typed as on the wire
    assert (again.properties, again.application_properties, again.body) == (base.properties, {"n": 1}, b"payload")
    with_header = encode_message(BFMessage(header=Header(durable=True, priority=9), body="v"))
    out = redelivery_bytes(with_header, 1)
    h = decode_message(out).header
    assert (h.durable, h.priority, h.first_acquirer, h.delivery_count) == (True, 9, False, 1)
    assert out.endswith(with_header[len(with_header) - len(encode_message(BFMessage(body="v"))):])
    assert redelivery_bytes(b"\x00\x53\x77\xa1\xff", 1) == b"\x00\x53\x77\xa1\xff"  # unparsable: unchanged
