"""The sans-I/O forwarding rules (broker_filter.forwarding) driven directly: credit bound, what is
settled upstream and when, holding, blocking, recycling and its budget."""

from __future__ import annotations

from broker_filter.codec import encode_message
from broker_filter.filters import compile_selector
from broker_filter.forwarding import ACCEPTED, Feed, Outcome, Outlet
from broker_filter.message import Message
from broker_filter.proxy.upstream import UpstreamDelivery


class Recorder:
    """The I/O side of a Feed: records the decisions."""

    def __init__(self):
        self.sent = []  # (outlet name, delivery)
        self.settled = []  # (delivery, outcome)
        self.flowed = 0
        self.recycled = []
        self._tag = 0

    def send(self, outlet, delivery):
        self._tag += 1
        self.sent.append((outlet.name, delivery))
        return self._tag

    def settle_upstream(self, delivery, outcome):
        self.settled.append((delivery, outcome))

    def flow_upstream(self, n):
        self.flowed += n

    def recycle(self, delivery, done):
        self.recycled.append((delivery, done))


def msg(color: str | None, i: int) -> UpstreamDelivery:
    props = {"i": i} if color is None else {"i": i, "color": color}
    return UpstreamDelivery(encode_message(Message(application_properties=props, body=f"m{i}")))


def sel(text: str):
    return compile_selector(text)


def feed_with_arrivals(feed: Feed, io: Recorder, messages):
    """Deliver messages only while the feed has granted credit (as a broker does)."""
    used = 0
    for d in messages:
        if used >= io.flowed:
            break
        used += 1
        feed.on_upstream_delivery(d)
    return used


def test_subscription_consumes_non_matches_and_bounds_credit():
    io = Recorder()
    feed = Feed(io, subscription=True, window=5, max_credit=1000)
    red = Outlet("red", sel("color = 'red'"))
    feed.add_outlet(red)
    assert io.flowed == 0  # no client credit, nothing pulled
    feed.set_credit(red, 3)
    assert io.flowed == 3 + 5
    ds = [msg("red" if i % 2 else "blue", i) for i in range(8)]
    feed_with_arrivals(feed, io, ds)
    assert [d for _, d in io.sent] == [ds[1], ds[3], ds[5]]
    assert {id(d) for d, o in io.settled if o is ACCEPTED} == {id(ds[i]) for i in (0, 2, 4, 6)}
    assert feed.stats.held == 1 and feed.held[0].delivery is ds[7]  # matched, waiting for credit
    assert feed.stats.filtered == 4
    # outcome flows upstream only when the client gives it
    feed.on_client_outcome(red, 1, Outcome("rejected", error=("amqp:x", "no")))
    assert io.settled[-1] == (ds[1], Outcome("rejected", error=("amqp:x", "no")))


def test_queue_holds_non_matches_and_offers_them_to_a_later_link():
    io = Recorder()
    feed = Feed(io, subscription=False, window=10)
    red = Outlet("red", sel("color = 'red'"))
    feed.add_outlet(red)
    feed.set_credit(red, 5)
    ds = [msg(["red", "green"][i % 2], i) for i in range(10)]
    feed_with_arrivals(feed, io, ds)
    assert [d for _, d in io.sent] == [ds[i] for i in (0, 2, 4, 6, 8)]
    assert io.settled == []  # nothing settled upstream without a client outcome
    assert feed.stats.held == 5
    green = Outlet("green", sel("color = 'green'"))
    feed.add_outlet(green)
    feed.set_credit(green, 2)
    assert [d for name, d in io.sent if name == "green"] == [ds[1], ds[3]]  # oldest first
    assert feed.stats.held == 3


def test_queue_blocks_when_window_is_full_and_recycles_within_budget():
    io = Recorder()
    feed = Feed(io, subscription=False, window=4, max_credit=10, recycle=True, recycle_budget=3)
    red = Outlet("red", sel("color = 'red'"))
    feed.add_outlet(red)
    feed.set_credit(red, 2)
    granted = io.flowed
    assert granted == 2 + 4
    feed_with_arrivals(feed, io, [msg("blue", i) for i in range(granted)])
    assert feed.stats.held + feed.recycling == 6
    assert io.flowed == granted  # blocked: no more credit upstream
    assert feed.stats.starved == 1 and feed.stats.blocked >= 1
    # Recycle, and feed the broker's further deliveries (all blue), until nothing more happens.
    used = granted
    for _ in range(50):
        while used < io.flowed:
            feed.on_upstream_delivery(msg("blue", 100 + used))
            used += 1
        if not io.recycled:
            break
        d, done = io.recycled.pop(0)
        done(True)
        assert io.settled[-1] == (d, ACCEPTED)
    assert feed.stats.recycled == 3  # budget used up without any delivery: it stops
    assert feed.stats.held >= 4 and feed.stats.starved == 1
    # a new link restores the budget
    feed.add_outlet(Outlet("green", sel("color = 'green'")))
    assert len(io.recycled) == 1


def test_failed_recycle_keeps_the_message_and_budget():
    io = Recorder()
    feed = Feed(io, subscription=False, window=1, recycle=True, recycle_budget=1)
    o = Outlet("o", sel("color = 'red'"))
    feed.add_outlet(o)
    feed.set_credit(o, 1)
    feed_with_arrivals(feed, io, [msg("blue", 0), msg("blue", 1)])
    d, done = io.recycled.pop(0)
    done(False)
    assert feed.held[0].delivery is d and io.settled == []
    feed.pump()
    assert len(io.recycled) == 1  # tried again with the budget intact


def test_released_in_flight_when_a_link_goes_and_undeliverable_here_skips_that_link():
    io = Recorder()
    feed = Feed(io, subscription=False, window=10)
    a = Outlet("a", sel("TRUE"))
    b = Outlet("b", sel("TRUE"))
    feed.add_outlet(a)
    feed.set_credit(a, 1)
    d0 = msg(None, 0)
    feed.on_upstream_delivery(d0)
    assert io.sent == [("a", d0)]
    feed.on_client_outcome(a, 1, Outcome("modified", undeliverable_here=True))
    assert io.settled == []  # kept in the proxy for others
    feed.set_credit(a, 1)
    assert len(io.sent) == 1  # not back to a
    feed.add_outlet(b)
    feed.set_credit(b, 1)
    assert io.sent[-1] == ("b", d0)
    feed.remove_outlet(b)
    assert io.settled == [(d0, Outcome("modified", delivery_failed=True))]  # b had it: a failed attempt


def test_undecodable_message_selected_only_by_filters_that_read_nothing():
    io = Recorder()
    feed = Feed(io, subscription=True, window=2)
    o = Outlet("o", sel("color = 'red'"))
    feed.add_outlet(o)
    feed.set_credit(o, 1)
    bad = UpstreamDelivery(b"\x00\x53\x74\xc1\xff")
    feed.on_upstream_delivery(bad)
    assert io.sent == [] and io.settled == [(bad, ACCEPTED)]
    assert feed.stats.undecodable == 1


# ---------------------------------------------------------------------------------------------
# Randomized: any sequence of broker deliveries, client credit, outcomes and (de)attaches keeps the
# invariants the proxy promises.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

COLORS = ("red", "blue", "green", None)
SELECTORS = ("color = 'red'", "color = 'blue'", "color IS NULL", "TRUE")

steps = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.integers(0, 3)),
        st.tuples(st.just("credit"), st.integers(0, 3), st.integers(0, 4)),
        st.tuples(st.just("outcome"), st.integers(0, 3), st.sampled_from(["accepted", "released", "rejected", "modified"])),
        st.tuples(st.just("attach"), st.integers(0, 3)),
        st.tuples(st.just("detach"), st.integers(0, 3)),
        st.tuples(st.just("recycled"), st.booleans()),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.booleans(), st.integers(1, 6))
def test_feed_invariants(script, subscription, window):
    io = Recorder()
    max_credit = 4
    feed = Feed(io, subscription=subscription, window=window, max_credit=max_credit, recycle=True, recycle_budget=5)
    outlets: dict[int, Outlet] = {}
    filters = {i: sel(SELECTORS[i]) for i in range(4)}
    colors: dict[int, str | None] = {}
    delivered: list = []
    client_outcomes: dict[int, str] = {}  # id(delivery) -> outcome a client gave
    recycled_ok: set[int] = set()
    reheld = 0
    for step in script:
        kind = step[0]
        if kind == "deliver":
            if len(delivered) >= io.flowed:
                continue  # the broker sends only against credit
            color = COLORS[step[1]]
            d = msg(color, len(delivered))
            colors[id(d)] = color
            delivered.append(d)
            feed.on_upstream_delivery(d)
        elif kind == "credit" and step[1] in outlets:
            feed.set_credit(outlets[step[1]], step[2])
        elif kind == "outcome" and step[1] in outlets and outlets[step[1]].in_flight:
            o = outlets[step[1]]
            tag = next(iter(o.in_flight))
            d = o.in_flight[tag]
            oc = Outcome(step[2], undeliverable_here=step[2] == "modified")
            if oc.kind == "modified" and not subscription:
                reheld += 1
            else:
                client_outcomes[id(d)] = oc.kind
            feed.on_client_outcome(o, tag, oc)
        elif kind == "attach" and step[1] not in outlets and not (subscription and outlets):
            o = Outlet(f"o{step[1]}", filters[step[1]])
            outlets[step[1]] = o
            feed.add_outlet(o)
        elif kind == "detach" and step[1] in outlets:
            feed.remove_outlet(outlets.pop(step[1]))
        elif kind == "recycled" and io.recycled:
            d, done = io.recycled.pop(0)
            if step[1]:
                recycled_ok.add(id(d))
            else:
                reheld += 1
            done(step[1])
        # the proxy's own memory stays bounded
        outstanding = io.flowed - len(delivered)
        assert len(feed.held) + feed.recycling + outstanding <= window + max_credit + reheld
    # each upstream delivery is settled at most once
    assert len({id(d) for d, _ in io.settled}) == len(io.settled)
    settled = {id(d): oc.kind for d, oc in io.settled}
    in_flight = {id(d) for o in outlets.values() for d in o.in_flight.values()}
    held = {id(h.delivery) for h in feed.held} | {id(d) for d, _ in io.recycled}
    for d in delivered:
        k = id(d)
        # nothing lost: every message is settled, held, being recycled or in flight at a client
        assert (k in settled) + (k in in_flight) + (k in held) == 1, colors[k]
        if k in settled and settled[k] == "accepted":
            # accepted upstream only if a client accepted it, its copy was accepted, or it was a
            # non-match on a subscription
            assert client_outcomes.get(k) == "accepted" or k in recycled_ok or subscription
    # every message sent went to a link whose filter selects it
    for name, d in io.sent:
        want = SELECTORS[int(name[1:])]
        color = colors[id(d)]
        selects = {"color = 'red'": color == "red", "color = 'blue'": color == "blue",
                   "color IS NULL": color is None, "TRUE": True}[want]
        assert selects, (name, color)


def test_a_decoder_fault_fails_only_that_message_not_the_feed(monkeypatch):
    # A test double for a fault no well-formed input causes: the decoder raising something other
    # than CodecError for one message.
    import broker_filter.forwarding as forwarding

    real = forwarding.decode_message
    poison = msg("red", 1)

    def flaky(data, reads):
        if data == poison.data:
            raise OverflowError("decoder bug")
        return real(data, reads)

    monkeypatch.setattr(forwarding, "decode_message", flaky)
    io = Recorder()
    feed = Feed(io, subscription=True, window=4)
    o = Outlet("o", sel("color = 'red'"))
    feed.add_outlet(o)
    feed.set_credit(o, 5)
    good = msg("red", 2)
    feed.on_upstream_delivery(poison)
    feed.on_upstream_delivery(good)
    assert [d for _, d in io.sent] == [good]
    assert (poison, ACCEPTED) in io.settled and feed.stats.undecodable == 1
