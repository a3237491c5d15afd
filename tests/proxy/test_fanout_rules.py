"""The sans-I/O rules of a shared upstream subscription (broker_filter.proxy.fanout) driven directly:
one decode and one index match per message, exact sets per member, settlement once every member
is done, a client's release kept to its own copy, and a slow member leaving the group for a
subscription of its own without losing or (in the normal path) repeating a message."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from broker_filter.amqp import encode_message
from broker_filter.amqp.message import Message
from broker_filter.filters import compile_selector
from broker_filter.proxy.fanout import FanoutFeed
from broker_filter.proxy.forwarding import ACCEPTED, Outcome, Outlet
from broker_filter.proxy.upstream import UpstreamDelivery


class OwnConsumer:
    def __init__(self, outlet, handler):
        self.outlet = outlet
        self.handler = handler
        self.flowed = 0
        self.settled = []
        self.closed = False

    def flow(self, n):
        self.flowed += n

    def settle(self, delivery, outcome):
        self.settled.append((delivery, outcome))

    def close(self, closed=None):
        self.closed = True


class Recorder:
    def __init__(self):
        self.sent = []  # (outlet name, delivery, data)
        self.settled = []  # (delivery, outcome)
        self.flowed = 0
        self.own = []
        self.lost = []
        self._tag = 0

    def send(self, outlet, delivery, data):
        self._tag += 1
        self.sent.append((outlet.name, delivery, data))
        return self._tag

    def settle_upstream(self, delivery, outcome):
        self.settled.append((delivery, outcome))

    def flow_upstream(self, n):
        self.flowed += n

    def open_own(self, outlet, handler):
        c = OwnConsumer(outlet, handler)
        self.own.append(c)
        return c

    def lost_outlet(self, outlet, condition, description):
        self.lost.append((outlet.name, condition))

    def got(self, name):
        return [d for n, d, _ in self.sent if n == name]

    def tags(self, name):
        return [i + 1 for i, (n, _, _) in enumerate(self.sent) if n == name]


def msg(i: int, **props) -> UpstreamDelivery:
    return UpstreamDelivery(encode_message(Message(application_properties={"i": i, **props}, body=f"m{i}")))


def outlet(name: str, selector: str | None, credit_feed=None) -> Outlet:
    return Outlet(name, compile_selector(selector) if selector else compile_selector("TRUE"), receiver=f"c/{name}")


def test_the_group_pulls_the_window_plus_the_smallest_credit_a_member_gave():
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10, max_credit=500)
    a, b = outlet("a", None), outlet("b", None)
    feed.add_outlet(a)
    feed.set_credit(a, 1000)
    assert io.flowed == 10 + 500  # a's credit, at most max_credit
    feed.add_outlet(b)  # joins without credit: nothing more is pulled for it
    feed.set_credit(b, 20)
    assert io.flowed == 510
    ds = [msg(i) for i in range(510)]
    for d in ds:
        feed.on_upstream_delivery(d)
    # b, selected by every message, got its 20 and queued the rest: more than `buffer` behind, it
    # leaves the group for a subscription of its own (and stays in the group until its marker)
    assert len(io.own) == 1 and len(io.got("a")) == 510 and len(io.got("b")) == 20
    # meanwhile the group kept at most the window plus b's 20 outstanding
    assert 0 < io.flowed - len(ds) <= 10 + 20


def test_each_member_gets_exactly_what_it_selects_and_non_matches_are_consumed():
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10)
    a, b, c = outlet("a", "customer = 'c1'"), outlet("b", "customer IN ('c1', 'c2')"), outlet("c", "customer LIKE 'c3%'")
    for o in (a, b, c):
        feed.add_outlet(o)
        feed.set_credit(o, 100)
    assert io.flowed == 10 + 100  # the window plus the smallest credit a member gave
    ds = [msg(i, customer=f"c{i % 4}") for i in range(8)]
    for d in ds:
        feed.on_upstream_delivery(d)
    assert io.got("a") == [ds[1], ds[5]]
    assert io.got("b") == [ds[1], ds[2], ds[5], ds[6]]
    assert io.got("c") == [ds[3], ds[7]]
    assert [d for d, o in io.settled] == [ds[0], ds[4]] and feed.stats.filtered == 2
    # each message matched once against the index, whatever the number of members
    assert feed.index.messages == 8 and feed.fanout.messages == 8
    # settled upstream once every member that got it is done
    for tag in io.tags("a"):
        feed.on_client_outcome(a, tag, ACCEPTED)
    assert ds[1] not in [d for d, _ in io.settled]
    for tag in io.tags("b"):
        feed.on_client_outcome(b, tag, ACCEPTED)
    assert [d for d, _ in io.settled].count(ds[1]) == 1
    assert ds[2] in [d for d, _ in io.settled]


def test_all_presettled_members_settle_at_once():
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10)
    a, b = outlet("a", "k = 1"), outlet("b", "k = 1")
    for o in (a, b):
        o.presettled = True
        feed.add_outlet(o)
        feed.set_credit(o, 5)
    d = msg(1, k=1)
    feed.on_upstream_delivery(d)
    assert io.settled == [(d, ACCEPTED)]
    assert a.in_flight == {} and b.in_flight == {}


def test_release_goes_back_to_the_same_member_only_and_rejects_reject_upstream_when_all_reject():
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10)
    a, b = outlet("a", "k = 1"), outlet("b", "k = 1")
    for o in (a, b):
        feed.add_outlet(o)
        feed.set_credit(o, 1)
    d = msg(1, k=1)
    feed.on_upstream_delivery(d)
    (ta,), (tb,) = io.tags("a"), io.tags("b")
    feed.on_client_outcome(a, ta, Outcome("released"))
    assert io.got("a") == [d]  # no credit left: waits in a's queue
    feed.set_credit(a, 1)
    assert io.got("a") == [d, d] and io.got("b") == [d]
    assert io.sent[-1][2] != d.data  # sent again as a redelivery (first-acquirer false)
    feed.on_client_outcome(a, io.tags("a")[-1], Outcome("rejected", error=("amqp:x", "no")))
    assert io.settled == []
    feed.on_client_outcome(b, tb, Outcome("rejected", error=("amqp:y", "no")))
    assert io.settled == [(d, Outcome("rejected", error=("amqp:x", "no")))]
    # one accept among rejects: accepted upstream
    d2 = msg(2, k=1)
    feed.set_credit(a, 1)
    feed.set_credit(b, 1)
    feed.on_upstream_delivery(d2)
    feed.on_client_outcome(a, io.tags("a")[-1], Outcome("rejected"))
    feed.on_client_outcome(b, io.tags("b")[-1], ACCEPTED)
    assert io.settled[-1] == (d2, ACCEPTED)


def test_a_member_that_leaves_is_done_with_its_copies_and_the_last_one_ends_nothing_else():
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10)
    a, b = outlet("a", "k = 1"), outlet("b", "k = 1")
    for o in (a, b):
        feed.add_outlet(o)
    feed.set_credit(b, 5)
    d = msg(1, k=1)
    feed.on_upstream_delivery(d)  # a: queued (no credit); b: sent
    feed.remove_outlet(a)
    assert io.settled == []
    feed.on_client_outcome(b, io.tags("b")[0], ACCEPTED)
    assert io.settled == [(d, ACCEPTED)]
    assert len(feed.index) == 1


def test_no_credit_anywhere_pulls_nothing():
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10)
    feed.add_outlet(outlet("a", "k = 1"))
    assert io.flowed == 0


def test_a_slow_member_leaves_for_its_own_subscription_and_gets_everything_in_order():
    io = Recorder()
    feed = FanoutFeed(io, window=4, buffer=3)
    slow, fast = outlet("slow", "k = 1"), outlet("fast", "k = 1")
    feed.add_outlet(slow)
    feed.add_outlet(fast)
    feed.set_credit(fast, 1000)
    ds = [msg(i, k=1) for i in range(10)]
    for d in ds[:4]:
        feed.on_upstream_delivery(d)
    assert len(io.own) == 1  # the fourth copy overflowed slow's buffer of 3
    own = io.own[0]
    feed.on_upstream_delivery(ds[4])  # before its own subscription is attached: still queued for it
    own.handler.on_consumer_ready(own, None)
    assert own.flowed == 3  # credit for the message that marks the switch
    # published before its own subscription existed, delivered by the shared one after the attach:
    # still the member's (its own subscription does not have it)
    feed.on_upstream_delivery(ds[5])
    # published after: in both subscriptions; its own delivers first (a non-match, then a match)
    skip = msg(99, k=2)
    own.handler.on_delivery(own, skip)
    own.handler.on_delivery(own, ds[6])
    assert own.settled == [(skip, ACCEPTED)]
    assert feed.grouped == 2  # its own subscription's messages wait for the switch
    feed.on_upstream_delivery(skip)  # the marker: the switch
    assert feed.grouped == 1 and len(feed.index) == 1
    feed.on_upstream_delivery(ds[6])
    own.handler.on_delivery(own, ds[7])
    feed.on_upstream_delivery(ds[7])
    assert io.got("slow") == []
    feed.set_credit(slow, 20)
    # everything once, in order: the group's copies up to the switch, then its own subscription's
    assert io.got("slow") == ds[:8]
    assert io.got("fast") == ds[:8]
    # its own copies settle on its own subscription; group copies on the group's
    for tag in io.tags("slow"):
        feed.on_client_outcome(slow, tag, ACCEPTED)
    for tag in io.tags("fast"):
        feed.on_client_outcome(fast, tag, ACCEPTED)
    assert [d for d, _ in own.settled[1:]] == ds[6:8]
    # fast leaves: nobody is left in the group, so the shared subscription consumes what comes
    feed.remove_outlet(fast)
    feed.on_upstream_delivery(msg(50, k=1))
    assert feed.upstream_credit > 0 and io.settled[-1][1] is ACCEPTED
    feed.remove_outlet(slow)
    assert own.closed


def test_own_subscription_lost_closes_that_link_only():
    io = Recorder()
    feed = FanoutFeed(io, window=4, buffer=1)
    slow, fast = outlet("slow", None), outlet("fast", None)
    feed.add_outlet(slow)
    feed.add_outlet(fast)
    feed.set_credit(fast, 100)
    for i in range(3):
        feed.on_upstream_delivery(msg(i))
    own = io.own[0]
    own.handler.on_consumer_closed(own, None)
    assert io.lost == [("slow", "amqp:link:detach-forced")]
    assert list(feed.outlets) == [fast]
    assert len(io.settled) == 0  # fast has not settled yet; slow's copies are done
    for tag in io.tags("fast"):
        feed.on_client_outcome(fast, tag, ACCEPTED)
    assert len(io.settled) == 3


def test_undecodable_message_goes_only_to_members_that_read_nothing():
    io = Recorder()
    feed = FanoutFeed(io, window=4, buffer=4)
    a, b = outlet("a", "k = 1"), outlet("b", None)
    for o in (a, b):
        feed.add_outlet(o)
        feed.set_credit(o, 5)
    bad = UpstreamDelivery(b"\x00Sq\xff\xff")  # application-properties that do not decode
    feed.on_upstream_delivery(bad)
    assert io.got("a") == []
    assert feed.stats.undecodable == 1


SELECTORS = ["customer = 'c{n}'", "customer IN ('c{n}', 'c{m}')", "customer LIKE 'c{n}%'", "k > {n}",
             "customer = 'c{n}' AND k < {m}", "TRUE", "customer <> 'c{n}'"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), indexed=st.booleans(), cache=st.sampled_from([0, 8]),
       presettled=st.booleans())
def test_property_members_receive_exactly_what_their_filter_selects(seed, indexed, cache, presettled):
    rnd = random.Random(seed)
    io = Recorder()
    feed = FanoutFeed(io, window=50, buffer=1000, indexed=indexed, cache_size=cache)
    texts = {}
    for j in range(rnd.randint(1, 12)):
        text = rnd.choice(SELECTORS).format(n=rnd.randint(0, 5), m=rnd.randint(0, 5))
        o = outlet(f"o{j}", text)
        o.presettled = presettled
        texts[o.name] = compile_selector(text)
        feed.add_outlet(o)
        feed.set_credit(o, 1000)
    ds = []
    for i in range(40):
        props = {"k": rnd.randint(0, 6)}
        if rnd.random() < 0.9:
            props["customer"] = f"c{rnd.randint(0, 6)}"
        ds.append((msg(i, **props), props))
    for d, _ in ds:
        feed.on_upstream_delivery(d)
    from broker_filter.amqp import decode_message
    for name, f in texts.items():
        expect = [d for d, _ in ds if f.evaluate(decode_message(d.data, f.reads)) is True]
        assert io.got(name) == expect, name
    if presettled:
        assert len(io.settled) == len(ds)  # every message settled upstream exactly once
        assert len({id(d) for d, _ in io.settled}) == len(ds)


def test_metrics_subscribers_candidates_evaluations_and_index_hit_rate():
    from prometheus_client import CollectorRegistry

    from broker_filter.metrics import Metrics

    metrics = Metrics(CollectorRegistry())
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10, counters=metrics.shared("/topic/t"))
    outlets = [outlet(f"o{i}", f"customer = 'c{i}'") for i in range(50)] + [outlet("like", "customer LIKE 'c1%'")]
    for o in outlets:
        feed.add_outlet(o)
        feed.set_credit(o, 10)
    for i in range(4):
        feed.on_upstream_delivery(msg(i, customer="c3"))
    feed.remove_outlet(outlets[0])
    assert metrics.registry.get_sample_value("broker_filter_shared_messages_total", {"address": "/topic/t"}) == 0
    feed.tick()  # (the I/O layer's, once a second: the counts go to the metrics)

    def value(name):
        return metrics.registry.get_sample_value(name, {"address": "/topic/t"})

    assert value("broker_filter_shared_subscribers") == 50
    assert value("broker_filter_shared_messages_total") == 4
    # one equality posting and the unindexable LIKE per message: 2 candidates, 2 evaluations, of 51 links
    assert value("broker_filter_shared_candidates_total") == 8
    assert value("broker_filter_shared_evaluations_total") == 8
    assert value("broker_filter_shared_index_lookups_total") == 4
    assert value("broker_filter_shared_index_hits_total") == 3  # the same customer value: cached after the first
    assert io.got("o3") == [d for _, d, _ in io.sent]
    feed.close()
    assert value("broker_filter_shared_subscribers") == 0


def test_a_shared_subscription_grants_again_credit_the_broker_used_up():
    """As a queue feed does (test_forwarding): a flow leaving the shared link less credit than the
    group counts makes it pull again at its next tick."""
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10)
    o = outlet("a", "customer = 'c1'")
    feed.add_outlet(o)
    feed.set_credit(o, 5)
    granted = io.flowed
    assert feed.upstream_credit == granted > 0
    feed.on_upstream_credit(granted)
    feed.tick()
    assert io.flowed == granted
    feed.on_upstream_credit(0)
    assert io.flowed == granted  # taken at the next tick, if nothing arrived in between
    feed.tick()
    assert feed.upstream_credit == io.flowed - granted > 0
    feed.close()


def test_a_selective_group_pulls_the_upstream_messages_its_credit_needs_and_nobody_departs():
    """A filter that selects one message in four needs four upstream messages per unit of client
    credit: once measured, the group keeps window + 4 x credit outstanding.  A client that takes
    its messages as they come is never more than `buffer` beyond its credit behind, so it never
    leaves for a subscription of its own; one that stops taking them does, at buffer + its credit."""
    io = Recorder()
    feed = FanoutFeed(io, window=10, buffer=10, max_credit=500)
    fast = outlet("fast", "q = 0")
    feed.add_outlet(fast)
    feed.set_credit(fast, 100)
    assert io.flowed == 10 + 100  # nothing measured yet: spread 1
    pulled = taken = 0
    while pulled < 4000 and pulled < io.flowed:  # the broker sends what was granted
        feed.on_upstream_delivery(msg(pulled, q=pulled % 4))
        pulled += 1
        if len(io.got("fast")) - taken >= 25:  # the client takes 25 and gives its credit back
            taken = len(io.got("fast"))
            feed.set_credit(fast, 100)
    assert feed.spread == 4.0
    assert 10 + 4 * 100 - 100 <= io.flowed - pulled <= 10 + 4 * 100  # outstanding, topped up in quarters
    assert io.own == [] and len(io.got("fast")) == pulled // 4
    slow = outlet("slow", "TRUE")
    feed.add_outlet(slow)
    feed.set_credit(slow, 5)
    for _ in range(5 + 10 + 5 + 1):  # its 5, then buffer (10) + its credit (5) queued, then one more
        feed.on_upstream_delivery(msg(pulled, q=1))
        pulled += 1
    assert len(io.got("slow")) == 5 and len(io.own) == 1
    feed.close()
