"""Queue selectors with broker semantics, outcomes, limits and dead letters (hand-written filters)."""

import random

import pytest

from broker_filter.broker import Broker, BrokerConfig, BrokerError, Limits

from brokerkit import FnFilter, assigned_bodies, dispatch_all, prop_equals, publish


def test_selective_consumer_gets_oldest_match_and_leaves_the_rest(broker):
    red = broker.subscribe("q", filter=prop_equals("color", "red"))
    broker.flow(red, 10)
    for i, color in enumerate(["blue", "red", "green", "red"]):
        publish(broker, "q", i, color=color)
    assert assigned_bodies(dispatch_all(broker), red) == [1, 3]
    plain = broker.subscribe("q")
    broker.flow(plain, 10)
    assert assigned_bodies(dispatch_all(broker), plain) == [0, 2]  # non-matching stayed, in order


def test_match_deep_in_the_queue_without_window(broker):
    for i in range(5000):
        publish(broker, "deep", i, n=i)
    f = prop_equals("n", 4321)
    c = broker.subscribe("deep", filter=f)
    broker.flow(c, 1)
    got = dispatch_all(broker, budget=1000)  # resumes across budget-limited dispatch calls
    assert assigned_bodies(got) == [4321]
    assert f.calls == 4322  # each message looked at once, stopping at the match


def test_each_message_is_evaluated_once_per_consumer_as_the_queue_grows(broker):
    f = prop_equals("k", "never")
    c = broker.subscribe("q", filter=f)
    broker.flow(c, 1)
    for i in range(300):
        publish(broker, "q", i, k="x")
        dispatch_all(broker)
    assert f.calls == 300


def test_competing_selective_consumers_each_get_their_oldest(broker):
    a = broker.subscribe("q", filter=prop_equals("g", "a"))
    b = broker.subscribe("q", filter=prop_equals("g", "b"))
    any_ = broker.subscribe("q")
    for i, g in enumerate("abababab"):
        publish(broker, "q", i, g=g)
    broker.flow(a, 2)
    broker.flow(b, 2)
    got = dispatch_all(broker)
    assert assigned_bodies(got, a) == [0, 2] and assigned_bodies(got, b) == [1, 3]
    broker.flow(any_, 10)
    assert assigned_bodies(dispatch_all(broker), any_) == [4, 5, 6, 7]


def test_released_goes_back_in_place(broker):
    c = broker.subscribe("q")
    for i in range(3):
        publish(broker, "q", i)
    broker.flow(c, 2)
    (c1, e0), (_, e1) = dispatch_all(broker)
    broker.settle(c, e0, "released")
    broker.flow(c, 3)
    got = dispatch_all(broker)
    assert assigned_bodies(got) == [0, 2]
    assert got[0][1].delivery_count == 0  # released is not a failed attempt


def test_release_to_a_selective_consumer_whose_cursor_passed(broker):
    plain = broker.subscribe("q")
    publish(broker, "q", "early", color="red")
    broker.flow(plain, 1)
    [(_, held)] = dispatch_all(broker)
    red = broker.subscribe("q", filter=prop_equals("color", "red"))
    publish(broker, "q", "late", color="red")
    broker.flow(red, 1)
    assert assigned_bodies(dispatch_all(broker)) == ["late"]  # "early" is out to plain
    broker.settle(plain, held, "released")
    broker.flow(red, 1)
    assert assigned_bodies(dispatch_all(broker)) == ["early"]


def test_modified_undeliverable_here_never_returns_to_that_link(broker):
    a = broker.subscribe("q")
    publish(broker, "q", "m")
    broker.flow(a, 5)
    [(_, e)] = dispatch_all(broker)
    broker.settle(a, e, "modified", delivery_failed=True, undeliverable_here=True)
    assert dispatch_all(broker) == []
    b = broker.subscribe("q")
    broker.flow(b, 5)
    [(who, again)] = dispatch_all(broker)
    assert who is b and again.delivery_count == 1


def test_modified_without_flags_redelivers_to_same_link(broker):
    a = broker.subscribe("q")
    publish(broker, "q", "m")
    broker.flow(a, 5)
    [(_, e)] = dispatch_all(broker)
    broker.settle(a, e, "modified")
    assert assigned_bodies(dispatch_all(broker), a) == ["m"]


def test_accepted_removes_and_rejected_drops(broker):
    c = broker.subscribe("q")
    publish(broker, "q", 1)
    publish(broker, "q", 2)
    broker.flow(c, 5)
    (_, e1), (_, e2) = dispatch_all(broker)
    broker.settle(c, e1, "accepted")
    broker.settle(c, e2, "rejected")
    assert len(broker.queues["q"]) == 0 and broker.addresses["q"].messages == 0
    broker.close_consumer(c)
    assert len(broker.queues["q"]) == 0


def test_rejected_goes_to_dead_letter_address():
    broker = Broker(BrokerConfig(dead_letter_address="DLQ"))
    c = broker.subscribe("q")
    publish(broker, "q", "bad")
    broker.flow(c, 1)
    [(_, e)] = dispatch_all(broker)
    broker.settle(c, e, "rejected")
    dlq = broker.subscribe("DLQ")
    broker.flow(dlq, 1)
    assert assigned_bodies(dispatch_all(broker)) == ["bad"] and broker.dead_lettered == 1


def test_detach_returns_unsettled_messages_in_order(broker):
    a = broker.subscribe("q")
    for i in range(4):
        publish(broker, "q", i)
    broker.flow(a, 2)
    dispatch_all(broker)
    broker.close_consumer(a)
    b = broker.subscribe("q")
    broker.flow(b, 10)
    got = dispatch_all(broker)
    assert assigned_bodies(got) == [0, 1, 2, 3]
    assert [e.delivery_count for _, e in got] == [1, 1, 0, 0]


def test_settling_twice_or_after_detach_is_harmless(broker):
    a = broker.subscribe("q")
    publish(broker, "q", 1)
    broker.flow(a, 1)
    [(_, e)] = dispatch_all(broker)
    broker.close_consumer(a)
    broker.settle(a, e, "accepted")  # the message went back at detach: must not vanish
    b = broker.subscribe("q")
    broker.flow(b, 1)
    [(_, e2)] = dispatch_all(broker)
    broker.settle(b, e2, "accepted")
    broker.settle(b, e2, "accepted")
    assert len(broker.queues["q"]) == 0


def test_limit_by_messages_refuses_with_resource_limit_exceeded():
    broker = Broker(BrokerConfig(limits=Limits(max_messages=3)))
    for i in range(3):
        publish(broker, "q", i)
    with pytest.raises(BrokerError) as e:
        publish(broker, "q", 3)
    assert e.value.condition == "amqp:resource-limit-exceeded" and "3 of 3" in e.value.description
    c = broker.subscribe("q")
    broker.flow(c, 1)
    [(_, entry)] = dispatch_all(broker)
    broker.settle(c, entry, "accepted")
    assert publish(broker, "q", 4) == 1  # room again


def test_limit_by_bytes_and_per_address_override():
    broker = Broker(BrokerConfig(limits=Limits(max_bytes=10), address_limits={"big": Limits()}))
    broker.publish("q", b"12345678")
    with pytest.raises(BrokerError):
        broker.publish("q", b"123")
    for _ in range(10):
        broker.publish("big", b"12345678")
    assert broker.addresses["q"].bytes == 8 and broker.addresses["big"].bytes == 80


def test_multicast_limit_counts_each_message_once():
    broker = Broker(BrokerConfig(limits=Limits(max_messages=2)))
    subs = [broker.subscribe("t", capabilities=["topic"]) for _ in range(3)]
    publish(broker, "t", 1, capabilities=["topic"])
    publish(broker, "t", 2, capabilities=["topic"])
    with pytest.raises(BrokerError):
        publish(broker, "t", 3, capabilities=["topic"])
    for s in subs:
        broker.flow(s, 5)
    got = dispatch_all(broker)
    for c, e in got:
        if e.message.body == 1:
            broker.settle(c, e, "accepted")
    assert broker.addresses["t"].messages == 1  # freed only when every subscriber accepted


def test_topic_subscription_filter_applies_at_routing(broker):
    f = prop_equals("k", 1)
    s = broker.subscribe("t", capabilities=["topic"], filter=f)
    publish(broker, "t", "no", capabilities=["topic"], k=2)
    publish(broker, "t", "yes", capabilities=["topic"], k=1)
    assert len(s.queue) == 1
    broker.flow(s, 5)
    assert assigned_bodies(dispatch_all(broker)) == ["yes"]


def test_no_local_receives_receiver_identity(broker):
    seen = []

    def no_local(m, receiver):
        seen.append(receiver)
        return m.body != receiver

    s = broker.subscribe("t", capabilities=["topic"], filter=FnFilter(no_local), receiver="me")
    publish(broker, "t", "me", capabilities=["topic"])
    publish(broker, "t", "you", capabilities=["topic"])
    broker.flow(s, 5)
    assert assigned_bodies(dispatch_all(broker)) == ["you"] and set(seen) == {"me"}


def test_broken_filter_never_breaks_the_queue(broker):
    def boom(m, r):
        raise RuntimeError("bug")

    bad = broker.subscribe("q", filter=FnFilter(boom))
    good = broker.subscribe("q")
    publish(broker, "q", 1)
    broker.flow(bad, 5)
    broker.flow(good, 5)
    assert assigned_bodies(dispatch_all(broker), good) == [1]


def test_random_operations_lose_nothing_and_keep_oldest_first():
    """Model check: whatever happens, every published message is accepted exactly once, and each
    delivery is the oldest available message the consumer's filter takes."""
    rng = random.Random(1)
    broker = Broker(BrokerConfig())
    filters = [None, prop_equals("k", 0), prop_equals("k", 1), FnFilter(lambda m, r: m.body % 3 == 0)]
    consumers = []
    published, accepted, held = [], [], {}
    for step in range(3000):
        op = rng.random()
        if op < 0.35:
            n = len(published)
            publish(broker, "q", n, k=n % 2)
            published.append(n)
        elif op < 0.42 or not consumers:
            consumers.append(broker.subscribe("q", filter=rng.choice(filters)))
        elif op < 0.45 and len(consumers) > 1:
            c = consumers.pop(rng.randrange(len(consumers)))
            broker.close_consumer(c)
            for key in [k for k in held if k[0] is c]:
                del held[key]
        elif op < 0.65:
            broker.flow(rng.choice(consumers), rng.randint(0, 3))
        elif held:
            key = rng.choice(list(held))
            c, e = held.pop(key)
            outcome = rng.choice(["accepted", "accepted", "released", "modified"])
            broker.settle(c, e, outcome, undeliverable_here=rng.random() < 0.3)
            if outcome == "accepted":
                accepted.append(e.message.body)
        queue = broker.queues.get("q")
        available_before = None
        if queue is not None:
            available_before = {e.seq: e for e in queue.entries() if e.holder is None}
        got, _ = broker.dispatch(rng.choice([1, 5, 1000]))
        for c, e in got:
            # oldest-first: nothing older and still available was acceptable to c
            for seq, other in available_before.items():
                if seq < e.seq and (other.excluded is None or c.id not in other.excluded):
                    if c.filter is None or c.filter.evaluate(other.message) is True:
                        assert other.holder is not None, (step, seq, e.seq)
            held[(c, e.seq)] = (c, e)
    # drain everything with a plain consumer
    for c in consumers:
        broker.close_consumer(c)
    for key in list(held):
        del held[key]
    final = broker.subscribe("q")
    broker.flow(final, 10**6)
    for c, e in dispatch_all(broker):
        broker.settle(c, e, "accepted")
        accepted.append(e.message.body)
    assert sorted(accepted) == published
    assert broker.addresses["q"].messages == 0 and broker.addresses["q"].bytes == 0


def test_a_long_scan_does_not_hold_up_other_consumers(broker):
    for i in range(3000):
        publish(broker, "q", i, k="x")
    scanner = broker.subscribe("q", filter=prop_equals("k", "never"))
    plain = broker.subscribe("q")
    broker.flow(scanner, 1)
    broker.flow(plain, 1)
    got, more = broker.dispatch(budget=500)
    assert more and got == []  # the scanner used this turn's budget ...
    got, more = broker.dispatch(budget=500)
    assert [(c, e.message.body) for c, e in got] == [(plain, 0)]  # ... the next turn serves the other first


def test_repeated_releases_queue_a_recheck_once(broker):
    idle = broker.subscribe("q")
    busy = broker.subscribe("q")
    publish(broker, "q", "m")
    broker.flow(idle, 1)
    dispatch_all(broker)  # idle's cursor passes the message
    broker.settle(idle, next(iter(idle.outstanding.values())), "released")
    broker.flow(idle, 0)
    for _ in range(100):
        broker.flow(busy, 1)
        [(c, e)] = dispatch_all(broker)
        broker.settle(c, e, "released")
    assert len(idle.recheck) <= 1
