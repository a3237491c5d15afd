"""Settlement in arrival order (broker_filter.proxy.settlement) driven directly, without sockets:
a table of scenarios, each a run of arrivals, decisions, flushes and clears with the exact
(delivery, outcome) pairs every step releases; then the same bookkeeping through
`RemoteConsumer.settle`, with its I/O replaced by a record."""

from __future__ import annotations

import pytest

from broker_filter.proxy.forwarding import ACCEPTED, RELEASED, Outcome
from broker_filter.proxy.remote import RemoteConsumer
from broker_filter.proxy.settlement import ORDER_LIMIT, SettlementOrder
from broker_filter.proxy.traits import Traits
from broker_filter.proxy.upstream import ConsumerSpec, UpstreamDelivery


class Delivery:
    """A delivery compared by identity, as the consumer's are."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


# Steps: ("arrive", "a b c"), ("decide", name, outcome, released), ("flush", released), ("clear",),
# ("state", registered, waiting); `released` is the exact list of (name, outcome) the step gives.
SCENARIOS = {
    "decisions in arrival order apply at once": (ORDER_LIMIT, [
        ("arrive", "a b c"),
        ("decide", "a", "accepted", [("a", "accepted")]),
        ("decide", "b", "released", [("b", "released")]),
        ("decide", "c", "rejected", [("c", "rejected")]),
        ("state", 0, 0),
        ("flush", []),
    ]),
    "later decisions wait for the head, then the decided run goes in arrival order": (ORDER_LIMIT, [
        ("arrive", "a b c d"),
        ("decide", "c", "rejected", []),
        ("decide", "b", "released", []),
        ("state", 4, 2),
        ("decide", "a", "accepted", [("a", "accepted"), ("b", "released"), ("c", "rejected")]),
        ("state", 1, 0),
        ("decide", "d", "accepted", [("d", "accepted")]),
        ("state", 0, 0),
    ]),
    "the run stops at the next undecided delivery": (ORDER_LIMIT, [
        ("arrive", "a b c d"),
        ("decide", "b", "released", []),
        ("decide", "d", "rejected", []),
        ("decide", "a", "accepted", [("a", "accepted"), ("b", "released")]),
        ("state", 2, 1),
        ("decide", "c", "accepted", [("c", "accepted"), ("d", "rejected")]),
        ("state", 0, 0),
    ]),
    "the head decided while a later one waits goes alone": (ORDER_LIMIT, [
        ("arrive", "a b c"),
        ("decide", "c", "rejected", []),
        ("decide", "a", "accepted", [("a", "accepted")]),
        ("state", 2, 1),
        ("decide", "b", "released", [("b", "released"), ("c", "rejected")]),
    ]),
    "deliveries arriving after decisions queue behind them": (ORDER_LIMIT, [
        ("arrive", "a b"),
        ("decide", "b", "released", []),
        ("arrive", "c"),
        ("decide", "c", "accepted", []),
        ("decide", "a", "accepted", [("a", "accepted"), ("b", "released"), ("c", "accepted")]),
    ]),
    "flush gives the decided ones in arrival order and keeps the undecided": (ORDER_LIMIT, [
        ("arrive", "a b c d e"),
        ("decide", "d", "rejected", []),
        ("decide", "b", "released", []),
        ("flush", [("b", "released"), ("d", "rejected")]),
        ("state", 3, 0),
        ("decide", "c", "accepted", []),
        ("decide", "a", "accepted", [("a", "accepted"), ("c", "accepted")]),
        ("flush", []),
        ("state", 1, 0),
    ]),
    "flush with nothing decided gives nothing": (ORDER_LIMIT, [
        ("flush", []),
        ("arrive", "a b"),
        ("flush", []),
        ("state", 2, 0),
    ]),
    "clear forgets decided and undecided alike": (ORDER_LIMIT, [
        ("arrive", "a b c"),
        ("decide", "c", "rejected", []),
        ("clear",),
        ("state", 0, 0),
        ("flush", []),
        ("decide", "b", "released", [("b", "released")]),
        ("decide", "c", "accepted", [("c", "accepted")]),
        ("state", 0, 0),
    ]),
    "a delivery never registered applies at once and changes nothing": (ORDER_LIMIT, [
        ("arrive", "a b"),
        ("decide", "b", "released", []),
        ("decide", "x", "rejected", [("x", "rejected")]),
        ("state", 2, 1),
        ("decide", "a", "accepted", [("a", "accepted"), ("b", "released")]),
    ]),
    "a second decision while the first waits applies at once; the first keeps its place": (ORDER_LIMIT, [
        ("arrive", "a b"),
        ("decide", "b", "released", []),
        ("decide", "b", "accepted", [("b", "accepted")]),
        ("state", 2, 1),
        ("decide", "a", "accepted", [("a", "accepted"), ("b", "released")]),
        ("state", 0, 0),
    ]),
    "a decision for a delivery already released applies at once": (ORDER_LIMIT, [
        ("arrive", "a b"),
        ("decide", "a", "accepted", [("a", "accepted")]),
        ("decide", "a", "released", [("a", "released")]),
        ("state", 1, 0),
    ]),
    "past the limit every decided one goes at once, out of order": (2, [
        ("arrive", "a b c d e"),
        ("decide", "b", "released", []),
        ("decide", "c", "accepted", []),
        ("state", 5, 2),  # at the limit: still waiting
        ("decide", "e", "rejected", [("b", "released"), ("c", "accepted"), ("e", "rejected")]),
        ("state", 2, 0),
        ("decide", "a", "accepted", [("a", "accepted")]),
        ("decide", "d", "accepted", [("d", "accepted")]),
        ("state", 0, 0),
    ]),
    "with a limit of one, a second waiting decision releases both": (1, [
        ("arrive", "a b c d"),
        ("decide", "d", "rejected", []),
        ("state", 4, 1),
        ("decide", "b", "released", [("b", "released"), ("d", "rejected")]),
        ("state", 2, 0),
        ("decide", "c", "accepted", []),
        ("decide", "a", "accepted", [("a", "accepted"), ("c", "accepted")]),
        ("state", 0, 0),
    ]),
}


def names(pairs, deliveries):
    """(name, outcome) for each released pair, checking it is the very object registered."""
    out = []
    for d, o in pairs:
        assert d is deliveries[d.name]
        out.append((d.name, o))
    return out


@pytest.mark.parametrize("limit, steps", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_scenario(limit, steps):
    order = SettlementOrder(limit)
    deliveries: dict[str, Delivery] = {}

    def delivery(name: str) -> Delivery:
        return deliveries.setdefault(name, Delivery(name))

    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "arrive":
            for name in step[1].split():
                order.arrived(delivery(name))
        elif kind == "decide":
            _, name, outcome, released = step
            assert names(order.decided(delivery(name), outcome), deliveries) == released, (i, step)
        elif kind == "flush":
            assert names(order.flush(), deliveries) == step[1], (i, step)
        elif kind == "clear":
            order.clear()
        elif kind == "state":
            assert (len(order), order.waiting) == step[1:], (i, step)
        else:
            raise AssertionError(f"unknown step {step!r}")


def test_the_state_moves_only_as_far_as_the_pairs_taken():
    """A caller that stops after a pair (its apply failed) leaves the rest in place."""
    a, b, c = Delivery("a"), Delivery("b"), Delivery("c")
    order = SettlementOrder()
    for d in (a, b, c):
        order.arrived(d)
    assert list(order.decided(c, "rejected")) == []
    assert list(order.decided(b, "released")) == []
    run = order.decided(a, "accepted")
    assert next(run) == (a, "accepted")
    assert (len(order), order.waiting) == (2, 2)
    run.close()
    assert list(order.flush()) == [(b, "released"), (c, "rejected")]
    assert (len(order), order.waiting) == (0, 0)


def test_decided_first_takes_only_the_head_while_nothing_waits():
    """The fast path: True (and the head forgotten) exactly where `decided` would yield the one
    pair at once; otherwise False and nothing changes."""
    a, b, c = Delivery("a"), Delivery("b"), Delivery("c")
    order = SettlementOrder()
    assert order.decided_first(a) is False  # nothing registered
    for d in (a, b, c):
        order.arrived(d)
    assert order.decided_first(b) is False and len(order) == 3  # not the head
    assert order.decided_first(a) is True and len(order) == 2
    assert list(order.decided(c, "rejected")) == []  # c waits behind b
    assert order.decided_first(b) is False and (len(order), order.waiting) == (2, 1)  # something waits
    assert list(order.decided(b, "accepted")) == [(b, "accepted"), (c, "rejected")]
    assert (len(order), order.waiting) == (0, 0)


def test_the_default_limit():
    order = SettlementOrder()
    assert order.limit == ORDER_LIMIT == 1000
    head, *rest = [Delivery(str(i)) for i in range(ORDER_LIMIT + 2)]
    for d in (head, *rest):
        order.arrived(d)
    for d in rest[:-1]:
        assert list(order.decided(d, "accepted")) == []
    assert order.waiting == ORDER_LIMIT
    assert list(order.decided(rest[-1], "released")) == [(d, "accepted") for d in rest[:-1]] + [(rest[-1], "released")]
    assert (len(order), order.waiting) == (1, 0)


class FakeUpstream:
    def __init__(self, modified_ok: bool):
        self.traits = Traits(modified_ok=modified_ok)
        self.recycles_sessions = False
        self.forgotten = []

    def _forget(self, ep):
        self.forgotten.append(ep)

    def _drop_waiting(self, session):
        return False


class RecordingConsumer(RemoteConsumer):
    """A RemoteConsumer whose only I/O, applying an outcome, is recorded instead."""

    def __init__(self, modified_ok: bool = True):
        super().__init__(FakeUpstream(modified_ok), ConsumerSpec("q"), handler=None)
        self.applied = []

    def _apply(self, delivery, outcome):
        self.applied.append((delivery, outcome))


MODIFIED = Outcome("modified", delivery_failed=True)


def test_consumer_without_ordering_applies_each_decision_at_once():
    c = RecordingConsumer()
    a, b = UpstreamDelivery(b"a"), UpstreamDelivery(b"b")
    c.settle(b, RELEASED)
    c.settle(a, ACCEPTED)
    assert c.applied == [(b, RELEASED), (a, ACCEPTED)]
    assert c.order is None


def test_consumer_in_order_applies_runs_and_flushes_decided_ones_on_close():
    c = RecordingConsumer()
    c.settle_in_order()
    order = c.order
    c.settle_in_order()  # a second call keeps what is registered
    assert c.order is order
    a, b, x, d = (UpstreamDelivery(bytes([i])) for i in range(4))
    for dlv in (a, b, x, d):
        c.order.arrived(dlv)
    c.settle(b, RELEASED)
    c.settle(d, MODIFIED)
    assert c.applied == []
    c.settle(a, ACCEPTED)
    assert c.applied == [(a, ACCEPTED), (b, RELEASED)]
    c.close()
    assert c.applied == [(a, ACCEPTED), (b, RELEASED), (d, MODIFIED)]
    assert c.closed and len(c.order) == 0 and c.order.waiting == 0  # closing discards the undecided x
    c.settle(x, ACCEPTED)  # after close: still handed to _apply, which ignores a closed link
    assert c.applied[-1] == (x, ACCEPTED)


def test_consumer_turns_modified_into_released_where_the_upstream_lacks_it():
    c = RecordingConsumer(modified_ok=False)
    c.settle_in_order()
    a, b = UpstreamDelivery(b"a"), UpstreamDelivery(b"b")
    c.order.arrived(a)
    c.order.arrived(b)
    c.settle(b, MODIFIED)
    c.settle(a, MODIFIED)
    assert c.applied == [(a, RELEASED), (b, RELEASED)]
