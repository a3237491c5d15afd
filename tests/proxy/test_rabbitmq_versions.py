"""Where RabbitMQ 3.10 and 4.0 differ as upstreams, through the daemon: the `modified` outcome (3.10
ends the session on it, so the proxy sends `released`; 4.0 honours it and gets it unchanged), v2
addresses (`/queues/q`, `/exchanges/x/key`, 4.0 only) and a missing queue (4.0 ends the session),
and quick link churn (4.0 mishandles a `begin` on a channel whose session is still ending)."""

from __future__ import annotations

import uuid

import pytest
from proton import Delivery, Message
from proton.reactor import Selector
from proton.utils import LinkDetached

from clients import bind_queue, connect, declare_queue, receive_from_each, receive_n_and_extras, receive_until_quiet

pytestmark = pytest.mark.rabbitmq


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _settle_modified(receiver, delivery_failed: bool, undeliverable_here: bool) -> None:
    """Settle the oldest unsettled message as modified with these flags."""
    dlv = receiver.fetcher.unsettled.popleft()
    dlv.local.failed = delivery_failed
    dlv.local.undeliverable = undeliverable_here
    dlv.update(Delivery.MODIFIED)
    dlv.settle()


def test_modified_delivery_failed_on_a_queue_is_redelivered_by_the_proxy_with_the_count_raised(proxy, rabbitmq_broker):
    """On a queue the proxy keeps custody of a message the client settles as modified: it offers it
    again itself, first-acquirer false and delivery-count raised (AMQP 1.0 3.4), on both versions;
    nothing goes upstream, so RabbitMQ 3.10 never sees the `modified` it cannot take."""
    name = _name("mod")
    if rabbitmq_broker.major >= 4:
        # a quorum queue counts failed deliveries: the count shows what reached the broker
        declare_queue(rabbitmq_broker.url, name, "quorum")
        address = f"/queues/{name}"
    else:
        address = f"/queue/{name}"
    c = connect(proxy.url)
    try:
        r = c.create_receiver(address, credit=1, options=Selector("n >= 0"))
        s = c.create_sender(address)
        s.send(Message(body="m", properties={"n": 1}))
        (first,) = receive_n_and_extras(r, 1, accept=False)
        assert first.delivery_count == 0
        _settle_modified(r, delivery_failed=True, undeliverable_here=False)
        (again,) = receive_n_and_extras(r, 1, accept=False)
        assert again.body == "m" and again.first_acquirer is False
        assert again.delivery_count == 1
        r.accept()
        s.send(Message(body="after", properties={"n": 2}))  # the upstream session is still there
        assert [m.body for m in receive_n_and_extras(r, 1)] == ["after"]
    finally:
        c.close()
    assert "connected (RabbitMQ " + rabbitmq_broker.version in proxy.log()


def test_modified_undeliverable_here_on_a_subscription(proxy, rabbitmq_broker):
    """On a topic subscription the client's modified{undeliverable-here} ends that link's copy, as
    RabbitMQ 4 treats it for its own clients (dead-lettered; no dead-letter exchange here: gone): the
    link shares the address's upstream subscription, so the daemon decides for its copy, on RabbitMQ
    3.10 too (which would otherwise get `released` and offer the message again)."""
    topic = _name("und")
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/topic/{topic}", credit=1, options=Selector("n >= 0"))
        s = c.create_sender(f"/topic/{topic}")
        s.send(Message(body="once", subject=topic, properties={"n": 1}))
        assert [m.body for m in receive_n_and_extras(r, 1, accept=False, extra_wait=0)] == ["once"]
        _settle_modified(r, delivery_failed=True, undeliverable_here=True)
        back = [m.body for m in receive_until_quiet(r, idle=1.5, limit=5)]
        assert back == []
    finally:
        c.close()


def test_quick_link_churn_every_attach_is_answered(proxy, address):
    """Links attached right after others detached, each answered: on RabbitMQ 3.10 every link has an
    upstream session of its own, begun only once the ended ones are answered (or after a hold); on
    RabbitMQ 4, which frees an ended session's channel only after answering, a link's session
    outlives it and the next link reuses it (no `begin` can reach a dying session)."""
    q = f"/queue/{address}"
    c = connect(proxy.url)
    try:
        for i in range(40):
            s = c.create_sender(q, name=f"s{i}")
            s.send(Message(body=i, properties={"n": i}))
            s.close()
            r = c.create_receiver(q, name=f"r{i}", credit=1, options=Selector(f"n = {i}"))
            assert [m.body for m in receive_n_and_extras(r, 1, extra_wait=0)] == [i]
            r.close()
    finally:
        c.close()


@pytest.mark.rabbitmq4
def test_v2_addresses_competing_filtered_consumers_and_exchange_publishing(proxy4, rabbitmq4):
    """Receivers on `/queues/q` share the queue (each message to one whose filter selects it);
    publishers send to `/queues/q` and to `/exchanges/amq.topic/key` (q bound with key)."""
    q, key = _name("v2q"), _name("v2k")
    declare_queue(rabbitmq4.url, q)
    bind_queue(rabbitmq4.url, q, "amq.topic", key)
    a, b, p = connect(proxy4.url), connect(proxy4.url), connect(proxy4.url)
    try:
        odd = a.create_receiver(f"/queues/{q}", credit=20, options=Selector("odd = TRUE"))
        even = b.create_receiver(f"/queues/{q}", credit=20, options=Selector("odd = FALSE"))
        assert odd.link.remote_source.address == f"/queues/{q}"
        direct = p.create_sender(f"/queues/{q}")
        via_exchange = p.create_sender(f"/exchanges/amq.topic/{key}")
        for i in range(20):
            (direct if i < 10 else via_exchange).send(Message(body=i, properties={"odd": i % 2 == 1}))
        got = receive_from_each({"odd": odd, "even": even}, expect=20)
        assert sorted(m.body for m in got["odd"]) == list(range(1, 20, 2))
        assert sorted(m.body for m in got["even"]) == list(range(0, 20, 2))
    finally:
        for conn in (a, b, p):
            conn.close()


@pytest.mark.rabbitmq4
def test_v2_missing_queue_refuses_only_that_link(proxy4, rabbitmq4):
    """RabbitMQ 4 ends the session on a missing `/queues/` queue; the upstream link has a session of
    its own, so only the client's link concerned is refused (amqp:not-found), as an attach refusal."""
    q = _name("v2ok")
    declare_queue(rabbitmq4.url, q)
    c = connect(proxy4.url)
    try:
        working = c.create_receiver(f"/queues/{q}", credit=10, options=Selector("n >= 0"))
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(f"/queues/{_name('missing')}", credit=1, options=Selector("n >= 0"))
        assert info.value.link.remote_condition.name == "amqp:not-found"
        with pytest.raises(LinkDetached) as info:
            c.create_sender(f"/queues/{_name('missing')}")
        assert info.value.link.remote_condition.name == "amqp:not-found"
        # the client's other link, its connection and the proxy's upstream connection are untouched
        s = c.create_sender(f"/queues/{q}")
        s.send(Message(body="still", properties={"n": 1}))
        assert [m.body for m in receive_n_and_extras(working, 1)] == ["still"]
    finally:
        c.close()
    assert proxy4.log().count("connected (RabbitMQ 4.") == 1  # no reconnect happened


def test_an_upstream_refusal_is_logged_with_the_link_and_the_condition(rabbitmq):
    """A link the upstream refuses is logged with its name, address and the upstream's condition."""
    from launcher import Daemon
    from proton.utils import LinkDetached

    d = Daemon(upstream=rabbitmq)
    try:
        c = connect(d.url)
        try:
            with pytest.raises(LinkDetached):
                c.create_receiver("/exchange/no-such-exchange-for-the-log/key", credit=1)
        finally:
            c.close()
        d.wait_for(r"upstream .* refused link \S+ \(/exchange/no-such-exchange-for-the-log/key\)[^:]*: "
                   r"amqp:not-found", 10)
    finally:
        d.stop()
