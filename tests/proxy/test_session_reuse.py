"""The upstream connection's session bookkeeping (broker_filter.proxy.sessions) driven directly,
without sockets: a table of scenarios, each a run of steps on a clock the test moves, with the exact
answer every step gives and the state it leaves (sessions are plain names here; `RemoteUpstream`
passes proton sessions and applies the answers)."""

from __future__ import annotations

import logging

import pytest

from broker_filter.proxy.sessions import BEGIN_HOLD, END_SETTLE, RECONNECT_FOR_ENDS, SESSION_IDLE, Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# Flags: "recycles" (RabbitMQ 4), "reconnect" (reconnect_for_ends on).  Steps, each checking the
# exact answer: ("at", t) moves the clock; ("end", s) or ("end", s, holding); ("begin", s, begins_now);
# ("take", idle session or None); ("answer", s, free_at or None); ("free", s, begin_waiting_now);
# ("begin_waiting", [sessions]); ("give_up", count); ("drop_waiting", s, bool); ("park", s, bool);
# ("drop_idle", s, bool); ("end_idle", [sessions]); ("hold_due", t); ("idle_due", t or None);
# ("abandoned_due", timeout, t or None); ("lost",); ("state", {field: value}) for the fields named
# (ended and idle as {session: time}, waiting as a list, holding, abandoned, unanswered).
SCENARIOS = {
    # ------------------------------------------------------------------ end, then begin
    "without an end a session begins at once": (set(), [
        ("begin", "x", True),
        ("state", {"ended": {}, "waiting": [], "unanswered": 0}),
    ]),
    "a begin after an end waits until the end is answered": (set(), [
        ("end", "a"),
        ("at", 0.2),
        ("begin", "x", False),
        ("hold_due", 1.0),
        ("state", {"ended": {"a": 0.0}, "waiting": ["x"]}),
        ("at", 0.5),
        ("answer", "a", None),  # RabbitMQ 3.10: the channel is free at the answer
        ("free", "a", True),
        ("begin_waiting", ["x"]),
        ("state", {"ended": {}, "waiting": [], "unanswered": 0}),
        ("begin", "y", True),
    ]),
    "sessions waiting begin in the order they asked": (set(), [
        ("end", "a"),
        ("begin", "x", False),
        ("begin", "y", False),
        ("begin", "z", False),
        ("answer", "a", None),
        ("free", "a", True),
        ("begin_waiting", ["x", "y", "z"]),
    ]),
    "one answer of two ends begins nothing": (set(), [
        ("end", "a"),
        ("at", 0.1),
        ("end", "b"),
        ("begin", "x", False),
        ("answer", "a", None),
        ("free", "a", False),
        ("state", {"ended": {"b": 0.1}, "waiting": ["x"]}),
        ("hold_due", 1.1),  # from the oldest end left
        ("answer", "b", None),
        ("free", "b", True),
        ("begin_waiting", ["x"]),
    ]),
    "an answer with nothing waiting begins nothing": (set(), [
        ("end", "a"),
        ("answer", "a", None),
        ("free", "a", False),
        ("state", {"ended": {}, "waiting": []}),
    ]),
    "BEGIN_HOLD after the oldest end the waiting begin; the stale end counted, the fresh one forgotten": (set(), [
        ("end", "a"),
        ("at", 0.5),
        ("end", "b"),
        ("at", 0.6),
        ("begin", "x", False),
        ("hold_due", 1.0),
        ("at", 1.0),
        ("begin_waiting", ["x"]),
        ("state", {"ended": {}, "waiting": [], "unanswered": 1}),
        ("begin", "y", True),
    ]),
    "a begin just before BEGIN_HOLD still waits": (set(), [
        ("end", "a"),
        ("at", 0.999),
        ("begin", "x", False),
        ("state", {"ended": {"a": 0.0}, "waiting": ["x"], "unanswered": 0}),
    ]),
    "a begin BEGIN_HOLD after an end gives up on it and begins at once": (set(), [
        ("end", "a"),
        ("at", 1.0),
        ("begin", "x", True),
        ("state", {"ended": {}, "waiting": [], "unanswered": 1}),
    ]),
    "a begin gives up on the stale ends only, and waits for the fresh one": (set(), [
        ("end", "a"),
        ("end", "b"),
        ("at", 0.5),
        ("end", "c"),
        ("at", 1.2),
        ("begin", "x", False),
        ("state", {"ended": {"c": 0.5}, "waiting": ["x"], "unanswered": 2}),
        ("hold_due", 1.5),
    ]),
    "ends given up on are counted once; a late answer is harmless": (set(), [
        ("end", "a"),
        ("end", "b"),
        ("at", 1.0),
        ("give_up", 2),
        ("give_up", 0),
        ("state", {"ended": {}, "unanswered": 2}),
        ("at", 3.0),
        ("answer", "a", None),
        ("free", "a", False),
        ("end", "c"),
        ("at", 4.5),
        ("give_up", 1),
        ("state", {"ended": {}, "unanswered": 3}),
    ]),
    "a waiting session dropped never begins": (set(), [
        ("end", "a"),
        ("begin", "x", False),
        ("begin", "y", False),
        ("drop_waiting", "x", True),
        ("drop_waiting", "x", False),
        ("drop_waiting", "never", False),
        ("state", {"waiting": ["y"]}),
        ("answer", "a", None),
        ("free", "a", True),
        ("begin_waiting", ["y"]),
    ]),
    "with the last waiting session dropped an answer begins nothing": (set(), [
        ("end", "a"),
        ("begin", "x", False),
        ("drop_waiting", "x", True),
        ("answer", "a", None),
        ("free", "a", False),
    ]),
    # ------------------------------------------------------------------ RabbitMQ 4: recycled sessions
    "RabbitMQ 4: an answered end keeps its channel END_SETTLE longer": ({"recycles"}, [
        ("end", "a"),
        ("at", 0.1),
        ("begin", "x", False),
        ("at", 0.3),
        ("answer", "a", 0.55),
        ("state", {"ended": {"a": 0.0}, "waiting": ["x"]}),
        ("at", 0.4),
        ("begin", "y", False),  # the answer is in, the channel not yet free
        ("at", 0.55),
        ("free", "a", True),
        ("begin_waiting", ["x", "y"]),
        ("state", {"ended": {}, "waiting": [], "unanswered": 0}),
    ]),
    "RabbitMQ 4: an end the proxy did not send (or gave up on) frees at once": ({"recycles"}, [
        ("answer", "z", None),
        ("end", "a"),
        ("at", 1.0),
        ("give_up", 1),
        ("answer", "a", None),
    ]),
    "RabbitMQ 4: idle sessions are reused most recent first": ({"recycles"}, [
        ("park", "a", True),
        ("at", 1.0),
        ("park", "b", True),
        ("at", 2.0),
        ("park", "c", True),
        ("park", "b", False),  # idle already: keeps its place and time
        ("state", {"idle": {"a": 0.0, "b": 1.0, "c": 2.0}}),
        ("take", "c"),
        ("take", "b"),
        ("park", "c", True),
        ("take", "c"),
        ("take", "a"),
        ("take", None),
        ("idle_due", None),
    ]),
    "RabbitMQ 4: an idle session ends after SESSION_IDLE, the oldest first": ({"recycles"}, [
        ("park", "a", True),
        ("idle_due", 30.0),
        ("at", 10.0),
        ("park", "b", True),
        ("idle_due", 30.0),
        ("at", 29.9),
        ("end_idle", []),
        ("at", 30.0),
        ("end_idle", ["a"]),
        ("state", {"idle": {"b": 10.0}, "ended": {"a": 30.0}}),
        ("idle_due", 40.0),
        ("at", 45.0),
        ("end_idle", ["b"]),
        ("idle_due", None),
        ("state", {"idle": {}, "ended": {"a": 30.0, "b": 45.0}}),
    ]),
    "RabbitMQ 4: sessions idle equally long end together": ({"recycles"}, [
        ("park", "a", True),
        ("park", "b", True),
        ("at", 30.0),
        ("end_idle", ["a", "b"]),
    ]),
    "RabbitMQ 4: a begin after an idle session's end waits for its answer and END_SETTLE": ({"recycles"}, [
        ("park", "s", True),
        ("at", 30.0),
        ("end_idle", ["s"]),
        ("at", 30.1),
        ("begin", "x", False),
        ("hold_due", 31.0),
        ("at", 30.2),
        ("answer", "s", 30.45),
        ("at", 30.45),
        ("free", "s", True),
        ("begin_waiting", ["x"]),
    ]),
    "RabbitMQ 4: an idle session is taken even while ends are unanswered": ({"recycles"}, [
        ("park", "s", True),
        ("end", "a"),
        ("take", "s"),
        ("state", {"waiting": [], "ended": {"a": 0.0}}),
        ("take", None),
        ("begin", "x", False),  # none idle: a new session waits
    ]),
    "RabbitMQ 4: the broker ending an idle session takes it out of reuse": ({"recycles"}, [
        ("park", "a", True),
        ("at", 5.0),
        ("park", "b", True),
        ("drop_idle", "a", True),
        ("drop_idle", "a", False),
        ("drop_idle", "never", False),
        ("idle_due", 35.0),
        ("state", {"idle": {"b": 5.0}, "ended": {}}),
        ("take", "b"),
        ("take", None),
    ]),
    "RabbitMQ 4: an idle session dropped before its time is not ended": ({"recycles"}, [
        ("park", "a", True),
        ("drop_idle", "a", True),
        ("at", 30.0),
        ("end_idle", []),
        ("state", {"ended": {}}),
    ]),
    # ------------------------------------------------------------------ connection loss
    "connection loss forgets every session; the count of unanswered ends stays": ({"recycles", "reconnect"}, [
        ("end", "a", 3),
        ("end", "b", 2),
        ("at", 0.5),
        ("end", "c"),
        ("park", "s", True),
        ("at", 1.0),
        ("give_up", 2),
        ("begin", "x", False),
        ("state", {"ended": {"c": 0.5}, "waiting": ["x"], "idle": {"s": 0.5}, "unanswered": 2,
                   "holding": {"a": 3, "b": 2}, "abandoned": {"a": 0.0, "b": 0.0}}),
        ("lost",),
        ("state", {"ended": {}, "waiting": [], "idle": {}, "holding": {}, "abandoned": {}, "unanswered": 2}),
        ("take", None),
        ("idle_due", None),
        ("abandoned_due", 5.0, None),
        ("begin", "y", True),
        ("end_idle", []),
    ]),
    # ------------------------------------------------------------------ what ended sessions held
    "what an ended session held is forgotten with its answer": (set(), [
        ("end", "a", 3),
        ("end", "b", 0),
        ("state", {"holding": {"a": 3}}),
        ("answer", "a", None),
        ("state", {"holding": {}, "abandoned": {}}),
    ]),
    "reconnect_for_ends off: nothing is abandoned": (set(), [
        ("end", "a", 3),
        ("at", 1.0),
        ("give_up", 1),
        ("state", {"abandoned": {}, "holding": {"a": 3}}),
        ("abandoned_due", 5.0, None),
    ]),
    "reconnect_for_ends: sessions given up on while holding are abandoned, due from the oldest end": ({"reconnect"}, [
        ("end", "a", 2),
        ("end", "b"),
        ("at", 0.5),
        ("end", "c", 1),
        ("at", 1.0),
        ("give_up", 2),
        ("state", {"abandoned": {"a": 0.0}, "ended": {"c": 0.5}}),  # b held nothing
        ("abandoned_due", 5.0, 5.0),
        ("begin", "x", False),
        ("at", 1.2),
        ("begin_waiting", ["x"]),  # c was forgotten fresh: abandoned, not counted
        ("state", {"abandoned": {"a": 0.0, "c": 0.5}, "unanswered": 2}),
        ("abandoned_due", 5.0, 5.0),
        ("answer", "a", None),
        ("state", {"abandoned": {"c": 0.5}, "holding": {"c": 1}}),
        ("abandoned_due", 5.0, 5.5),
        ("answer", "c", None),
        ("abandoned_due", 5.0, None),
    ]),
}


def _state(sessions: Sessions) -> dict:
    return {"ended": dict(sessions.ended), "waiting": list(sessions.waiting), "idle": dict(sessions.idle),
            "holding": dict(sessions.holding), "abandoned": dict(sessions.abandoned),
            "unanswered": sessions.unanswered_ends}


def _step(sessions: Sessions, clock: Clock, step: tuple) -> None:
    op, *args = step
    if op == "at":
        clock.now = args[0]
    elif op == "end":
        sessions.ending(*args)
    elif op == "lost":
        sessions.reset()
    elif op == "state":
        state = _state(sessions)
        assert {k: state[k] for k in args[0]} == args[0]
    elif op == "take":
        assert sessions.take_idle() == args[0]
    elif op == "hold_due":
        assert sessions.hold_due() == pytest.approx(args[0])
    elif op == "idle_due":
        due = sessions.idle_due()
        assert due == (None if args[0] is None else pytest.approx(args[0]))
    elif op == "abandoned_due":
        due = sessions.abandoned_due(args[0])
        assert due == (None if args[1] is None else pytest.approx(args[1]))
    elif op == "answer":
        free_at = sessions.answered(args[0])
        assert free_at == (None if args[1] is None else pytest.approx(args[1]))
    elif op in ("begin_waiting", "end_idle"):
        assert getattr(sessions, op)() == args[0]
    elif op == "give_up":
        assert sessions.give_up_ends() == args[0]
    else:
        method = {"begin": sessions.begin, "free": sessions.freed, "drop_waiting": sessions.drop_waiting,
                  "park": sessions.park, "drop_idle": sessions.drop_idle}[op]
        assert method(args[0]) is args[1]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name):
    flags, steps = SCENARIOS[name]
    clock = Clock()
    sessions = Sessions("test", clock, reconnect_for_ends="reconnect" in flags)
    sessions.recycles = "recycles" in flags
    for i, step in enumerate(steps):
        try:
            _step(sessions, clock, step)
        except AssertionError as e:
            raise AssertionError(f"step {i} {step!r}: {e}\nstate: {_state(sessions)}") from None


def test_the_constants_the_docs_name():
    """docs/proxy.md names these: 1 s, 30 s, 0.25 s, and no reconnect for unanswered ends."""
    assert (BEGIN_HOLD, SESSION_IDLE, END_SETTLE, RECONNECT_FOR_ENDS) == (1.0, 30.0, 0.25, False)
    assert Sessions().reconnect_for_ends is False and Sessions().recycles is False


def test_any_hashable_handle():
    """Handles are compared by equality and hashed: objects without either compare by identity."""
    clock = Clock()
    sessions = Sessions(clock=clock)
    sessions.recycles = True
    a, b = object(), object()
    sessions.park(a)
    sessions.park(b)
    assert sessions.take_idle() is b
    sessions.ending(b)
    assert sessions.begin(a) is False and sessions.waiting == [a]
    assert sessions.answered(b) == pytest.approx(END_SETTLE)


def test_giving_up_is_logged_as_the_docs_say(caplog):
    clock = Clock()
    sessions = Sessions("amqp://broker", clock)
    sessions.ending("a")
    sessions.ending("b")
    clock.now = 0.5
    sessions.ending("c")
    sessions.begin("x")
    clock.now = 1.0
    with caplog.at_level(logging.WARNING, logger="broker_filter.proxy.upstream"):
        assert sessions.begin_waiting() == ["x"]
    assert [r.getMessage() for r in caplog.records] == [
        "upstream amqp://broker: 2 ended session(s) unanswered after 1 s; giving up on them",
        "upstream amqp://broker: 1 ended session(s) unanswered; beginning 1 waiting session(s)",
    ]


# ---------------------------------------------------------------------- RemoteUpstream applies them
# The same decisions through `RemoteUpstream`, its engine objects and loop replaced by records.
from broker_filter.engine import endpoints as Endpoint  # noqa: E402  (LOCAL_*, REMOTE_* as the engine has them)
from broker_filter.proxy.remote import RemoteUpstream  # noqa: E402
from broker_filter.proxy.upstream import PublisherHandler, UpstreamListener  # noqa: E402

ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


class Timer:
    def __init__(self, loop: "Loop", delay: float, fn) -> None:
        self.delay, self.fn, self.cancelled = delay, fn, False
        loop.timers.append(self)

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def call_later(self, delay: float, fn) -> Timer:
        return Timer(self, delay, fn)

    def call_soon(self, fn) -> Timer:
        return Timer(self, 0.0, fn)

    def due(self) -> list[float]:
        return [round(t.delay, 6) for t in self.timers if not t.cancelled]


class _States:
    state = 0

    @property
    def local_state(self) -> int:
        return self.state & 0o7

    @property
    def remote_state(self) -> int:
        return self.state & 0o70


class Link(_States):
    def __init__(self, session: "Session", name: str) -> None:
        self.session, self.name, self.state, self.unsettled_count = session, name, Endpoint.LOCAL_UNINIT, 0
        self.context = None
        self.ptr = object()

    def open(self) -> None:
        self.state = Endpoint.LOCAL_ACTIVE | (self.state & 0o70)
        self.session.record.append(("attach", self.name))

    def close(self) -> None:
        self.state = Endpoint.LOCAL_CLOSED | (self.state & 0o70)
        self.session.record.append(("detach", self.name))


class Session(_States):
    def __init__(self, connection: "Connection", n: int) -> None:
        self.connection, self.n, self.record = connection, n, connection.record
        self.state = Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_UNINIT
        self.context = None

    def sender(self, name: str, **termini) -> Link:
        return Link(self, name)

    def open(self) -> None:
        self.state = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_UNINIT
        self.record.append(("begin", self.n))

    def close(self) -> None:
        self.state = Endpoint.LOCAL_CLOSED | (self.state & 0o70)
        self.record.append(("end", self.n))

    def free(self) -> None:
        self.record.append(("free", self.n))

    def __repr__(self) -> str:
        return f"session {self.n}"


class Connection(_States):
    def __init__(self) -> None:
        self.record: list[tuple] = []
        self.made: list[Session] = []
        self.state = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE

    def session(self) -> Session:
        self.made.append(Session(self, len(self.made)))
        return self.made[-1]

    def close(self) -> None:
        self.record.append(("close",))


class Handler(PublisherHandler):
    def __init__(self) -> None:
        self.closed: list = []

    def on_publisher_closed(self, publisher, error) -> None:
        self.closed.append(error.condition)


class Listener(UpstreamListener):
    def __init__(self) -> None:
        self.down = 0

    def on_upstream_down(self, upstream, error) -> None:
        self.down += 1


def _upstream(recycles: bool) -> tuple[RemoteUpstream, Connection, Loop, Clock]:
    up = RemoteUpstream("amqp://127.0.0.1:1")
    clock = Clock()
    up.sessions.clock = clock
    up.sessions.recycles = recycles
    up.loop, up.listener = Loop(), Listener()
    up.connection, up.connected = Connection(), True
    return up, up.connection, up.loop, clock


def _answer_begin(session: Session) -> None:
    session.state = (session.state & 0o7) | Endpoint.REMOTE_ACTIVE


def test_remote_upstream_begins_a_session_behind_an_end_when_its_answer_is_in():
    up, conn, loop, clock = _upstream(recycles=False)
    first = up.open_publisher("/queue/a", Handler())
    _answer_begin(first.session)
    first.close()
    assert conn.record == [("begin", 0), ("attach", "publisher-1"), ("detach", "publisher-1"), ("end", 0)]
    clock.now = 0.2
    second = up.open_publisher("/queue/b", Handler())
    assert conn.record[4:] == []  # neither its begin nor its attach goes out yet
    assert loop.due() == [up.answer_timeout, 0.8]  # the first attach's answer; the hold, BEGIN_HOLD after the end
    up._ended_answered(first.session)
    assert conn.record[4:] == [("begin", 1), ("attach", "publisher-2")]
    assert loop.due() == [up.answer_timeout, up.answer_timeout]  # the hold cancelled
    assert up.sessions.ended == {} and second.session is conn.made[1]


def test_remote_upstream_hold_timer_begins_the_waiting_and_counts_the_unanswered_end():
    up, conn, loop, clock = _upstream(recycles=False)
    first = up.open_publisher("/queue/a", Handler())
    _answer_begin(first.session)
    first.close()
    up.open_publisher("/queue/b", Handler())
    assert up._hold_timer.delay == 1.0
    clock.now = 1.0
    up._hold_timer.fn()
    assert conn.record[4:] == [("begin", 1), ("attach", "publisher-2")]
    assert up.unanswered_ends == 1 and up._hold_timer is None


def test_remote_upstream_rabbitmq4_parks_reuses_and_ends_idle_sessions():
    up, conn, loop, clock = _upstream(recycles=True)
    first = up.open_publisher("/queue/a", Handler())
    _answer_begin(first.session)
    first.close()
    assert conn.record == [("begin", 0), ("attach", "publisher-1"), ("detach", "publisher-1")]  # no end
    first.link.state |= Endpoint.REMOTE_CLOSED
    up._park(first.link.context.recycle)  # as on_link_close does once the detach is answered
    assert up.sessions.idle == {first.session: 0.0} and up._idle_timer.delay == 30.0
    clock.now = 5.0
    second = up.open_publisher("/queue/b", Handler())
    assert second.session is first.session and conn.record[3:] == [("attach", "publisher-2")]
    second.link.state |= Endpoint.REMOTE_CLOSED
    second.close()  # its detach answered already: parked at once
    assert up.sessions.idle == {first.session: 5.0}
    clock.now = 30.0
    up._idle_timer.fn()  # not yet 30 s idle: looked at again when it will be
    assert conn.record[-1] == ("detach", "publisher-2") and up._idle_timer.delay == 5.0
    clock.now = 35.0
    up._idle_timer.fn()
    assert conn.record[-1] == ("end", 0) and up.sessions.ended == {first.session: 35.0}
    assert up._idle_timer is None
    clock.now = 35.1
    up._ended_answered(first.session)
    assert loop.timers[-1].delay == pytest.approx(END_SETTLE)  # the channel free END_SETTLE after the answer
    assert up.sessions.ended == {first.session: 35.0}
    loop.timers[-1].fn()
    assert up.sessions.ended == {}


def test_remote_upstream_connection_loss_forgets_sessions_and_timers():
    up, conn, loop, clock = _upstream(recycles=True)
    first = up.open_publisher("/queue/a", Handler())
    _answer_begin(first.session)
    first.link.state |= Endpoint.REMOTE_CLOSED
    first.close()
    up.sessions.ending(conn.session())
    handler = Handler()
    up.open_publisher("/queue/b", Handler())  # takes the idle session
    up.open_publisher("/queue/c", handler)  # waits behind the end
    assert up.sessions.waiting and up._hold_timer is not None and up._idle_timer is not None
    hold, idle = up._hold_timer, up._idle_timer
    up._lost(None)
    assert (up.sessions.ended, up.sessions.waiting, up.sessions.idle) == ({}, [], {})
    assert hold.cancelled and idle.cancelled and up._hold_timer is None and up._idle_timer is None
    assert handler.closed == ["amqp:connection:forced"] and up.listener.down == 1
