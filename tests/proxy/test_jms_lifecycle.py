"""Qpid JMS's durable subscription lifecycle through the daemon, frame for frame
as Qpid JMS sends it (it cannot be installed here), as Artemis behaves: subscribe, close (detach
without closing), resubscribe, change the selector, unsubscribe by name with a null source; and, in
front of RabbitMQ 3.10, the bound on the durable subscriptions the daemon keeps (`limits.kept_subscriptions`).

The frames are Qpid JMS's, reproduced with proton in tests/support/jms_frames.py (each cites its source).
"""

from __future__ import annotations

import uuid

import pytest
from proton import Delivery, Message
from proton.reactor import Copy
from proton.utils import LinkDetached

from clients import Capabilities, connect, receive_until_quiet
from jms_frames import DurableSubscriber, NullSource, detach, shared_subscribe, subscribe, unsubscribe
from launcher import Daemon, free_port, metric_value, scrape


def publish(conn, topic: str, *colours: str, unroutable: bool = False) -> None:
    """unroutable: nobody may be subscribed (RabbitMQ 4 releases a message no queue is bound for)."""
    s = conn.create_sender(topic, options=Capabilities("topic", target=True))
    for i, colour in enumerate(colours):
        s.send(Message(body=f"{colour}-{i}", properties={"color": colour}),
               error_states=[Delivery.REJECTED] if unroutable else None)
    s.close()


@pytest.fixture(scope="module")
def embedded():
    """A daemon on its embedded broker, which keeps durable subscriptions as Artemis does."""
    d = Daemon()
    d.forms = ("multicast://{}", "anycast://{}")
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_the_qpid_jms_durable_subscription_lifecycle(daemon):
    """On the embedded broker (as Artemis) and in front of RabbitMQ 3.10 and 4.0, where the daemon
    keeps the subscription itself while its subscriber is detached."""
    topic = daemon.forms[0].format(f"orders-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url, container_id="jms-client-1")
    try:
        sub = subscribe(c, topic, "sub", "color = 'red'")
        detach(c, sub)
        publish(c, topic, "red", "blue", "red")  # kept for the subscription while nobody is attached
        sub = subscribe(c, topic, "sub", "color = 'red'")
        assert sorted(m.body for m in receive_until_quiet(sub, idle=0.5)) == ["red-0", "red-2"]
        detach(c, sub)
        publish(c, topic, "red", "blue")
        sub = subscribe(c, topic, "sub", "color = 'blue'")  # a new selector: a new subscription (JMS)
        assert receive_until_quiet(sub, idle=0.5) == []
        publish(c, topic, "red", "blue")
        assert [m.body for m in receive_until_quiet(sub, idle=0.5)] == ["blue-1"]
        detach(c, sub)
        publish(c, topic, "blue")
        unsubscribe(c, "sub")
        publish(c, topic, "blue", unroutable=True)  # after the unsubscribe: nobody keeps it
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(None, name="sub", options=NullSource())
        assert info.value.link.remote_condition.name == "amqp:not-found"
    finally:
        c.close()
    # (a new connection: the refused lookup's link is left half-detached by the blocking client)
    c = connect(daemon.url, container_id="jms-client-1")
    try:
        sub = subscribe(c, topic, "sub", "color = 'blue'")
        assert receive_until_quiet(sub, idle=0.5) == []  # the old subscription and its message are gone
    finally:
        c.close()


def test_unsubscribing_a_shared_durable_subscription(embedded):
    daemon = embedded
    topic = daemon.forms[0].format(f"orders-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url, container_id="jms-client-2")
    try:
        sub = c.create_receiver(topic, name="shared-sub", credit=10,
                                options=[DurableSubscriber(), Copy(), Capabilities("topic", "shared")])
        detach(c, sub)
        publish(c, topic, "red")
        unsubscribe(c, "shared-sub")
        with pytest.raises(LinkDetached):
            c.create_receiver(None, name="shared-sub", options=NullSource())
    finally:
        c.close()


def test_a_durable_subscription_outlives_its_subscribers_connection(daemon):
    """A JMS client that stops (its connection closes without detaching its durable subscriber)
    and starts again with the same client id finds what was published meanwhile: the embedded
    broker keeps the subscription, and in front of RabbitMQ the daemon keeps it attached upstream."""
    topic = daemon.forms[0].format(f"orders-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url, container_id="jms-client-3")
    try:
        subscribe(c, topic, "sub", "color = 'red'")
    finally:
        c.close()
    p = connect(daemon.url)
    try:
        publish(p, topic, "red", "blue", "red")
    finally:
        p.close()
    c = connect(daemon.url, container_id="jms-client-3")
    try:
        sub = subscribe(c, topic, "sub", "color = 'red'")
        assert sorted(m.body for m in receive_until_quiet(sub, idle=0.5)) == ["red-0", "red-2"]
        detach(c, sub)
        unsubscribe(c, "sub")
    finally:
        c.close()


LIMIT = 2


@pytest.fixture
def limited(rabbitmq3):
    """A daemon in front of RabbitMQ 3.10 that keeps at most two durable subscriptions (in front of
    RabbitMQ 4 the broker keeps them: tests/proxy/test_durable_on_broker.py)."""
    mport = free_port()
    d = Daemon("--metrics", f"127.0.0.1:{mport}", upstream=rabbitmq3.url,
               config=f"[limits]\nkept_subscriptions = {LIMIT}\n")
    d.metrics_port = mport
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


def refused_beyond_the_limit(daemon, topic: str, client: str, name: str) -> str:
    """`name`'s subscribe, from `client` on a connection of its own, is refused for the limit: the
    refusal's description."""
    c = connect(daemon.url, container_id=client)
    try:
        with pytest.raises(LinkDetached) as info:
            subscribe(c, topic, name, "color = 'red'")
        condition = info.value.link.remote_condition
    finally:
        c.close()
    assert condition.name == "amqp:resource-limit-exceeded", condition
    assert f"limits.kept_subscriptions = {LIMIT}" in condition.description
    assert f"durable subscription {name!r} of client {client!r}" in condition.description
    return condition.description


def refusals(daemon) -> float:
    return metric_value(scrape(daemon.metrics_port), "broker_filter_attach_refused_total", reason="kept-subscriptions")


@pytest.mark.rabbitmq
def test_a_new_durable_subscription_beyond_the_kept_limit_is_refused_and_nothing_kept_is_lost(limited):
    """Two durable subscriptions kept (their subscribers detached): a third is refused at its attach;
    the two resume with everything they collected; after an unsubscribe the third is accepted."""
    topic = f"/topic/orders-{uuid.uuid4().hex[:8]}"
    c = connect(limited.url, container_id="jms-kept-1")
    try:
        detach(c, subscribe(c, topic, "red", "color = 'red'"))
        detach(c, subscribe(c, topic, "blue", "color = 'blue'"))
        publish(c, topic, "red", "blue", "red", "green")
        refused_beyond_the_limit(limited, topic, "jms-kept-1", "third")
        assert refusals(limited) == 1
        assert "refused link 'third': amqp:resource-limit-exceeded" in limited.log()
        red = subscribe(c, topic, "red", "color = 'red'")  # a kept one resumes, at the limit
        assert sorted(m.body for m in receive_until_quiet(red, idle=0.5)) == ["red-0", "red-2"]
        blue = subscribe(c, topic, "blue", "color = 'blue'")
        assert [m.body for m in receive_until_quiet(blue, idle=0.5)] == ["blue-1"]
        detach(c, blue)
        unsubscribe(c, "blue")
        third = subscribe(c, topic, "third", "color = 'green'")  # one below the limit again
        publish(c, topic, "green", "red")
        assert [m.body for m in receive_until_quiet(third, idle=0.5)] == ["green-0"]
        assert [m.body for m in receive_until_quiet(red, idle=0.5)] == ["red-1"]
        assert refusals(limited) == 1
        detach(c, red)
        detach(c, third)
        unsubscribe(c, "red")
        unsubscribe(c, "third")
    finally:
        c.close()


@pytest.mark.rabbitmq
def test_attached_and_kept_durable_subscriptions_both_count_toward_the_limit(limited):
    """One durable subscriber attached, another's client gone (its subscription kept): a new one is
    refused, whichever client asks; resubscribing under a name already counted (another selector
    replaces the subscription, as JMS says) is no new one."""
    topic = f"/topic/orders-{uuid.uuid4().hex[:8]}"
    attached = connect(limited.url, container_id="jms-kept-2")
    gone = connect(limited.url, container_id="jms-kept-3")
    try:
        sub = subscribe(attached, topic, "sub", "color = 'red'")
        subscribe(gone, topic, "sub", "color = 'red'")
    finally:
        gone.close()  # without detaching: its subscription is kept
    try:
        publish(attached, topic, "red")
        assert [m.body for m in receive_until_quiet(sub, idle=0.5)] == ["red-0"]
        refused_beyond_the_limit(limited, topic, "jms-kept-4", "sub")
        refused_beyond_the_limit(limited, topic, "jms-kept-2", "other")
        detach(attached, sub)
        sub = subscribe(attached, topic, "sub", "color = 'blue'")  # replaces the red one: still two
        publish(attached, topic, "blue")
        assert [m.body for m in receive_until_quiet(sub, idle=0.5)] == ["blue-0"]
        assert refusals(limited) == 2
        detach(attached, sub)
        unsubscribe(attached, "sub")
    finally:
        attached.close()
    back = connect(limited.url, container_id="jms-kept-3")
    try:
        sub = subscribe(back, topic, "sub", "color = 'red'")
        assert [m.body for m in receive_until_quiet(sub, idle=0.5)] == ["red-0"]
        detach(back, sub)
        unsubscribe(back, "sub")
    finally:
        back.close()


def test_a_shared_durable_subscription_outlives_its_subscribers(daemon):
    """Two subscribers of one shared durable subscription (one client id, two connections) share its
    messages; with both detached it keeps collecting; the next subscriber gets what it collected;
    the unsubscribe by name ends it.  On the embedded broker as on Artemis; in front of RabbitMQ 3.10
    the daemon keeps it, in front of RabbitMQ 4 it is a queue on the broker."""
    topic = daemon.forms[0].format(f"orders-{uuid.uuid4().hex[:8]}")
    a = connect(daemon.url, container_id="jms-shared-1")
    b = connect(daemon.url, container_id="jms-shared-1")
    try:
        sa = shared_subscribe(a, topic, "shared-sub", "color = 'red'")
        sb = shared_subscribe(b, topic, "shared-sub", "color = 'red'")
        publish(a, topic, "red", "blue", "red", "red")
        got = [m.body for m in receive_until_quiet(sa, idle=0.5)] + [m.body for m in receive_until_quiet(sb, idle=0.5)]
        assert sorted(got) == ["red-0", "red-2", "red-3"]  # each once, between the two
        detach(a, sa)
        detach(b, sb)
        publish(a, topic, "red", "blue")
        sa = shared_subscribe(a, topic, "shared-sub", "color = 'red'")
        assert [m.body for m in receive_until_quiet(sa, idle=0.5)] == ["red-0"]
        detach(a, sa)
        unsubscribe(a, "shared-sub")
        publish(a, topic, "red", unroutable=True)
    finally:
        a.close()
        b.close()
    c = connect(daemon.url, container_id="jms-shared-1")
    try:
        sub = shared_subscribe(c, topic, "shared-sub", "color = 'red'")
        assert receive_until_quiet(sub, idle=0.5) == []  # the old subscription and its message are gone
        detach(c, sub)
        unsubscribe(c, "shared-sub")
    finally:
        c.close()


def test_a_shared_durable_subscription_keeps_its_selector_while_it_has_subscribers(daemon):
    topic = daemon.forms[0].format(f"orders-{uuid.uuid4().hex[:8]}")
    a = connect(daemon.url, container_id="jms-shared-2")
    b = connect(daemon.url, container_id="jms-shared-2")
    try:
        sa = shared_subscribe(a, topic, "shared-sub", "color = 'red'")
        with pytest.raises(LinkDetached) as info:
            shared_subscribe(b, topic, "shared-sub", "color = 'blue'")
        assert info.value.link.remote_condition.name in ("amqp:resource-locked", "amqp:precondition-failed",
                                                         "amqp:not-allowed")
        publish(a, topic, "red", "blue")
        assert [m.body for m in receive_until_quiet(sa, idle=0.5)] == ["red-0"]
        detach(a, sa)
        unsubscribe(a, "shared-sub")
    finally:
        a.close()
        b.close()
