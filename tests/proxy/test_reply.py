"""Request/reply on every upstream (issue 45 item 2): a receiver with a dynamic source in front of
RabbitMQ 3.10 and 4.0 (neither makes dynamic nodes) gets a reply address the daemon holds itself,
`/queues/broker-filter.reply-to.<random>`.  Messages sent to it, by a sender attached to it or
through the anonymous relay, reach the requester directly in the daemon, settled with the
requester's outcome; the requester's credit bounds what the daemon holds for it (beyond it a
message is rejected, `amqp:resource-limit-exceeded`); the address goes with its link (a sender then
is refused `amqp:not-found`).  Proton and rhea."""

from __future__ import annotations

import uuid

import pytest
from proton import Delivery, Message
from proton.utils import LinkDetached

from clients import connect, receive_n, receives_nothing, run_js
from launcher import Daemon

PREFIX = "/queues/broker-filter.reply-to."


def _requests(proxy) -> str:
    return f"/queue/rr-{uuid.uuid4().hex[:8]}"  # (RabbitMQ 3.10 and 4.0 take v1 addresses)


def send(sender, message: Message) -> Delivery:
    """Send without waiting for the outcome (a reply's outcome is its requester's, given when the
    requester's connection, in this same thread, settles it): only until it is on the wire."""
    d = sender.link.send(message)
    transport = sender.connection.conn.transport
    sender.connection.wait(lambda: sender.link.queued == 0 and transport.pending() == 0, timeout=10, msg="not sent")
    return d


def flush(conn) -> None:
    """Until what `conn` has to send (a requester's dispositions) is on the wire."""
    transport = conn.conn.transport
    conn.wait(lambda: transport.pending() == 0, timeout=10, msg="not sent")


def settled(conn, *deliveries: Delivery, requester=None) -> list:
    """The outcomes of `deliveries` sent on `conn`, once `requester` (its dispositions flushed) gave them."""
    if requester is not None:
        flush(requester)
    conn.wait(lambda: all(d.settled for d in deliveries), timeout=10, msg="a reply's outcome did not come")
    return [d.remote_state for d in deliveries]


def test_request_reply_with_proton(proxy):
    requester, responder = connect(proxy.url), connect(proxy.url)
    try:
        replies = requester.create_receiver(None, dynamic=True, credit=10)
        address = replies.link.remote_source.address
        assert address.startswith(PREFIX) and replies.link.remote_source.dynamic
        other = requester.create_receiver(None, dynamic=True, credit=10)
        assert other.link.remote_source.address.startswith(PREFIX) and other.link.remote_source.address != address
        queue = _requests(proxy)
        incoming = responder.create_receiver(queue, credit=10)
        requester.create_sender(queue).send(Message(body="ping", reply_to=address, id="q1"))
        [request] = receive_n(incoming, 1)
        assert request.reply_to == address
        named = send(responder.create_sender(request.reply_to), Message(body="pong 1", correlation_id=request.id))
        relayed = send(responder.create_sender(None), Message(address=request.reply_to, body="pong 2",
                                                               correlation_id=request.id))
        got = receive_n(replies, 2)
        assert [(m.body, m.correlation_id) for m in got] == [("pong 1", "q1"), ("pong 2", "q1")]
        assert settled(responder, named, relayed, requester=requester) == [Delivery.ACCEPTED, Delivery.ACCEPTED]
        assert receives_nothing(other)
        with pytest.raises(LinkDetached) as e:  # (its own link alone receives from it)
            responder.create_receiver(address)
        assert "amqp:not-allowed" in str(e.value)
    finally:
        requester.close()
        responder.close()


def test_the_requesters_outcome_is_the_senders(proxy):
    requester, responder = connect(proxy.url), connect(proxy.url)
    try:
        replies = requester.create_receiver(None, dynamic=True, credit=10)
        sender = responder.create_sender(replies.link.remote_source.address)
        refused, taken = send(sender, Message(body="refused")), send(sender, Message(body="taken"))
        replies.receive(timeout=10)
        replies.reject()
        replies.receive(timeout=10)
        replies.accept()
        assert settled(responder, refused, taken, requester=requester) == [Delivery.REJECTED, Delivery.ACCEPTED]
    finally:
        requester.close()
        responder.close()


def test_beyond_the_requesters_credit_a_message_is_rejected(proxy):
    """Credit 1: one message goes out, one waits for the next credit, a third is rejected."""
    requester, responder = connect(proxy.url), connect(proxy.url)
    try:
        replies = requester.create_receiver(None, dynamic=True, credit=1)
        address = replies.link.remote_source.address
        relay = responder.create_sender(None)
        sent = [send(relay, Message(address=address, body=f"r{i}")) for i in range(3)]
        assert settled(responder, sent[2]) == [Delivery.REJECTED]
        assert sent[2].remote.condition.name == "amqp:resource-limit-exceeded"
        assert "has no credit for more" in sent[2].remote.condition.description
        assert not sent[0].settled and not sent[1].settled  # (sent, and held)
        got = receive_n(replies, 2)  # (each receive gives the link credit again)
        assert [m.body for m in got] == ["r0", "r1"]
        assert settled(responder, *sent[:2], requester=requester) == [Delivery.ACCEPTED, Delivery.ACCEPTED]
    finally:
        requester.close()
        responder.close()


def test_the_reply_address_goes_with_its_link(proxy):
    requester, responder = connect(proxy.url), connect(proxy.url)
    try:
        replies = requester.create_receiver(None, dynamic=True, credit=10)
        address = replies.link.remote_source.address
        attached = responder.create_sender(address)
        relay = responder.create_sender(None)
        replies.close()
        with pytest.raises(LinkDetached) as e:  # (detached with the address)
            responder.wait(lambda: False, timeout=10)
        assert "amqp:resource-deleted" in str(e.value) and "its receiver detached" in str(e.value)
        assert attached.link.remote_condition.name == "amqp:resource-deleted"
        with pytest.raises(LinkDetached) as e:
            responder.create_sender(address)
        assert "amqp:not-found" in str(e.value) and "no reply address" in str(e.value)
        d = send(relay, Message(address=address, body="late"))
        assert settled(responder, d) == [Delivery.REJECTED] and d.remote.condition.name == "amqp:not-found"
    finally:
        requester.close()
        responder.close()


def test_request_reply_with_rhea(proxy):
    queue = _requests(proxy)
    port = proxy.url.rsplit(":", 1)[1]
    [result] = run_js("request_reply.js", port, queue)
    assert result["address"].startswith(PREFIX), result
    assert sorted(r["body"] for r in result["replies"]) == ["pong 1", "pong 2"], result
    assert {r["correlation_id"] for r in result["replies"]} == {"q1"}, result
    assert sorted(result["outcomes"]) == ["anonymous: accepted", "named: accepted"], result


@pytest.mark.rabbitmq4
def test_across_users_with_pass_through_logins(rabbitmq4):
    """With pass-through logins each user's connections are served apart (an upstream connection of
    their own): a responder logged in as another user than its requester still reaches the reply
    address."""
    user = f"rr-{uuid.uuid4().hex[:8]}"
    assert rabbitmq4.ctl("add_user", user, "secret").returncode == 0
    daemon = None
    try:
        assert rabbitmq4.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*").returncode == 0
        daemon = Daemon("--set", "upstream.credentials=pass-through", upstream=rabbitmq4.url)
        requester = connect(daemon.url.replace("amqp://", "amqp://guest:guest@"))
        responder = connect(daemon.url.replace("amqp://", f"amqp://{user}:secret@"))
        try:
            replies = requester.create_receiver(None, dynamic=True, credit=10)
            d = send(responder.create_sender(None), Message(address=replies.link.remote_source.address, body="pong"))
            assert [m.body for m in receive_n(replies, 1)] == ["pong"]
            assert settled(responder, d, requester=requester) == [Delivery.ACCEPTED]
        finally:
            requester.close()
            responder.close()
    finally:
        if daemon is not None:
            daemon.stop()
            assert "Traceback" not in daemon.log(), daemon.log()
        rabbitmq4.ctl("delete_user", user)
