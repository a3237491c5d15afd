"""The proxy's event loop (`EngineLoop`) on the daemon's engine loop (`EventLoop`, through
`EngineContainer`): when `call_soon` work runs, and `call_later`."""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time

from proton import Message
from proton.utils import BlockingConnection

from broker_filter.config import add_serve_arguments, load
from broker_filter.engine import Handler
from broker_filter.engine._cproton import lib
from broker_filter.engine.container import EngineContainer, listen
from broker_filter.proxy.loop import MAX_ROUNDS, EngineLoop


def test_a_chain_of_call_soon_work_runs_before_the_next_poll():
    container = EngineContainer()
    loop = EngineLoop(container)
    seen: list = []

    def link(i: int) -> None:
        seen.append(i)
        if i < 9:
            loop.call_soon(lambda: link(i + 1))
        else:
            container.stop()

    def begin() -> None:
        loop.call_later(0, lambda: seen.append("poll"))  # a zero-delay timer fires only after the next poll
        loop.call_soon(lambda: link(0))

    loop.call_later(0, begin)
    guard = loop.call_later(10, container.stop)
    container.run()
    guard.cancel()
    # A chain that produces no engine events does not wait for socket I/O between its links.
    assert seen[:10] == list(range(10)), seen


def test_what_a_round_queues_runs_in_the_next_round():
    container = EngineContainer()
    loop = EngineLoop(container)
    order: list = []

    def a() -> None:
        order.append(("a", loop.rounds))
        loop.call_soon(c)

    def b() -> None:
        order.append(("b", loop.rounds))

    def c() -> None:
        order.append(("c", loop.rounds))

    loop.call_soon(a)
    loop.call_soon(b)
    container.loop.after_turn()  # what the engine calls at the end of a turn
    assert order == [("a", 1), ("b", 1), ("c", 2)]
    container.loop.close()


def test_work_waits_for_the_engine_events_it_made():
    """A round that made engine events stops; the rest runs once the engine handled them."""
    container = EngineContainer()
    loop = EngineLoop(container)
    engine = container.loop
    ran: list = []

    def connect() -> None:
        engine.connection(Handler(), server=False)  # its init events wait in the collector
        loop.call_soon(lambda: ran.append("next"))

    loop.call_soon(connect)
    engine.after_turn()
    assert not engine.quiesced and ran == [] and loop.rounds == 1
    engine.process()
    engine.after_turn()
    assert ran == ["next"] and loop.rounds == 2
    engine.close()


def test_endless_work_yields_to_a_poll_after_max_rounds():
    """Work that always queues more runs MAX_ROUNDS rounds, then the loop polls: a readable socket is
    read before the next round, and that poll does not block."""
    container = EngineContainer()
    loop = EngineLoop(container)
    engine = container.loop
    ours, theirs = socket.socketpair()
    seen: list = []

    def spin() -> None:
        seen.append("round")
        if seen.count("io") < 2 and len(seen) < 10 * MAX_ROUNDS:
            loop.call_soon(spin)
        else:
            container.stop()

    def readable(mask: int) -> None:
        ours.recv(16)
        seen.append("io")
        theirs.send(b"x")  # readable again at the next poll

    def begin() -> None:
        engine.selector.register(ours, 1, readable)  # selectors.EVENT_READ
        theirs.send(b"x")
        loop.call_soon(spin)

    loop.call_later(0, begin)
    guard = loop.call_later(10, container.stop)
    started = time.perf_counter()
    container.run()
    elapsed = time.perf_counter() - started
    guard.cancel()
    ours.close()
    theirs.close()
    first, second = seen.index("io"), len(seen) - 1 - seen[::-1].index("io")
    assert first == MAX_ROUNDS, seen
    assert second - first - 1 == MAX_ROUNDS, seen
    assert elapsed < 1.0  # the polls in between did not block (the engine polls for up to 1 s)


def test_endless_work_arms_a_due_timer_for_the_poll():
    """In memory: after MAX_ROUNDS rounds the work waits, a zero-delay timer is due (the next poll
    returns at once), and the rounds go on once it fired."""
    container = EngineContainer()
    loop = EngineLoop(container)
    engine = container.loop
    spins = [0]

    def spin() -> None:
        spins[0] += 1
        if spins[0] < 10 * MAX_ROUNDS:  # (bounded: a loop without the limit would return at last)
            loop.call_soon(spin)

    loop.call_soon(spin)
    engine.after_turn()
    assert spins[0] == MAX_ROUNDS
    engine.after_turn()  # asked again in the same turn: the poll comes first
    assert spins[0] == MAX_ROUNDS
    assert engine.next_deadline() <= engine.clock()
    assert engine.run_timers() == 1
    engine.after_turn()
    assert spins[0] == 2 * MAX_ROUNDS
    engine.close()


def test_work_queued_by_events_after_the_engines_last_call_does_not_wait_for_a_blocking_poll():
    """Each round makes engine events, and handling them queues the next round's work: the engine
    asks for the work 16 times a turn, and what the last events queued runs after a poll that does
    not block."""
    container = EngineContainer()
    loop = EngineLoop(container)
    engine = container.loop
    made: list = []

    def connect() -> None:
        made.append(engine.connection(Handler(), server=False))

    def on_init(event) -> None:  # (the engine's own handling of the event a new connection makes)
        if len(made) < 100:
            loop.call_soon(connect)
        else:
            container.stop()

    engine._dispatch[lib.PN_CONNECTION_INIT] = on_init
    loop.call_later(0, lambda: loop.call_soon(connect))
    guard = loop.call_later(10, container.stop)
    started = time.perf_counter()
    container.run()
    elapsed = time.perf_counter() - started
    guard.cancel()
    assert len(made) == 100
    assert elapsed < 1.0  # 100 links at 16 a turn: each poll in between would otherwise wait 1 s


def test_work_queued_from_a_timer_does_not_wait_for_a_blocking_poll():
    """Queued while the loop has nothing else to do: it must run now, not after the poll's idle
    timeout (or the next timer)."""
    container = EngineContainer()
    loop = EngineLoop(container)
    times: dict = {}

    def queue() -> None:
        times["queued"] = time.perf_counter()
        loop.call_soon(ran)

    def ran() -> None:
        times["ran"] = time.perf_counter()
        container.stop()

    loop.call_later(0.05, queue)
    guard = loop.call_later(10, container.stop)
    container.run()
    guard.cancel()
    assert "ran" in times
    assert times["ran"] - times["queued"] < 0.5


def test_a_failing_callback_is_logged_and_the_loop_goes_on(caplog):
    container = EngineContainer()
    loop = EngineLoop(container)
    ran: list = []

    def broken() -> None:
        raise RuntimeError("broken callback")

    def broken_timer() -> None:
        raise RuntimeError("broken timer")

    def after() -> None:
        ran.append("after")
        loop.call_later(0, lambda: (ran.append("timer"), container.stop()))

    loop.call_soon(broken)
    loop.call_soon(after)
    loop.call_later(0, broken_timer)
    guard = loop.call_later(10, container.stop)
    with caplog.at_level(logging.ERROR):
        container.run()
    guard.cancel()
    assert ran == ["after", "timer"]
    failures = {str(r.exc_info[1]): r.getMessage() for r in caplog.records if r.exc_info}
    assert set(failures) == {"broken callback", "broken timer"}, failures
    assert all("failed" in message for message in failures.values()), failures


def test_call_later_runs_in_time_order_and_cancel_stops_a_timer():
    container = EngineContainer()
    loop = EngineLoop(container)
    order: list = []
    loop.call_later(0.06, lambda: order.append("c"))
    loop.call_later(0.02, lambda: order.append("a"))
    cancelled = loop.call_later(0.03, lambda: order.append("cancelled"))
    loop.call_later(0.04, lambda: order.append("b"))
    loop.call_later(0.08, container.stop)
    cancelled.cancel()
    started = time.perf_counter()
    container.run()
    assert order == ["a", "b", "c"]
    assert time.perf_counter() - started >= 0.08


def test_endless_call_soon_work_does_not_starve_sockets_or_timers():
    """Work that always queues more still lets the loop move bytes and fire timers."""
    container = EngineContainer()
    loop = EngineLoop(container)
    got = {"messages": 0, "rounds": 0, "timer": False}

    class Server(Handler):
        def on_link_open(self, link):
            link.copy_remote_target()
            link.open()
            link.flow(100)

        def on_message(self, delivery, data):
            got["messages"] += 1
            delivery.accept()
            if got["messages"] == 50:
                delivery.link.connection.close()

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    acceptor = listen(container, load(parser.parse_args(["--listen", "127.0.0.1:0"]), {}).listener, Server())
    client = threading.Thread(target=send_fifty, args=(f"127.0.0.1:{acceptor.port}",), daemon=True)
    client.start()

    started = time.monotonic()

    def spin() -> None:
        got["rounds"] += 1
        if (got["messages"] < 50 or not got["timer"]) and time.monotonic() - started < 20:
            loop.call_soon(spin)
        else:
            acceptor.close()
            container.stop()

    def timer() -> None:
        got["timer"] = True

    loop.call_soon(spin)
    loop.call_later(0.05, timer)
    guard = loop.call_later(20, container.stop)
    container.run()
    guard.cancel()
    assert got["messages"] == 50 and got["timer"], got
    assert got["rounds"] > MAX_ROUNDS  # it kept running while the bytes moved
    client.join(20)


def send_fifty(url: str) -> None:
    """A client in a thread of its own: 50 messages; the server closes the connection at the 50th."""
    connection = BlockingConnection(url, timeout=20)
    sender = connection.create_sender("inbox")
    try:
        for _ in range(50):
            sender.send(Message(body="x"), timeout=20)
        connection.close()
    except Exception:  # noqa: BLE001 - the server's close can overtake the last settlement; its count is checked
        pass
