"""Terminus properties that decide how RabbitMQ declares or finds a node go upstream as the client set
them: a receiver with a durable source on an existing durable `/queue/q` attaches through the daemon
as it does directly (RabbitMQ 3.10 declares `/queue/` nodes from the source's durability and refuses
an inequivalent one with PRECONDITION_FAILED)."""

from __future__ import annotations

import uuid

import pytest
from proton import Message, Terminus
from proton.reactor import LinkOption

from clients import connect, receive_n

pytestmark = pytest.mark.rabbitmq


class DurableSource(LinkOption):
    def apply(self, link) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.durability = Terminus.DELIVERIES
        terminus.expiry_policy = Terminus.EXPIRE_NEVER


def test_a_durable_source_on_an_existing_durable_queue_attaches_as_it_does_directly(proxy, rabbitmq):
    q = f"/queue/durable-{uuid.uuid4().hex[:10]}"
    direct = connect(rabbitmq)
    try:
        direct.create_receiver(q, credit=0, options=DurableSource())  # declares q durable
        direct.create_sender(q, options=DurableSource()).send(Message(body="kept", durable=True))
    finally:
        direct.close()
    c = connect(proxy.url)
    try:
        r = c.create_receiver(q, credit=10, options=DurableSource())
        assert r.link.remote_source.durability == Terminus.DELIVERIES
        assert [m.body for m in receive_n(r, 1, timeout=10)] == ["kept"]
    finally:
        c.close()


def test_a_search_on_a_durable_queue_moves_what_no_link_selects(proxy, rabbitmq):
    """The copies a search moves to the tail of a durable `/queue/q` are published as the queue is
    declared (RabbitMQ 3.10 refuses a publisher whose target's durability differs)."""
    from proton.reactor import Selector

    q = f"/queue/durable-{uuid.uuid4().hex[:10]}"
    direct = connect(rabbitmq)
    try:
        direct.create_receiver(q, credit=0, options=DurableSource())
        s = direct.create_sender(q, options=DurableSource())
        for i in range(300):
            s.send(Message(body=i, durable=True, properties={"half": int(i == 299)}))
    finally:
        direct.close()
    c = connect(proxy.url)
    try:
        r = c.create_receiver(q, credit=1, options=[DurableSource(), Selector("half = 1")])
        assert [m.body for m in receive_n(r, 1, timeout=20)] == [299]
    finally:
        c.close()
    rest = connect(rabbitmq)
    try:
        r = rest.create_receiver(q, credit=300, options=DurableSource())
        assert sorted(m.body for m in receive_n(r, 299, timeout=20)) == list(range(299))
    finally:
        rest.close()
