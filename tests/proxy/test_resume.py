"""An upstream reconnect the clients do not see (docs/proxy.md "Failures", proxy/resume.py): a relay
between the daemon and RabbitMQ (3.10 and 4.0) cuts the daemon's connection; a consumer on a queue
and a producer through the daemon stay attached, nothing is lost (what was in flight comes again: at
least once), and an attach made while the broker is unreachable is answered when the daemon is
connected again.  On RabbitMQ 4.0 a subscription to an exchange stays attached too, and gets what
was published while the daemon was cut off; where its queue is gone by then, it is detached with
the reason.  A subscription whose queue RabbitMQ makes (`/topic/K`; on 3.10, every one) is detached
with the reason."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest
from proton import Message
from proton.reactor import Selector
from proton.utils import LinkDetached

from amqp_relay import Relay
from clients import connect, delete_queue, link_name, queue_exists, send_at_least_once
from launcher import Daemon, http_get, metric_value
from rabbitmq_nodes import bound_queues

pytestmark = pytest.mark.rabbitmq

RECONNECTED = "connected ("


def _relayed(url: str, *settings: str):
    port = int(url.rsplit(":", 1)[1])
    relay = Relay(("127.0.0.1", port))
    d = Daemon("--set", "upstream.reconnect.initial_delay=0.05", "--set", "upstream.reconnect.max_delay=0.5",
               "--set", "upstream.answer_timeout=20", "--set", "metrics.listen=127.0.0.1:0", *settings,
               upstream=relay.url())
    d.relay = relay
    d.broker_url = url
    yield d
    d.stop()
    relay.close()
    assert "Traceback" not in d.log(), d.log()


@pytest.fixture
def relayed(rabbitmq):
    yield from _relayed(rabbitmq)


@pytest.fixture
def relayed4(rabbitmq4):
    """A daemon in front of RabbitMQ 4.0 through a relay."""
    yield from _relayed(rabbitmq4.url)


@pytest.fixture
def relayed4_expiring(rabbitmq4):
    """... whose subscription queues expire one second after the daemon's connection went."""
    yield from _relayed(rabbitmq4.url, "--set", "upstream.subscription_expiry=1")


def connected_times(d: Daemon) -> int:
    return d.log().count(RECONNECTED)


def wait_reconnected(d: Daemon, before: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while connected_times(d) <= before:
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.05)


def publish_direct(url: str, address: str, numbers) -> None:
    c = connect(url)
    try:
        s = c.create_sender(address)
        for n in numbers:
            s.send(Message(body=n, properties={"n": n}))
    finally:
        c.close()


def receive_all(rcv, wanted: set, timeout: float = 40) -> list:
    """Bodies received (accepted) until every one of `wanted` came; duplicates are kept."""
    got = []
    deadline = time.monotonic() + timeout
    while not wanted <= set(got):
        left = deadline - time.monotonic()
        assert left > 0, f"missing {sorted(wanted - set(got))}"
        m = rcv.receive(timeout=left)
        got.append(m.body)
        rcv.accept()
    return got


def test_a_queue_consumer_stays_attached_across_a_cut_and_loses_nothing(relayed):
    q = f"/queue/resume-{uuid.uuid4().hex[:8]}"
    c = connect(relayed.url)
    try:
        rcv = c.create_receiver(q, name=link_name(), credit=20, options=Selector("n >= 0"))
        publish_direct(relayed.broker_url, q, range(5))
        first = receive_all(rcv, set(range(5)))
        before = connected_times(relayed)
        relayed.relay.cut()
        wait_reconnected(relayed, before)
        publish_direct(relayed.broker_url, q, range(5, 15))
        after = receive_all(rcv, set(range(5, 15)))  # (raises LinkDetached if the link were detached)
        assert set(first + after) == set(range(15))
        assert rcv.link.state & rcv.link.REMOTE_ACTIVE
    finally:
        c.close()
    assert "link(s) resumed" in relayed.log()


def test_a_producer_stays_attached_across_a_cut(relayed):
    q = f"/queue/resume-{uuid.uuid4().hex[:8]}"
    c = connect(relayed.url)
    try:
        snd = c.create_sender(q, name=link_name())
        sent = 0
        before = connected_times(relayed)
        for n in range(20):
            if n == 10:
                relayed.relay.cut()
            send_at_least_once(snd, Message(body=n, properties={"n": n}))  # (again if released)
            sent += 1
        wait_reconnected(relayed, before)
        rcv = c.create_receiver(q, name=link_name(), credit=40)
        got = receive_all(rcv, set(range(20)))
        assert set(got) == set(range(20)) and sent == 20
        assert snd.link.state & snd.link.REMOTE_ACTIVE  # never detached
    finally:
        c.close()


def test_an_attach_while_the_broker_is_unreachable_waits_for_it(relayed):
    q = f"/queue/resume-{uuid.uuid4().hex[:8]}"
    publish_direct(relayed.broker_url, q, [1])
    c = connect(relayed.url)
    result: dict = {}
    try:
        relayed.relay.paused = True
        relayed.relay.cut()
        relayed.wait_for(r"connection lost", 20)

        def attach() -> None:
            try:
                result["receiver"] = c.create_receiver(q, name="waits", credit=5)
            except Exception as e:  # noqa: BLE001 - reported below
                result["error"] = e

        waiter = threading.Thread(target=attach)
        waiter.start()
        relayed.wait_for(re.escape("attach of link 'waits' waits for upstream"), 20)
        relayed.relay.paused = False
        waiter.join(30)
        assert "error" not in result, result.get("error")
        rcv = result["receiver"]
        assert rcv.receive(timeout=20).body == 1
    finally:
        relayed.relay.paused = False
        c.close()


# ----------------------------------------------------------------------------- subscriptions
SUSPENDED = r"wait for it on their queue (broker-filter\.subscription\.[0-9a-f]+)"


def detached_by_reconnect(d: Daemon) -> float:
    status, text = http_get(d.metrics_url() + "/metrics")
    assert status == 200, text
    return metric_value(text, "broker_filter_links_detached_by_reconnect_total")


def publish_colours(url: str, address: str, numbers, colour: str) -> None:
    c = connect(url)
    try:
        s = c.create_sender(address)
        for n in numbers:
            s.send(Message(body=n, properties={"n": n, "colour": colour}))
    finally:
        c.close()


def cut_off(d: Daemon) -> str:
    """Cut the daemon's upstream connection and keep the broker unreachable (the relay refuses new
    connections until `d.relay.paused` is cleared); the name of the subscription queue whose link
    waits for the upstream."""
    d.relay.paused = True
    d.relay.cut()
    return d.wait_for(SUSPENDED, 20)



def wait_queue_gone(url: str, queue: str, timeout: float = 20) -> None:
    """Until `queue` is no longer on the broker (bounded: `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while queue_exists(url, queue):
        assert time.monotonic() < deadline, f"queue {queue} left on the broker"
        time.sleep(0.1)

@pytest.mark.rabbitmq4
def test_a_subscription_stays_attached_across_a_cut_and_gets_what_was_published_meanwhile(relayed4):
    key = f"resume.{uuid.uuid4().hex[:8]}"
    address = f"/exchanges/amq.topic/{key}"
    c = connect(relayed4.url)
    try:
        rcv = c.create_receiver(address, name=link_name(), credit=50, options=Selector("colour = 'red'"))
        publish_colours(relayed4.broker_url, address, range(0, 5), "red")
        publish_colours(relayed4.broker_url, address, range(100, 105), "blue")
        assert sorted(receive_all(rcv, set(range(5)))) == list(range(5))
        publish_colours(relayed4.broker_url, address, [5], "red")
        unsettled = rcv.receive(timeout=20)  # taken, not settled when the connection goes
        assert unsettled.body == 5
        before = connected_times(relayed4)
        queue = cut_off(relayed4)
        assert queue_exists(relayed4.broker_url, queue)  # it outlives the daemon's connection
        # published while the daemon is cut off: the queue collects them
        publish_colours(relayed4.broker_url, address, range(6, 16), "red")
        publish_colours(relayed4.broker_url, address, range(106, 116), "blue")
        relayed4.relay.paused = False
        wait_reconnected(relayed4, before)
        relayed4.wait_for(re.escape(f"resumed on their queue {queue}"), 20)
        rcv.accept()  # (the delivery of 5 from before the cut: the daemon no longer holds it)
        got = receive_all(rcv, set(range(5, 16)))  # (raises LinkDetached if the link were detached)
        # 5 came again (at least once; so may one whose accept had not reached the broker), no blue one
        assert set(range(5, 16)) <= set(got) <= set(range(16)), got
        assert rcv.link.state & rcv.link.REMOTE_ACTIVE
        publish_colours(relayed4.broker_url, address, [16], "red")  # and it carries on
        assert receive_all(rcv, {16}) == [16]
        assert detached_by_reconnect(relayed4) == 0
        rcv.close()
        wait_queue_gone(relayed4.broker_url, queue)  # the subscription ended: its queue goes
    finally:
        relayed4.relay.paused = False
        c.close()


@pytest.mark.rabbitmq4
@pytest.mark.parametrize("gone", ["deleted", "expired"])
def test_a_subscription_whose_queue_went_meanwhile_is_detached_with_the_reason(gone, request, rabbitmq4):
    d = request.getfixturevalue("relayed4" if gone == "deleted" else "relayed4_expiring")
    key = f"resume.{uuid.uuid4().hex[:8]}"
    address = f"/exchanges/amq.topic/{key}"
    c = connect(d.url)
    try:
        rcv = c.create_receiver(address, name=link_name(), credit=50, options=Selector("colour = 'red'"))
        publish_colours(d.broker_url, address, range(3), "red")
        receive_all(rcv, set(range(3)))
        before = connected_times(d)
        detached = detached_by_reconnect(d)
        queue = cut_off(d)
        if gone == "deleted":  # (as if the broker had restarted)
            delete_queue(d.broker_url, queue)
        else:  # its x-expires (upstream.subscription_expiry = 1 s) is over
            # (looked for with rabbitmqctl: a GET on /management would count as a use, and delay it)
            deadline = time.monotonic() + 30
            while queue in rabbitmq4.ctl("list_queues", "name", "--no-table-headers").stdout.split():
                assert time.monotonic() < deadline, f"queue {queue} did not expire"
                time.sleep(0.2)
        d.relay.paused = False
        wait_reconnected(d, before)
        with pytest.raises(LinkDetached):
            rcv.receive(timeout=30)
        condition = rcv.link.remote_condition
        assert condition.name == "amqp:connection:forced"
        assert f"its queue {queue}" in condition.description and "was gone" in condition.description
        assert "routed to it meanwhile is lost" in condition.description, condition.description
        assert detached_by_reconnect(d) == detached + 1
    finally:
        d.relay.paused = False
        c.close()


@pytest.mark.rabbitmq4
def test_a_subscription_that_ends_while_the_daemon_is_cut_off_has_its_queue_deleted(relayed4):
    key = f"resume.{uuid.uuid4().hex[:8]}"
    c = connect(relayed4.url)
    try:
        rcv = c.create_receiver(f"/exchanges/amq.topic/{key}", name=link_name(), credit=10)
        before = connected_times(relayed4)
        queue = cut_off(relayed4)
        rcv.close()  # (the daemon cannot delete its queue now)
        assert queue_exists(relayed4.broker_url, queue)
        relayed4.relay.paused = False
        wait_reconnected(relayed4, before)
        wait_queue_gone(relayed4.broker_url, queue)  # deleted once the daemon is back
    finally:
        relayed4.relay.paused = False
        c.close()


@pytest.mark.rabbitmq4
def test_the_daemon_deletes_its_subscription_queues_when_it_stops(relayed4, rabbitmq4):
    key = f"stop.{uuid.uuid4().hex[:8]}"
    c = connect(relayed4.url)
    try:
        for _ in range(2):
            c.create_receiver(f"/exchanges/amq.topic/{key}", name=link_name(), credit=10)
        queues = bound_queues(rabbitmq4, "amq.topic", key)
        assert len(queues) == 2 and all(q.startswith("broker-filter.subscription.") for q in queues), queues
        assert relayed4.stop() == 0
        assert "2 subscription queue(s) deleted" in relayed4.log()
        assert not any(queue_exists(relayed4.broker_url, q) for q in queues)
    finally:
        c.close()


@pytest.mark.rabbitmq4
def test_a_pass_through_tenants_subscription_queues_are_deleted_when_the_daemon_stops(rabbitmq4):
    """With pass-through logins each identity is served by an upstream connection of its own: the
    queues its subscriptions' feeds declared are deleted when the daemon stops, as the default's."""
    key = f"tenant.{uuid.uuid4().hex[:8]}"
    d = Daemon("--set", "upstream.credentials=pass-through", "--set", "listener.allow_anonymous=false",
               upstream=rabbitmq4.url)
    c = connect(d.url.replace("amqp://", "amqp://guest:guest@"))
    try:
        c.create_receiver(f"/topic/{key}", name=link_name(), credit=10)
        c.create_receiver(f"/exchanges/amq.topic/{key}", name=link_name(), credit=10)
        queues = bound_queues(rabbitmq4, "amq.topic", key)
        assert len(queues) == 2 and all(q.startswith("broker-filter.subscription.") for q in queues), queues
        assert d.stop() == 0
        assert "2 subscription queue(s) deleted" in d.log(), d.log()
        assert bound_queues(rabbitmq4, "amq.topic", key) == []
    finally:
        c.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


@pytest.fixture
def relayed3(rabbitmq3):
    """A daemon in front of RabbitMQ 3.10 through a relay, not given its HTTP API."""
    yield from _relayed(rabbitmq3.url)


@pytest.fixture(params=[pytest.param("rabbitmq4", marks=pytest.mark.rabbitmq4), "rabbitmq3-management"])
def declaring(request):
    """A daemon through a relay in front of a RabbitMQ it can declare queues on: RabbitMQ 4.0 (its
    `/management` node), RabbitMQ 3.10 given its HTTP API (`upstream.management_url`); `.node` the node."""
    if request.param == "rabbitmq4":
        node = request.getfixturevalue("rabbitmq4")
        gen = _relayed(node.url)
    else:
        node = request.getfixturevalue("management_node")
        gen = _relayed(node.url, "--set", f"upstream.management_url={node.management_url}")
    d = next(gen)
    d.node = node
    yield d
    next(gen, None)


def wait_unbound(node, exchange: str, key: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while bound_queues(node, exchange, key):
        assert time.monotonic() < deadline, f"a queue is left bound to {exchange} with {key}"
        time.sleep(0.1)


@pytest.mark.parametrize("form", ["/topic/{key}", "/exchange/amq.topic/{key}"])
def test_a_shared_topic_subscription_stays_attached_across_a_cut_on_its_queue(declaring, form):
    """Two subscribers of one topic share one upstream subscription, a queue the daemon declared; the
    upstream connection goes and stays away while messages are published: both stay attached and get
    every one they select that was published meanwhile (and the unsettled one again: at least once),
    from the same one queue; when they are gone, so is the queue."""
    d, node = declaring, declaring.node
    key = f"resume.{uuid.uuid4().hex[:8]}"
    address = form.format(key=key)
    c = connect(d.url)
    try:
        red = c.create_receiver(address, name=link_name(), credit=50, options=Selector("colour = 'red'"))
        blue = c.create_receiver(address, name=link_name(), credit=50, options=Selector("colour = 'blue'"))
        publish_colours(node.url, address, range(0, 3), "red")
        publish_colours(node.url, address, range(100, 103), "blue")
        assert sorted(receive_all(red, set(range(3)))) == [0, 1, 2]
        assert sorted(receive_all(blue, set(range(100, 103)))) == [100, 101, 102]
        [queue] = bound_queues(node, "amq.topic", key)  # one upstream subscription for both links
        assert queue.startswith("broker-filter.subscription.")
        publish_colours(node.url, address, [3], "red")
        assert red.receive(timeout=20).body == 3  # taken, not settled when the connection goes
        before, detached = connected_times(d), detached_by_reconnect(d)
        assert cut_off(d) == queue
        publish_colours(node.url, address, range(4, 10), "red")  # while the daemon is cut off
        publish_colours(node.url, address, range(103, 110), "blue")
        assert bound_queues(node, "amq.topic", key) == [queue]  # it outlives the daemon's connection
        d.relay.paused = False
        wait_reconnected(d, before)
        d.wait_for(re.escape(f"2 subscription link(s) of {address} resumed on their queue {queue}"), 20)
        red.accept()  # (3, from before the cut: the daemon no longer holds it)
        got_red = receive_all(red, set(range(3, 10)))  # (LinkDetached if the link were detached)
        got_blue = receive_all(blue, set(range(103, 110)))
        assert set(got_red) <= set(range(10)) and set(got_blue) <= set(range(100, 110)), (got_red, got_blue)
        assert bound_queues(node, "amq.topic", key) == [queue]  # still one, the same
        publish_colours(node.url, address, [10], "red")  # and they carry on
        assert receive_all(red, {10}) == [10]
        assert detached_by_reconnect(d) == detached
        red.close()
        blue.close()
        wait_unbound(node, "amq.topic", key)  # the subscription ended: its queue goes
    finally:
        d.relay.paused = False
        c.close()


def test_subscribers_that_attach_together_share_one_queue(declaring):
    """Eight subscribers of one new topic attach at once, on connections of their own: the ones that
    come while the first one's queue is being declared wait for it and join its feed (one queue
    bound, one consumer), and every one gets what is published after its attach."""
    d, node = declaring, declaring.node
    key = f"together.{uuid.uuid4().hex[:8]}"
    address = f"/topic/{key}"
    conns = [connect(d.url) for _ in range(8)]
    gate = threading.Barrier(len(conns))
    rcvs: list = [None] * len(conns)

    def attach(i: int) -> None:
        gate.wait(10)
        rcvs[i] = conns[i].create_receiver(address, name=link_name(), credit=10, options=Selector(f"n >= {i}"))

    try:
        threads = [threading.Thread(target=attach, args=(i,)) for i in range(len(conns))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert all(r is not None for r in rcvs), rcvs
        assert len(bound_queues(node, "amq.topic", key)) == 1
        publish_colours(node.url, address, range(8), "red")
        for i, r in enumerate(rcvs):
            assert sorted(receive_all(r, set(range(i, 8)))) == list(range(i, 8))
    finally:
        for c in conns:
            c.close()
    wait_unbound(node, "amq.topic", key)


def test_a_subscription_whose_queue_rabbitmq_makes_is_detached_by_a_cut(relayed3, rabbitmq3):
    """In front of RabbitMQ 3.10 not given its HTTP API, `/topic/K` is a queue RabbitMQ's AMQP 1.0
    plugin makes and names (`amq.gen-`), a name its attach never tells: what was routed to it while
    the daemon was away is out of reach, so the link is detached with the reason."""
    key = f"resume.{uuid.uuid4().hex[:8]}"
    c = connect(relayed3.url)
    try:
        rcv = c.create_receiver(f"/topic/{key}", name=link_name(), credit=10, options=Selector("colour = 'red'"))
        publish_colours(rabbitmq3.url, f"/topic/{key}", range(3), "red")
        receive_all(rcv, set(range(3)))
        detached = detached_by_reconnect(relayed3)
        relayed3.relay.cut()
        with pytest.raises(LinkDetached):
            rcv.receive(timeout=30)
        condition = rcv.link.remote_condition
        assert condition.name == "amqp:connection:forced"
        assert "cannot be consumed again" in condition.description, condition.description
        assert "upstream.management_url" in condition.description  # (what would have it resumed)
        assert detached_by_reconnect(relayed3) == detached + 1
    finally:
        c.close()
