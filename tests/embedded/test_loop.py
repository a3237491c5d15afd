"""The proxy's event loop (`ProtonLoop`) on a real proton Container: when `call_soon` work runs."""

from __future__ import annotations

import time

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from broker_filter.proxy.loop import MAX_ROUNDS, ProtonLoop


class _Marker:
    """A zero-delay Container timer: it fires only after the Container's next `select`."""

    def __init__(self, seen: list):
        self.seen = seen

    def on_timer_task(self, event) -> None:
        self.seen.append("select")


def test_a_chain_of_call_soon_work_runs_before_the_next_select():
    container = Container()
    loop = ProtonLoop(container)
    seen: list = []

    def link(i: int) -> None:
        seen.append(i)
        if i < 9:
            loop.call_soon(lambda: link(i + 1))
        else:
            container.stop()

    def begin() -> None:
        container.schedule(0, _Marker(seen))
        loop.call_soon(lambda: link(0))

    loop.call_later(0, begin)
    container.run()
    # A chain that produces no engine events does not wait for socket I/O between its links.
    assert seen[:10] == list(range(10)), seen


def test_work_queued_from_a_handler_does_not_wait_for_a_blocking_select():
    """Queued while the Container has nothing else to do: it must run now, not after select's
    3.14 s idle timeout (or the next timer)."""
    container = Container()
    loop = ProtonLoop(container)
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
    assert times["ran"] - times["queued"] < 1.0


def test_endless_call_soon_work_does_not_starve_sockets_or_timers():
    """Work that always queues more still lets proton move bytes and fire timers."""
    container = Container()
    loop = ProtonLoop(container)
    got = {"messages": 0, "rounds": 0, "timer": False}

    class Server(MessagingHandler):
        def on_message(self, event):
            got["messages"] += 1
            if got["messages"] == 50:
                event.connection.close()

    class Client(MessagingHandler):
        def __init__(self, url):
            super().__init__()
            self.url = url
            self.sent = 0

        def on_start(self, event):
            event.container.create_sender(self.url)

        def on_sendable(self, event):
            while event.sender.credit and self.sent < 50:
                event.sender.send(Message(body="x"))
                self.sent += 1

    acceptor = container.acceptor("127.0.0.1", 0, Server())
    port = acceptor._selectable._delegate.getsockname()[1]
    container.handler.add(Client(f"127.0.0.1:{port}"))

    def spin() -> None:
        got["rounds"] += 1
        if got["messages"] < 50 or not got["timer"]:
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
