"""Qpid JMS's durable subscription frames, reproduced with python-qpid-proton (Qpid JMS cannot be
installed here), after qpid-jms-client:
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

from proton import Terminus
from proton.reactor import Copy, LinkOption, Selector

from clients import Capabilities


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


def unsubscribe(conn, name: str):
    u = conn.create_receiver(None, name=name, options=NullSource())
    assert u.link.remote_source.type == Terminus.SOURCE  # Qpid JMS requires a source in the reply
    u.close()
    return u


def shared_subscribe(conn, topic: str, name: str, selector: str):
    """Qpid JMS's shared durable subscriber (`createSharedDurableConsumer`): capability `shared`
    beside `topic` on a durable source (AmqpConsumerBuilder.configureSource, `SHARED`)."""
    return conn.create_receiver(topic, name=name, credit=10,
                                options=[DurableSubscriber(), Copy(), Capabilities("topic", "shared"),
                                         Selector(selector)])
