"""The search of a queue (broker_filter.proxy.search.QueueSearch) driven directly, without a feed,
a broker or sockets: tables of scenarios for what a pass is, when a search opens and stops, what is
moved and what is held, the count asked of the upstream (answered or not), the timers between
passes, handing back and going round, and a published message extending the search."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker_filter.proxy.search import (COUNTED_LOOK, HAND_BACK_FIRST, WALLED_FIRST, WALLED_MAX,
                                        QueueSearch)

WALL = 1_700_000_000.0  # the wall clock at the start of each scenario (seconds)


@dataclass
class Msg:
    """What the search reads of a held message (the feed's Custody)."""

    mark: dict = field(default_factory=dict)
    redelivered: bool = False
    refused: int = 0
    kept: bool = False


@dataclass
class Link:
    credit: int = 0


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def search(identities=("red",), window=10, look_again=10.0, look_again_max=600.0, foreign_ttl=60.0, **kw):
    """A search for token "d1" whose feed has links with the filters `identities`; `.clock` and
    `.wall` move its time."""
    clock, wall = Clock(100.0), Clock(WALL)
    s = QueueSearch(token="d1", window=window, clock=clock, wall=wall, foreign_ttl=foreign_ttl,
                    look_again=look_again, look_again_max=look_again_max, **kw)
    s.filters(frozenset(identities))
    s.clock, s.wall = clock, wall
    return s


def offered(*identities, by="d1", ms=int(WALL) * 1000, moved=None):
    """A mark: offered to `identities` by the feed `by` at `ms`; `moved`: the pass tag that moved it."""
    mark = {i: [by, ms] for i in identities}
    if moved is not None:
        mark[""] = [moved, ms]
    return mark


WAITING, IDLE = [Link(1)], [Link(0)]


# ------------------------------------------------------------------ passes
def test_a_pass_is_numbered_and_tagged_with_the_feed_token():
    s = search()
    assert (s.pass_open, s.pass_no, s.pass_tag()) == (False, 0, "d1#0")
    s.open_pass()
    assert (s.pass_open, s.pass_no, s.pass_tag()) == (True, 1, "d1#1")
    s.open_pass()  # a new pass even while one is open: the old one can no longer end it
    assert (s.pass_open, s.pass_no, s.pass_tag()) == (True, 2, "d1#2")


@pytest.mark.parametrize("before, after, added, opens", [
    ((), ("red",), True, True),  # the first filter
    (("red",), ("red", "blue"), True, True),  # a new filter attaches
    (("red",), ("red",), True, False),  # another link with a filter already here
    (("red", "blue"), ("red",), False, False),  # a link goes: nothing new to offer to
    (("red",), ("blue",), False, False),  # changed, but not by an attach
])
def test_a_new_filter_opens_a_pass(before, after, added, opens):
    s = search(before)
    s.filters(frozenset(after), added)
    assert s.pass_open is opens and s.pass_no == int(opens)
    assert s.identities == frozenset(after)


@pytest.mark.parametrize("pass_open, mark, links, ends, open_after, passes", [
    # a copy this pass moved comes round: everything before it was offered
    (True, offered("red", moved="d1#1"), WAITING, True, False, 1),
    (True, offered("red", moved="d1#1"), IDLE, True, False, 1),
    # a copy of an earlier pass, or of another daemon's, or an unmarked message: the pass goes on
    (True, offered("red", moved="d1#0"), WAITING, False, True, 1),
    (True, offered("red", by="d2", moved="d2#1"), WAITING, False, True, 1),
    (True, {}, WAITING, False, True, 1),
    # after the pass: a message not yet offered to a filter here opens one while a link waits
    (False, {}, WAITING, False, True, 2),
    (False, offered("blue", moved="d1#1"), WAITING, False, True, 2),
    (False, {}, IDLE, False, False, 1),
    (False, {}, [Link(0), Link(3)], False, True, 2),
    # ... but not one offered to every filter here
    (False, offered("red", moved="d1#1"), WAITING, False, False, 1),
    (False, offered("red", "blue", by="d2"), WAITING, False, False, 1),
])
def test_what_a_pulled_message_does_to_the_pass(pass_open, mark, links, ends, open_after, passes):
    s = search(("red",))
    s.open_pass()  # pass 1
    s.pass_open = pass_open
    assert s.pulled(mark, links) is ends
    assert s.pass_open is open_after and s.pass_no == passes


def test_a_feed_without_filters_has_nothing_to_open_a_pass_for():
    s = search(())
    assert s.pulled({}, WAITING) is False and not s.pass_open


@pytest.mark.parametrize("pass_open, foreign, links, searching", [
    (True, False, WAITING, True),
    (True, False, IDLE, False),  # nobody waits: nothing is moved
    (True, False, [], False),
    (False, False, WAITING, False),  # the pass is over
    (False, True, WAITING, True),  # another daemon's filter was offered something lately
    (False, True, IDLE, False),
])
def test_when_the_feed_searches(pass_open, foreign, links, searching):
    s = search(("red",))
    s.pass_open = pass_open
    if foreign:
        s.learn(offered("blue", by="d2"))
        s.pass_open = pass_open  # (learning it opened a pass)
    assert s.searching(links) is searching


# ------------------------------------------------------------------ a published message, credit
def test_a_published_message_extends_the_search_past_the_copy_that_would_have_ended_it():
    s = search(("red",))
    s.open_pass()
    early = offered("red", moved=s.pass_tag())  # moved before the publish
    assert s.published() is True  # (a pass was open: the feed need not pump)
    assert s.pass_open and s.pass_no == 2
    assert s.pulled(early, WAITING) is False and s.pass_open  # goes on
    assert s.pulled(offered("red", moved="d1#2"), WAITING) is True and not s.pass_open


def test_a_publish_after_the_pass_opens_one_and_says_none_was_open():
    s = search(("red",))
    assert s.published() is False and s.pass_open and s.pass_no == 1


@pytest.mark.parametrize("deferred, gains, opens", [
    ({"red"}, "red", True),  # messages it selects were moved while it had no credit
    ({"red"}, "blue", False),
    (set(), "red", False),
])
def test_a_link_whose_messages_were_moved_gets_one_more_pass_when_its_credit_returns(deferred, gains, opens):
    s = search(("red", "blue"))
    s.open_pass()
    s.defer(iter(deferred))
    s.credit(gains)
    assert s.pass_no == (2 if opens else 1) and s.pass_open
    assert s.deferred == (deferred - {gains})
    s.credit(gains)  # once per move, not per grant
    assert s.pass_no == (2 if opens else 1)


# ------------------------------------------------------------------ moved or held
@pytest.mark.parametrize("window, reserve", [(1, 1), (2, 1), (3, 1), (10, 5), (11, 5), (100, 50)])
def test_the_reserve_is_half_the_window_and_at_least_one(window, reserve):
    assert search(window=window).reserve == reserve


@pytest.mark.parametrize("kept, redelivered, keeps, kept_after", [
    (0, False, True, 1),
    (4, False, True, 5),
    (5, False, False, 5),  # the reserve (window 10) is taken: moved like a non-matching one
    (7, False, False, 7),
    (5, True, True, 5),  # a redelivery is always held, and takes no share of the reserve
    (0, True, True, 0),
])
def test_messages_held_for_links_without_credit_take_at_most_the_reserve(kept, redelivered, keeps, kept_after):
    s = search(window=10)
    s.kept = kept
    m = Msg(redelivered=redelivered)
    assert s.keep(m) is keeps
    assert s.kept == kept_after and m.kept is (keeps and not redelivered)


HERE = offered("red", moved="d1#1")
NEW = {}


@pytest.mark.parametrize("pass_open, mark, wanted, kept, readable, refused, moves", [
    # during a pass everything no link takes goes round
    (True, NEW, False, 0, True, 0, True),
    (True, HERE, False, 0, True, 0, True),
    # ... but for what links here select, within the reserve
    (True, NEW, True, 0, True, 0, False),
    (True, NEW, True, 5, True, 0, True),
    # ... an unreadable message (no mark can go on it)
    (True, NEW, False, 0, False, 0, False),
    # ... and what the broker refused a copy of in this pass
    (True, NEW, False, 0, True, 1, False),
    # after the pass: only what a filter was not offered yet, and not what links here keep
    (False, HERE, False, 0, True, 0, False),
    (False, NEW, True, 0, True, 0, False),
    (False, NEW, False, 0, True, 0, True),
    (False, offered("blue"), False, 0, True, 0, True),
])
def test_what_is_moved_and_what_is_held(pass_open, mark, wanted, kept, readable, refused, moves):
    s = search(("red",), window=10)
    s.open_pass()  # pass 1
    s.pass_open = pass_open
    s.kept = kept
    m = Msg(mark=mark, refused=refused)
    assert s.to_move(m, wanted, readable) is moves


def test_a_refusal_holds_a_message_only_for_the_pass_it_happened_in():
    s = search(("red",))
    s.open_pass()
    m = Msg(refused=s.pass_no)
    assert not s.movable(m) and not s.may_hand_back(m)
    s.open_pass()
    assert s.movable(m) and s.may_hand_back(m)


def test_after_the_pass_a_message_another_daemons_live_filter_was_not_offered_is_moved():
    s = search(("red",))
    s.learn(offered("blue", by="d2", moved="d2#4"))  # d2 serves blue, now
    s.pass_open = False
    assert s.live_foreign() == ["blue"]
    assert s.movable(Msg(mark=offered("red")))  # blue never saw it
    assert not s.movable(Msg(mark=offered("red") | offered("blue", by="d2")))
    s.wall.now += 61  # d2 silent for longer than foreign_ttl: forgotten
    assert s.live_foreign() == [] and not s.movable(Msg(mark=offered("red")))


@pytest.mark.parametrize("kept_before, flags, kept_after, flags_after", [
    (0, [True, True, False], 2, [True, True, False]),
    (4, [True, True, False], 5, [True, False, False]),  # (window 10: reserve 5)
    (5, [True], 5, [False]),
])
def test_messages_left_unevaluated_stay_kept_within_the_reserve(kept_before, flags, kept_after, flags_after):
    s = search(window=10)
    s.kept = kept_before
    held = [Msg(kept=k) for k in flags]
    for m in held:
        s.recount(m)
    assert s.kept == kept_after and [m.kept for m in held] == flags_after


@pytest.mark.parametrize("kept, refused, hands_back", [(False, 0, True), (True, 0, False), (False, 3, False)])
def test_what_may_be_handed_back(kept, refused, hands_back):
    s = search()
    s.pass_no = 3
    assert s.may_hand_back(Msg(kept=kept, refused=refused)) is hands_back


# ------------------------------------------------------------------ marks
def test_a_move_marks_the_filters_offered_and_the_pass_keeping_the_first_offers():
    s = search(("red", "blue"))
    s.open_pass()
    ms = int(WALL) * 1000
    old = offered("red", by="d2", ms=ms - 5000, moved="d2#7")
    mark, written = s.new_mark(old)
    assert mark == {"red": ["d2", ms - 5000], "blue": ["d1", ms], "": ["d1#1", ms]}
    assert written is None and old == offered("red", by="d2", ms=ms - 5000, moved="d2#7")  # not changed


def test_moves_in_one_second_and_pass_share_a_mark_written_once():
    written = []
    s = search(("red",), encode=lambda mark: written.append(mark) or len(written))
    s.open_pass()
    old = {}
    first = s.new_mark(old)
    assert s.new_mark(old) == first and s.new_mark(old)[0] is first[0] and len(written) == 1
    s.wall.now += 0.5  # the same whole second
    assert s.new_mark(old)[0] is first[0]
    s.wall.now += 1
    second = s.new_mark(old)
    assert second[0] is not first[0] and second[0][""][1] == first[0][""][1] + 1000 and second[1] == 2
    s.open_pass()
    assert s.new_mark(old)[0][""][0] == "d1#2"
    s.filters(frozenset({"red", "blue"}), True)  # new filters: a new mark
    assert set(s.new_mark(old)[0]) == {"red", "blue", ""} and len(written) == 4
    s.filters(frozenset({"blue"}))  # a link goes (no new pass, the same second): blue only now
    assert set(s.new_mark(old)[0]) == {"blue", ""} and len(written) == 5


@pytest.mark.parametrize("mark, opens, live", [
    (offered("blue", by="d2", moved="d2#1"), True, ["blue"]),  # another daemon serves blue
    (offered("blue", by="d2", ms=int(WALL - 61) * 1000), False, []),  # too old to count
    (offered("red", by="d2"), False, []),  # a filter here
    (offered("blue", by="d1", moved="d1#0"), False, []),  # this feed's own offer
])
def test_a_mark_from_another_daemon_opens_a_pass_while_it_is_live(mark, opens, live):
    s = search(("red",))
    s.learn(mark)
    assert s.pass_open is opens and s.live_foreign() == live


def test_another_daemons_filter_opens_only_one_pass_until_it_is_forgotten():
    s = search(("red",))
    s.learn(offered("blue", by="d2"))
    s.learn(offered("blue", by="d2"))
    assert s.pass_no == 1
    s.wall.now += 30
    s.learn(offered("blue", by="d2", ms=int(s.wall.now) * 1000))  # a sign of life: stays live longer
    s.wall.now += 45
    assert s.live_foreign() == ["blue"]
    s.wall.now += 20
    assert s.live_foreign() == []
    s.learn(offered("blue", by="d2", ms=int(s.wall.now) * 1000))  # met again
    assert s.pass_no == 2


# ------------------------------------------------------------------ counting the queue
def counting(moved=0, back=0):
    """A search after pass 1 ended, `moved` of its copies accepted and `back` of them pulled back."""
    s = search(("red",))
    s.open_pass()
    for _ in range(moved):
        s.copy_accepted(s.pass_no)
    for _ in range(back):
        s.learn(offered("red", moved=s.pass_tag()))
    s.pass_open = False
    return s


@pytest.mark.parametrize("moved, back, counts, opens", [
    # (counts: the queue's ready count, and every upstream delivery the feed had by then)
    # the queue holds the copies not yet pulled back: nothing new
    (10, 0, [(10, 0)], [False]),
    (10, 4, [(6, 4)], [False]),
    (10, 10, [(0, 10), (0, 10), (0, 10)], [False, False, False]),
    # more than that: a message this feed never saw, published behind the pass
    (10, 4, [(7, 4)], [True]),
    (0, 0, [(1, 0)], [True]),
    # less: another consumer takes messages (met): one more pass, then only a count higher than
    # ever (net of what this feed moved and pulled) opens one
    (10, 0, [(10, 0), (8, 0)], [False, True]),
    (10, 0, [(10, 0), (8, 0), (9, 0), (10, 0), (11, 0)], [False, True, False, False, True]),
    (10, 0, [(10, 0), (8, 0), (7, 0), (9, 0)], [False, True, False, False]),  # (met once: falls tell nothing)
    # the feed's own pulls make the queue shorter: nobody else
    (10, 0, [(10, 0), (5, 5)], [False, False]),
    # a withdrawn question tells nothing
    (10, 0, [(-1, 0), (11, 0)], [False, True]),
])
def test_the_queue_count_opens_a_pass_only_for_what_the_feed_did_not_put_there(moved, back, counts, opens):
    s = counting(moved, back)
    got = []
    for n, pulled in counts:
        got.append(s.counted(n, False, pulled))
        s.pass_open = False  # (the pass found nothing: over)
    assert got == opens


@pytest.mark.parametrize("busy, pass_open", [(True, False), (False, True)])
def test_a_count_while_moving_or_searching_tells_nothing(busy, pass_open):
    s = counting(10)
    s.pass_open = pass_open
    assert s.counted(99, busy, 0) is False and s.pass_no == 1


def test_a_copy_pulled_back_from_an_earlier_pass_does_not_count_as_this_passs():
    s = counting(10)
    s.open_pass()
    s.learn(offered("red", moved="d1#1"))  # pass 1's copy
    s.pass_open = False
    assert s.counted(0, False, 0) is False  # pass 2 moved nothing, and nothing of it came back


def answered(s):
    """What a feed does with the upstream's answer (it has no moves in flight and pulled nothing)."""
    return lambda n: s.counted(n, False, 0)


def test_a_copy_of_an_earlier_pass_accepted_late_is_not_counted_as_this_passs():
    s = counting(0)
    s.open_pass()  # pass 2, while a copy of pass 1 is on its way
    s.copy_accepted(1)
    s.pass_open = False
    assert s.counted(1, False, 0) is True  # pass 2 put nothing in the queue: 1 is news


class Upstream:
    """The upstream's side of a probe: `answers` is what each question returns (True: asked; False:
    not now; None: never asked); the answers wait in `pending`."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.pending = []
        self.asked = 0

    def __call__(self, answer):
        asked = self.answers.pop(0) if self.answers else True
        self.asked += 1
        if asked:
            self.pending.append(answer)
        return asked


def test_the_count_is_asked_once_at_a_time_and_not_while_moves_are_in_flight():
    s = counting(10)
    up = Upstream()
    s.look(up, answered(s), moving=3)
    assert up.asked == 0
    s.look(up, answered(s), moving=0)
    s.look(up, answered(s), moving=0)
    assert up.asked == 1  # the first question is open
    up.pending.pop()(10)
    s.look(up, answered(s), moving=0)
    assert up.asked == 2


@pytest.mark.parametrize("answers, asked_again", [
    ([None], False),  # the upstream has no such question: never asked again
    ([False], True),  # not now: asked at the next tick
    ([True], True),
])
def test_an_upstream_that_cannot_be_asked_is_not_asked_again(answers, asked_again):
    s = counting(10)
    up = Upstream(*answers)
    s.look(up, answered(s), 0)
    if up.pending:
        up.pending.pop()(10)
    s.look(up, answered(s), 0)
    assert up.asked == (2 if asked_again else 1)


def test_two_counts_never_answered_stop_the_questions():
    s = counting(10)
    up = Upstream()
    for _ in range(2):
        s.look(up, answered(s), 0)
        up.pending.pop()(None)  # no answer in time
    for _ in range(3):
        s.look(up, answered(s), 0)
    assert up.asked == 2
    s2 = counting(10)
    s2.look(up, answered(s2), 0)
    up.pending.pop()(None)
    s2.look(up, answered(s2), 0)
    up.pending.pop()(10)  # an answer at last: the count goes on
    s2.look(up, answered(s2), 0)
    assert len(up.pending) == 1


# ------------------------------------------------------------------ looking again
def looks(s, up, seconds, count=0):
    """The monotonic times (from the start) at which ticks once a second for `seconds` looked
    again (opened a pass); `up` answers each question with `count` before the next tick."""
    start, out = s.clock.now, []
    for _ in range(seconds):
        if s.look(up, answered(s), 0):
            out.append(round(s.clock.now - start))
            s.pass_open = False  # (the pass found nothing: over)
        while up is not None and up.pending:
            up.pending.pop()(count)
        s.clock.now += 1
    return out


@pytest.mark.parametrize("counts, others, expected", [
    # no count: look again 10 s after the first tick after a pass, then 20 s, 40 s, ...
    (None, False, [10, 31, 72, 153]),
    # counts answered, nobody else seen: only rarely (COUNTED_LOOK × 10 s first)
    (True, False, [10 * COUNTED_LOOK, 10 * COUNTED_LOOK + 1 + 120]),
    # counts answered but another consumer seen: the counts cannot tell everything
    (True, True, [10, 31, 72, 153]),
    # the upstream has no such question
    (False, False, [10, 31, 72, 153]),
])
def test_looking_again_after_a_pass_that_found_nothing(counts, others, expected):
    s = counting(0)
    if others:
        s.learn(offered("red", by="d2", moved="d2#3"))  # a copy another daemon moved
        s.pass_open = False
    up = None if counts is None else Upstream(*([True] * 1000 if counts else [None]))
    assert looks(s, up, 200) == expected
    assert s.pass_no == 1 + len(expected)


def test_looking_again_doubles_up_to_the_maximum_and_any_other_pass_starts_the_delays_over():
    s = search(("red",), look_again=10.0, look_again_max=40.0)
    assert looks(s, None, 200) == [10, 31, 72, 113, 154, 195]
    s.open_pass()  # e.g. a publish: the delays start over once it is over
    s.pass_open = False
    assert looks(s, None, 40) == [10, 31]


def test_no_look_while_a_pass_is_open_and_rest_forgets_the_timer():
    s = search(("red",))
    s.open_pass()
    up = Upstream()
    for _ in range(30):
        assert s.look(up, answered(s), 0) is False
        s.clock.now += 1
    assert up.pending == []  # no count asked while searching
    s.pass_open = False
    s.look(None, answered(s), 0)  # the timer starts: the next look in 10 s
    s.clock.now += 9
    s.rest()  # no link waits
    s.clock.now += 1
    assert s.look(None, answered(s), 0) is False  # started over: 10 s from now
    s.clock.now += 9
    assert s.look(None, answered(s), 0) is False
    s.clock.now += 1
    assert s.look(None, answered(s), 0) is True


# ------------------------------------------------------------------ handing back, going round
def hand_backs(s, holding, seconds, moving=0, step=0.25):
    out = []
    t = 0.0
    while t < seconds:
        if s.hand_back_due(holding, moving):
            out.append(s.wall.now - WALL)
        s.wall.now += step
        t += step
    return out


def test_hand_backs_come_at_whole_multiples_of_a_doubling_delay_on_the_wall_clock():
    s = search(("red",), look_again_max=4.0)
    assert HAND_BACK_FIRST == 1.0
    # first the whole second at least half a second away, then 2 s, 4 s, 4 s ... apart, on multiples
    assert hand_backs(s, True, 20) == [1.0, 4.0, 8.0, 12.0, 16.0]


@pytest.mark.parametrize("holding, pass_open, moving", [(False, False, 0), (True, True, 0), (True, False, 1)])
def test_no_hand_back_without_messages_during_a_pass_or_with_moves_in_flight(holding, pass_open, moving):
    s = search(("red",))
    s.pass_open = pass_open
    assert hand_backs(s, holding, 10, moving) == []


def test_the_hand_back_delay_starts_over_once_the_feed_holds_nothing():
    s = search(("red",))
    assert hand_backs(s, True, 5) == [1.0, 4.0]
    hand_backs(s, False, 1)
    s.wall.now = WALL + 100
    assert hand_backs(s, True, 2) == [101.0]


def test_a_walled_in_feed_goes_round_only_while_another_daemon_is_live():
    s = search(("red",))
    assert s.go_round(0) is False and not s.pass_open
    s.learn(offered("blue", by="d2"))
    s.pass_open = False
    assert s.go_round(0) is True and s.pass_open and s.pass_no == 2
    assert s.go_round(0) is False  # a pass is open
    s.pass_open = False
    s.wall.now += 61
    assert s.go_round(0) is False  # d2 forgotten


def test_go_rounds_that_bring_nothing_come_ever_less_often():
    s = search(("red",))
    s.learn(offered("blue", by="d2"))
    rounds = []
    start = s.clock.now
    for _ in range(int(40 / 0.25)):  # ticks every 0.25 s; d2 stays live, the links get nothing
        s.pass_open = False
        if s.go_round(0):
            rounds.append(s.clock.now - start)
        s.clock.now += 0.25
    gaps = [b - a for a, b in zip(rounds, rounds[1:])]
    # (the first go-round's count was new: the second comes at the next tick)
    assert gaps[:6] == [0.25, WALLED_FIRST, 0.5, 1.0, 2.0, 4.0]
    assert set(gaps[6:]) == {WALLED_MAX} and len(gaps) > 8


def test_a_go_round_that_brought_the_links_something_is_followed_by_another_at_once():
    s = search(("red",))
    s.learn(offered("blue", by="d2"))
    s.pass_open = False
    assert s.go_round(0)
    s.pass_open = False
    assert s.go_round(0)  # the first go-round's delivered count was new: at once
    s.pass_open = False
    assert not s.go_round(0)  # nothing delivered since: WALLED_FIRST later
    s.clock.now += WALLED_FIRST
    assert s.go_round(5)
    s.pass_open = False
    assert s.go_round(5)  # the links had something: at once
    s.pass_open = False
    assert not s.go_round(5)
