"""Outcomes with annotations (what RabbitMQ 4's clients call discard and requeue with annotations).

- `modified{undeliverable-here}` (a discard) reaches RabbitMQ 4 as the client sent it, so RabbitMQ
  dead-letters the message as it would for a consumer of its own; RabbitMQ 3.10 ends the session on
  any `modified`, so in front of it the proxy keeps the message from that link, as before.
- `modified` with message-annotations and without undeliverable-here (a requeue with annotations),
  where the proxy keeps the message: the annotations are merged into it for its next delivery
  (AMQP 1.0 3.4.5)."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest
from proton import Delivery, Message, symbol

from clients import _management, connect, declare_queue, receive_n



def modify(receiver, *, undeliverable: bool, annotations: dict | None = None) -> None:
    """Settle the oldest unsettled delivery of a blocking receiver as `modified`."""
    delivery = receiver.fetcher.unsettled[0]
    delivery.local.failed = True
    delivery.local.undeliverable = undeliverable
    if annotations:
        delivery.local.annotations = annotations
    receiver.settle(Delivery.MODIFIED)


def test_requeue_with_annotations_merges_them_into_the_next_delivery(daemon):
    q = daemon.forms[1].format(f"ann-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        r = c.create_receiver(q, credit=1)
        c.create_sender(q).send(Message(body="m", annotations={symbol("x-opt-kept"): 1}))
        assert r.receive(timeout=10).body == "m"
        modify(r, undeliverable=False, annotations={symbol("x-opt-reason"): "retry"})
        again = receive_n(r, 1, timeout=10)[0]
        assert again.body == "m" and again.delivery_count == 1
        assert again.annotations[symbol("x-opt-reason")] == "retry" and again.annotations[symbol("x-opt-kept")] == 1
    finally:
        c.close()


def test_a_requeue_with_annotations_keeps_them_after_the_consumer_leaves(daemon, request):
    """The proxy held the requeued message for the link; the link goes: the message goes back
    upstream `modified` with the client's annotations, so the next consumer finds them (as RabbitMQ
    4's own consumers do, and its client's test suite checks; RabbitMQ 4.0 keeps a requeue's
    annotations on quorum queues only, checked directly).  RabbitMQ 3.10 takes no `modified`: there
    the message goes back released, without them, and is not lost."""
    name = f"ann-{uuid.uuid4().hex[:8]}"
    q = daemon.forms[1].format(name)
    if "rabbitmq4" in request.node.callspec.id:
        declare_queue(request.getfixturevalue("rabbitmq4").url, name, "quorum")
        q = f"/queues/{name}"
    c = connect(daemon.url)
    try:
        c.create_sender(q).send(Message(body="m"))
        first = c.create_receiver(q, credit=1)
        assert first.receive(timeout=10).body == "m"
        modify(first, undeliverable=False, annotations={symbol("x-opt-reason"): "retry"})
        first.close()
        (again,) = receive_n(c.create_receiver(q, credit=1), 1, timeout=10)
        assert again.body == "m"
        if "rabbitmq3" in request.node.callspec.id:
            assert symbol("x-opt-reason") not in (again.annotations or {})
        else:
            assert again.annotations[symbol("x-opt-reason")] == "retry", again.annotations
    finally:
        c.close()


@pytest.mark.rabbitmq
def test_a_discard_is_dead_lettered_by_rabbitmq_4(rabbitmq4):
    from launcher import Daemon

    name = f"dl-{uuid.uuid4().hex[:8]}"
    declare_queue(rabbitmq4.url, f"{name}-dlq")
    _management(rabbitmq4.url, "PUT", f"/queues/{quote(name, safe='')}",
                {"durable": True, "arguments": {"x-queue-type": "classic", "x-expires": 600_000,
                                                "x-dead-letter-exchange": "",
                                                "x-dead-letter-routing-key": f"{name}-dlq"}})
    d = Daemon(upstream=rabbitmq4.url)
    try:
        c = connect(d.url)
        try:
            r = c.create_receiver(f"/queues/{name}", credit=1)
            c.create_sender(f"/queues/{name}").send(Message(body="discarded"))
            assert r.receive(timeout=10).body == "discarded"
            modify(r, undeliverable=True, annotations={symbol("x-opt-why"): "bad"})
            dlq = c.create_receiver(f"/queues/{name}-dlq", credit=1)
            dead = receive_n(dlq, 1, timeout=10)[0]
            # dead-lettered as RabbitMQ 4.0 does for its own consumer's discard (which keeps none of
            # the outcome's annotations on 4.0; checked directly)
            assert dead.body == "discarded" and dead.annotations[symbol("x-first-death-reason")] == "rejected"
        finally:
            c.close()
    finally:
        d.stop()
    assert "Traceback" not in d.log()
