"""Durable subscriptions kept on the broker: in front of RabbitMQ 4, and of RabbitMQ 3.x whose
management API the daemon is given (`upstream.management_url`), a JMS durable subscription is a
durable queue of its own on the broker (declared and bound over RabbitMQ 4's `/management` node or
the HTTP API, named from the client id and the subscription name), so it outlives the daemon: a
restart, a SIGKILL, an upstream reconnect and the subscriber's absence meanwhile lose nothing it
selects.

Frames as Qpid JMS sends them (tests/support/jms_frames.py cites the source of each): subscribe with a
durable source (`unsettled-state`, expiry `never`, `copy`, capability `topic`, `jms-selector`),
close a durable consumer with a detach (closed=false), unsubscribe with a null-source attach under
the subscription's name and then a close.
"""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.error
import urllib.request
import uuid

import pytest
from proton import Message
from proton.utils import LinkDetached

from clients import Capabilities, connect, receive_until_quiet
import clients
from jms_frames import NullSource, detach, shared_subscribe, subscribe, unsubscribe
from launcher import Daemon, free_port

pytestmark = [pytest.mark.rabbitmq]


class Node:
    """The broker under test, as the tests need it: its URL, the daemon's configuration for it, and
    its queues looked at directly."""

    def __init__(self, broker, config: str | None = None):
        self.broker = broker
        self.url = broker.url
        self.port = broker.port
        self.config = config
        self.http = getattr(broker, "management_url", None)

    def _api(self, method: str, queue: str, body=None) -> int:
        request = urllib.request.Request(f"{self.http}/api/queues/%2F/{urllib.request.quote(queue, safe='')}",
                                         data=json.dumps(body).encode() if body is not None else None, method=method,
                                         headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    def queue_exists(self, queue: str) -> bool:
        if self.http is None:
            return clients.queue_exists(self.url, queue)
        return self._api("GET", queue) == 200

    def declare_queue(self, queue: str) -> None:
        """A plain durable queue, as the daemon would declare it but without its arguments."""
        if self.http is None:
            clients.declare_queue(self.url, queue, expires=False)
        else:
            assert self._api("PUT", queue, {"durable": True, "arguments": {"x-queue-type": "classic"}}) == 201

    def delete_queue(self, queue: str) -> None:
        if self.http is None:
            clients.delete_queue(self.url, queue)
        else:
            self._api("DELETE", queue)


@pytest.fixture(scope="module", params=[
    pytest.param("rabbitmq4", marks=pytest.mark.rabbitmq4),
    "rabbitmq3-management",
])
def node(request):
    if request.param == "rabbitmq4":
        return Node(request.getfixturevalue("rabbitmq4"))
    broker = request.getfixturevalue("management_node")
    return Node(broker, config=f'[upstream]\nmanagement_url = "{broker.management_url}"\n')


def queue_of(client: str, name: str) -> str:
    return f"broker-filter.durable.{client}.{name}"


def publish(url: str, topic: str, *messages: tuple[str, str]) -> None:
    """(body, colour) pairs to `topic` at `url` (a daemon, or RabbitMQ itself)."""
    c = connect(url)
    try:
        s = c.create_sender(topic, options=Capabilities("topic", target=True))
        for body, colour in messages:
            s.send(Message(body=body, properties={"color": colour}))
        # (no detach of its own: RabbitMQ 3.10 leaves a link's close unanswered; the connection's goes)
    finally:
        c.close()


def refused_subscribe(daemon: Daemon, client: str, topic: str):
    """The condition `client`'s durable subscribe ("sub", red) through `daemon` is refused with."""
    c = connect(daemon.url, container_id=client)
    try:
        with pytest.raises(LinkDetached) as info:
            subscribe(c, topic, "sub", "color = 'red'")
        return info.value.link.remote_condition
    finally:
        c.close()


def bodies(receiver) -> list[str]:
    return sorted(m.body for m in receive_until_quiet(receiver, idle=0.5))


class Daemons:
    """One daemon in front of RabbitMQ 4 at a time, started again as a test asks."""

    def __init__(self, url: str, config: str | None = None):
        self.url, self.config = url, config
        self.daemon: Daemon | None = None
        self.logs: list[str] = []

    def start(self) -> Daemon:
        self.daemon = Daemon(upstream=self.url, config=self.config)
        return self.daemon

    def stop(self, kill: bool = False) -> None:
        d, self.daemon = self.daemon, None
        if d is None:
            return
        if kill:
            d.proc.kill()
            d.proc.wait(10)
        d.stop()
        self.logs.append(d.log())


@pytest.fixture
def daemons(node):
    ds = Daemons(node.url, node.config)
    yield ds
    ds.stop()
    for text in ds.logs:
        assert "Traceback" not in text, text


@pytest.fixture
def topic():
    return f"/topic/orders-{uuid.uuid4().hex[:8]}"


def test_a_durable_subscription_outlives_a_daemon_restart(daemons, topic, node):
    """Subscribe, detach, stop the daemon (SIGTERM); what is published meanwhile, through the
    daemon before it stopped and straight to RabbitMQ while none runs, reaches the subscriber on
    the next daemon; the unsubscribe deletes the queue."""
    client, queue = "jms-restart-1", queue_of("jms-restart-1", "sub")
    d = daemons.start()
    c = connect(d.url, container_id=client)
    detach(c, subscribe(c, topic, "sub", "color = 'red'"))
    c.close()
    assert node.queue_exists(queue)
    publish(d.url, topic, ("r1", "red"), ("b1", "blue"), ("r2", "red"))
    daemons.stop()
    publish(node.url, topic, ("r3", "red"), ("b2", "blue"))
    d = daemons.start()
    c = connect(d.url, container_id=client)
    try:
        sub = subscribe(c, topic, "sub", "color = 'red'")
        assert bodies(sub) == ["r1", "r2", "r3"]
        publish(d.url, topic, ("r4", "red"), ("b3", "blue"))
        assert bodies(sub) == ["r4"]
        detach(c, sub)
        unsubscribe(c, "sub")
    finally:
        c.close()
    assert _gone_soon(node, queue)
    assert f"durable subscription 'jms-restart-1.sub' unsubscribed: deleting its queue {queue}" in d.log()


def test_messages_a_killed_daemon_held_unsettled_come_back(daemons, topic, node):
    """The subscriber holds three deliveries unsettled when the daemon is killed (SIGKILL): the
    broker still has them, and the subscriber gets them on the next daemon (at-least-once: these
    were never accepted, so each comes back)."""
    client = "jms-kill-1"
    d = daemons.start()
    c = connect(d.url, container_id=client)
    sub = subscribe(c, topic, "sub", "color = 'red'")
    publish(d.url, topic, ("r1", "red"), ("b1", "blue"), ("r2", "red"), ("r3", "red"))
    held = [sub.receive(timeout=10) for _ in range(3)]  # received, never accepted
    assert sorted(m.body for m in held) == ["r1", "r2", "r3"]
    daemons.stop(kill=True)
    try:
        c.close()
    except Exception:  # noqa: BLE001 - its daemon is gone
        pass
    publish(node.url, topic, ("r4", "red"))
    d = daemons.start()
    c = connect(d.url, container_id=client)
    try:
        sub = subscribe(c, topic, "sub", "color = 'red'")
        assert bodies(sub) == ["r1", "r2", "r3", "r4"]
        detach(c, sub)
        unsubscribe(c, "sub")
    finally:
        c.close()
    assert _gone_soon(node, queue_of(client, "sub"))


def test_another_selector_after_a_restart_replaces_the_subscription(daemons, topic, node):
    """JMS: subscribing again under the name with another selector is a new subscription; what the
    old one collected goes with it, across a restart too."""
    client = "jms-replace-1"
    d = daemons.start()
    c = connect(d.url, container_id=client)
    detach(c, subscribe(c, topic, "sub", "color = 'red'"))
    c.close()
    publish(d.url, topic, ("r1", "red"), ("b1", "blue"))
    daemons.stop()
    d = daemons.start()
    c = connect(d.url, container_id=client)
    try:
        sub = subscribe(c, topic, "sub", "color = 'blue'")
        assert bodies(sub) == []
        publish(d.url, topic, ("r2", "red"), ("b2", "blue"))
        assert bodies(sub) == ["b2"]
        detach(c, sub)
        assert "resubscribed with another address or selector: its queue" in d.log()
        sub = subscribe(c, topic, "sub", "color = 'blue'")  # the same again: resumed, not replaced
        publish(d.url, topic, ("b3", "blue"))
        assert bodies(sub) == ["b3"]
        assert d.log().count("resubscribed with another address or selector") == 1
        detach(c, sub)
        unsubscribe(c, "sub")
    finally:
        c.close()


def test_an_unsubscribe_after_a_restart_finds_the_subscription_on_the_broker(daemons, topic, node):
    client, queue = "jms-unsub-1", queue_of("jms-unsub-1", "sub")
    d = daemons.start()
    c = connect(d.url, container_id=client)
    detach(c, subscribe(c, topic, "sub", "color = 'red'"))
    c.close()
    daemons.stop()
    d = daemons.start()
    c = connect(d.url, container_id=client)
    try:
        u = unsubscribe(c, "sub")
        assert u.link.remote_source.address == topic  # the subscription's own address, from its queue
        assert _gone_soon(node, queue)
    finally:
        c.close()
    c = connect(d.url, container_id=client)  # (the refused lookup's link stays half-detached: a new connection)
    try:
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(None, name="sub", options=NullSource())
        condition = info.value.link.remote_condition
        assert condition.name == "amqp:not-found"
        assert f"no durable subscription named 'sub' of client {client!r}" in condition.description
        assert queue in condition.description
    finally:
        c.close()


def _gone_soon(node: Node, queue: str, tries: int = 100) -> bool:
    """The queue is gone, at once or within 10 s: the daemon deletes it when the unsubscribe link
    closes, and the close's answer does not wait for the broker's."""
    import time

    for _ in range(tries):
        if not node.queue_exists(queue):
            return True
        time.sleep(0.1)
    return False


def test_a_queue_of_that_name_the_daemon_did_not_make_is_not_used(daemons, topic, node):
    """A queue of the subscription's name that someone else declared is neither consumed nor deleted."""
    client = "jms-foreign-1"
    queue = queue_of(client, "sub")
    node.declare_queue(queue)  # (as the daemon would declare it, but without its arguments)
    d = daemons.start()
    try:
        condition = refused_subscribe(d, client, topic)
        assert condition.name == "amqp:precondition-failed"
        assert f"queue {queue!r} exists on the broker and was not made by broker-filter" in condition.description
        assert "durable subscription 'sub'" in condition.description
        assert node.queue_exists(queue)
    finally:
        node.delete_queue(queue)


def test_the_kept_subscription_limit_does_not_bound_what_the_broker_keeps(node, topic):
    """`limits.kept_subscriptions` bounds what the daemon itself holds (in front of RabbitMQ 3.10);
    in front of RabbitMQ 4 a detached subscription costs the daemon nothing."""
    ds = Daemons(node.url, config=(node.config or "") + "[limits]\nkept_subscriptions = 1\n")
    d = ds.start()
    try:
        c = connect(d.url, container_id="jms-limit-4")
        try:
            detach(c, subscribe(c, topic, "red", "color = 'red'"))
            detach(c, subscribe(c, topic, "blue", "color = 'blue'"))
            publish(d.url, topic, ("r1", "red"), ("b1", "blue"))
            red = subscribe(c, topic, "red", "color = 'red'")
            blue = subscribe(c, topic, "blue", "color = 'blue'")
            assert bodies(red) == ["r1"] and bodies(blue) == ["b1"]
            for name, link in (("red", red), ("blue", blue)):
                detach(c, link)
                unsubscribe(c, name)
        finally:
            c.close()
        assert "kept-subscriptions" not in d.log()
    finally:
        ds.stop()


@contextlib.contextmanager
def through_relay(port: int, config: str, **relay_options):
    """A daemon whose upstream is a relay (tests/support/amqp_relay.py) in front of RabbitMQ on
    `port`; both stopped at the end, the daemon's log clean."""
    from amqp_relay import Relay

    relay = Relay(("127.0.0.1", port), **relay_options)
    d = Daemon(upstream=relay.url(), config=config)
    try:
        yield relay, d
    finally:
        d.stop()
        relay.close()
    assert "Traceback" not in d.log(), d.log()


def test_a_durable_subscription_outlives_an_upstream_reconnect(node, topic):
    """The daemon's upstream connection breaks while the subscriber is detached and messages arrive:
    after the reconnect the subscriber finds them (the daemon held nothing of them)."""
    with through_relay(node.port, node.config, marker=b"\x00no link is dropped\x00") as (relay, d):
        c = connect(d.url, container_id="jms-reconnect-1")
        try:
            detach(c, subscribe(c, topic, "sub", "color = 'red'"))
            publish(node.url, topic, ("r1", "red"), ("b1", "blue"))
            connects = d.log().count("connected (RabbitMQ")
            relay.cut()
            d.wait_for(r"(?s)(?:.*connected \(RabbitMQ){%d}" % (connects + 1), timeout=30)
            publish(node.url, topic, ("r2", "red"))
            sub = subscribe(c, topic, "sub", "color = 'red'")
            assert bodies(sub) == ["r1", "r2"]
            detach(c, sub)
            unsubscribe(c, "sub")
        finally:
            c.close()
    assert _gone_soon(node, queue_of("jms-reconnect-1", "sub"))


def test_a_shared_durable_subscription_outlives_a_daemon_restart(daemons, topic, node):
    """Two subscribers of one shared durable subscription share one queue on the broker; with both
    gone and the daemon restarted, the next subscriber gets what it collected."""
    client = "jms-shared-restart-1"
    d = daemons.start()
    a, b = connect(d.url, container_id=client), connect(d.url, container_id=client)
    sa = shared_subscribe(a, topic, "sub", "color = 'red'")
    sb = shared_subscribe(b, topic, "sub", "color = 'red'")
    publish(d.url, topic, ("r1", "red"), ("r2", "red"), ("b1", "blue"))
    assert sorted(bodies(sa) + bodies(sb)) == ["r1", "r2"]
    detach(a, sa)
    detach(b, sb)
    a.close()
    b.close()
    publish(d.url, topic, ("r3", "red"))
    daemons.stop()
    publish(node.url, topic, ("r4", "red"), ("b2", "blue"))
    d = daemons.start()
    c = connect(d.url, container_id=client)
    try:
        sub = shared_subscribe(c, topic, "sub", "color = 'red'")
        assert bodies(sub) == ["r3", "r4"]
        detach(c, sub)
        unsubscribe(c, "sub")
    finally:
        c.close()
    assert _gone_soon(node, queue_of(client, "sub"))


def test_a_management_api_that_cannot_be_reached_refuses_the_subscribe_saying_where(rabbitmq3, topic):
    port = free_port()  # nothing listens there
    d = Daemon(upstream=rabbitmq3.url, config=f'[upstream]\nmanagement_url = "http://127.0.0.1:{port}"\n')
    try:
        condition = refused_subscribe(d, "jms-unreachable-1", topic)
        assert condition.name == "amqp:link:detach-forced"
        assert f"the management API at http://127.0.0.1:{port} could not be asked" in condition.description
        assert "Connection refused" in condition.description
        assert "durable subscription 'sub'" in condition.description
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_a_subscriber_may_come_back_through_another_daemon(node, topic):
    """Two daemons in front of one broker (replicas, or a client moved to another host): the
    subscription is on the broker, so the subscriber finds it through either."""
    config = node.config
    first, second = Daemon(upstream=node.url, config=config), Daemon(upstream=node.url, config=config)
    try:
        c = connect(first.url, container_id="jms-moved-1")
        try:
            detach(c, subscribe(c, topic, "sub", "color = 'red'"))
        finally:
            c.close()
        publish(first.url, topic, ("r1", "red"), ("b1", "blue"), ("r2", "red"))
        c = connect(second.url, container_id="jms-moved-1")
        try:
            sub = subscribe(c, topic, "sub", "color = 'red'")
            assert bodies(sub) == ["r1", "r2"]
            detach(c, sub)
            unsubscribe(c, "sub")
        finally:
            c.close()
    finally:
        first.stop()
        second.stop()
    for d in (first, second):
        assert "Traceback" not in d.log(), d.log()
    assert _gone_soon(node, queue_of("jms-moved-1", "sub"))


@pytest.mark.rabbitmq4
def test_an_unanswered_management_pair_refuses_the_subscribe_and_the_upstream_is_reconnected(rabbitmq4, topic):
    """RabbitMQ 4 never answers the attach of the daemon's /management pair (a relay drops it): the
    subscribe is refused after `upstream.answer_timeout`, saying what went unanswered; the upstream
    connection is reconnected (as for any unanswered attach), and the next subscribe is served."""
    with through_relay(rabbitmq4.port, "[upstream]\nanswer_timeout = 1.0\n", marker=b"broker-filter-topology-",
                       mode="attach") as (relay, d):
        condition = refused_subscribe(d, "jms-stuck-1", topic)
        assert relay.dropped.is_set()
        assert condition.name == "amqp:link:detach-forced"
        assert ("did not answer PUT /queues/broker-filter.durable.jms-stuck-1.sub within 1 s"
                in condition.description), condition.description
        d.wait_for(r"(?s)reconnecting the upstream connection.*connected \(RabbitMQ", timeout=30)
        c = connect(d.url, container_id="jms-stuck-1")
        try:
            sub = subscribe(c, topic, "sub", "color = 'red'")
            publish(d.url, topic, ("r1", "red"), ("b1", "blue"))
            assert bodies(sub) == ["r1"]
            detach(c, sub)
            unsubscribe(c, "sub")
        finally:
            c.close()
    assert _gone_soon(Node(rabbitmq4), queue_of("jms-stuck-1", "sub"))
