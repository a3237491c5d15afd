"""Qpid JMS's durable subscription lifecycle through the daemon, frame for frame
as Qpid JMS sends it (it cannot be installed here), as Artemis behaves: subscribe, close (detach
without closing), resubscribe, change the selector, unsubscribe by name with a null source.

Frames reproduced with python-qpid-proton, after qpid-jms-client:
- subscribe: `AmqpConsumerBuilder.configureSource` — link name = the subscription name, source
  durable `unsettled-state`, expiry `never`, distribution-mode `copy`, capability `topic`
  (`AmqpDestinationHelper.toTypeCapability`), the selector under `jms-selector`;
- close of a durable consumer: a detach with closed=false (`AmqpConsumer.close` of a durable one);
- unsubscribe: `AmqpConnectionSession.unsubscribe` / `DurableSubscriptionReattachBuilder` — a
  receiver with the subscription's link name, no source at all, an empty target; the reply must carry
  a source (else "Cannot remove a subscription that does not exist"), then a detach with closed=true.
"""

from __future__ import annotations

import uuid

import pytest
from proton import Message, Terminus
from proton.reactor import Copy, LinkOption, Selector
from proton.utils import LinkDetached

from clients import Capabilities, connect, receive_until_quiet
from launcher import Daemon


class DurableSubscriber(LinkOption):
    def apply(self, link) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


class NullSource(LinkOption):
    def apply(self, link) -> None:
        link.source.type = Terminus.UNSPECIFIED


def subscribe(conn, topic: str, name: str, selector: str):
    return conn.create_receiver(topic, name=name, credit=10,
                                options=[DurableSubscriber(), Copy(), Capabilities("topic"), Selector(selector)])


def detach(conn, receiver) -> None:
    """Detach without closing; the daemon handles a connection's frames in order, so a link attached
    after it was answered means the detach was handled."""
    receiver.link.detach()
    conn.create_sender(f"after-detach-{uuid.uuid4().hex[:6]}").close()


def publish(conn, topic: str, *colours: str) -> None:
    s = conn.create_sender(topic, options=Capabilities("topic", target=True))
    for i, colour in enumerate(colours):
        s.send(Message(body=f"{colour}-{i}", properties={"color": colour}))
    s.close()


def unsubscribe(conn, name: str):
    u = conn.create_receiver(None, name=name, options=NullSource())
    assert u.link.remote_source.type == Terminus.SOURCE  # Qpid JMS requires a source in the reply
    u.close()
    return u


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
        publish(c, topic, "blue")  # after the unsubscribe: nobody keeps it
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
