"""`[security]` in front of RabbitMQ 3.10 and 4.0, with the daemon's own account upstream
(`upstream.credentials = "configured"`: RabbitMQ only ever sees the proxy's user, so the daemon's
permissions are all there is): every spelling of a queue or a topic is decided alike, a wildcard
subscription is granted only where every key it covers is, and on RabbitMQ 4 `/management` requests
need `manage` on what they name."""

from __future__ import annotations

import uuid

import pytest
from proton import Message, symbol
from proton.reactor import LinkOption
from proton.utils import LinkDetached

from clients import delete_queue, link_name, receive_n
from launcher import Daemon
from users import PASSWORDS, USERS, login

CONFIG = USERS + """[security.roles]
alice = ["alice", "team"]
bob = ["team"]

[[security.settings]]
match = "/exchanges/amq.topic/alice.#"
consume = ["alice"]
send = ["alice"]

[[security.settings]]
match = "/exchanges/amq.topic/#"
consume = ["team"]
send = ["team"]

[[security.settings]]
match = "/queues/alice.#"
consume = ["alice"]
send = ["alice"]
manage = ["alice"]

[[security.settings]]
match = "/queues/shared.#"
consume = ["team"]
send = ["team"]
manage = ["team"]
"""


@pytest.fixture(scope="module")
def secured(rabbitmq):
    d = Daemon(config=CONFIG, upstream=rabbitmq)
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


def refused(attach) -> str:
    with pytest.raises(LinkDetached) as info:
        attach()
    assert "unauthorized-access" in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.rabbitmq
def test_every_spelling_of_a_queue_is_decided_alike(secured, rabbitmq_broker):
    bob = login(secured, "bob")
    queue = f"alice.private-{uuid.uuid4().hex[:6]}"
    forms = [f"/queue/{queue}", f"/amq/queue/{queue}", queue]
    if rabbitmq_broker.url.endswith(":5682"):
        forms.append(f"/queues/{queue}")
    try:
        for address in forms:
            text = refused(lambda: bob.create_receiver(address, name=link_name(), credit=1))
            assert "bob" in text and "consume" in text
            refused(lambda: bob.create_sender(address, name=link_name()))
        shared = bob.create_sender(f"/queue/shared.{uuid.uuid4().hex[:6]}", name=link_name())
        shared.send(Message(body="fine"))  # the connection carries on
    finally:
        bob.close()


@pytest.mark.rabbitmq
def test_a_wildcard_subscription_needs_every_key_it_covers(secured):
    alice, bob = login(secured, "alice"), login(secured, "bob")
    try:
        refused(lambda: bob.create_receiver("/exchange/amq.topic/alice.#", name=link_name(), credit=1))
        refused(lambda: bob.create_receiver("/topic/alice.salary", name=link_name(), credit=1))
        refused(lambda: bob.create_receiver("/topic/#", name=link_name(), credit=1))  # covers alice.#
        key = f"news.{uuid.uuid4().hex[:6]}"
        news = bob.create_receiver(f"/topic/{key}", name=link_name(), credit=10)
        mine = alice.create_receiver("/topic/alice.salary", name=link_name(), credit=10)
        bob.create_sender(f"/topic/{key}", name=link_name()).send(Message(body="for everyone"))
        alice.create_sender("/topic/alice.salary", name=link_name()).send(Message(body="alice's"))
        assert [m.body for m in receive_n(news, 1)] == ["for everyone"]
        assert [m.body for m in receive_n(mine, 1)] == ["alice's"]
        refused(lambda: bob.create_sender("/topic/alice.salary", name=link_name()))
    finally:
        alice.close()
        bob.close()
    assert "authorization: refused consume on '/exchange/amq.topic/alice.#' for user 'bob'" in secured.log()


class _Paired(LinkOption):
    def apply(self, link) -> None:
        from proton import Link, PropertyDict
        link.source.address = "/management"
        link.target.address = "/management"
        link.snd_settle_mode = Link.SND_SETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        link.properties = PropertyDict({symbol("paired"): True})


@pytest.mark.rabbitmq
@pytest.mark.rabbitmq4
def test_management_requests_need_manage(rabbitmq4):
    d = Daemon(config=CONFIG, upstream=rabbitmq4.url)
    bob = login(d, "bob")
    try:
        name = f"mgmt-{uuid.uuid4().hex[:8]}"
        snd = bob.create_sender("/management", name=name, options=_Paired())
        rcv = bob.create_receiver("/management", name=name, options=_Paired(), credit=10)

        def request(path: str, method: str, body=None) -> Message:
            snd.send(Message(id=str(uuid.uuid4()), body=body, inferred=False, reply_to="$me", address=path,
                             subject=method, durable=False))
            return rcv.receive(timeout=10)

        declare = {"durable": True, "exclusive": False, "auto_delete": False, "arguments": {"x-expires": 600_000}}
        shared = f"shared.{uuid.uuid4().hex[:6]}"
        ok = request(f"/queues/{shared}", "PUT", declare)
        assert ok.subject in ("200", "201"), (ok.subject, ok.body)
        no = request(f"/queues/alice.{uuid.uuid4().hex[:6]}", "PUT", declare)
        assert no.subject == "403" and "manage" in no.body and "bob" in no.body
        assert request("/queues/alice.private/messages", "DELETE").subject == "403"  # purge
        bind = request("/bindings", "POST", {"source": "amq.topic", "destination_queue": shared,
                                             "binding_key": "alice.#", "arguments": {}})
        assert bind.subject == "403", (bind.subject, bind.body)  # alice's keys into bob's queue
        assert request(f"/queues/{shared}", "PUT", declare).subject == "200"  # the pair carries on
    finally:
        bob.close()
        d.stop()
    delete_queue(rabbitmq4.url, shared)
    assert "authorization: refused manage" in d.log()


DURABLE = CONFIG.replace('''match = "/exchanges/amq.topic/#"
consume = ["team"]''', '''match = "/exchanges/amq.topic/#"
durable = ["team"]
consume = ["team"]''')


@pytest.mark.rabbitmq
def test_a_durable_subscription_belongs_to_its_user(rabbitmq):
    """alice and bob, with the same client id and subscription name: two subscriptions, neither
    can unsubscribe the other's (Qpid JMS's frames, tests/support/jms_frames.py)."""
    from proton.utils import BlockingConnection

    from jms_frames import subscribe, unsubscribe

    def detach(conn, receiver) -> None:  # (jms_frames.detach, with a barrier the settings refuse: answered all the same)
        receiver.link.detach()
        with pytest.raises(LinkDetached):
            conn.create_sender(f"after-detach-{uuid.uuid4().hex[:6]}")

    d = Daemon(config=DURABLE, upstream=rabbitmq)
    topic = f"/topic/news.{uuid.uuid4().hex[:6]}"
    name = f"sub-{uuid.uuid4().hex[:6]}"
    container = f"client-{uuid.uuid4().hex[:6]}"

    def login_as(user):
        from proton.reactor import Container
        c = Container()
        c.container_id = container
        return BlockingConnection(d.url, timeout=10, container=c, user=user,
                                  password=PASSWORDS[user], allowed_mechs="PLAIN")

    try:
        alice = login_as("alice")
        sub = subscribe(alice, topic, name, "TRUE")
        detach(alice, sub)
        alice.close()
        bob = login_as("bob")
        try:
            with pytest.raises(LinkDetached) as info:  # no subscription of bob's under that name
                unsubscribe(bob, name)
            assert "amqp:not-found" in str(info.value)
        finally:
            bob.close()
        publisher = login(d, "alice")
        publisher.create_sender(topic, name=link_name()).send(Message(body="kept for alice"))
        publisher.close()
        alice = login_as("alice")
        try:
            back = subscribe(alice, topic, name, "TRUE")
            assert [m.body for m in receive_n(back, 1)] == ["kept for alice"]
            detach(alice, back)
            unsubscribe(alice, name)  # hers: found and removed
        finally:
            alice.close()
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()
