"""The proxy's event loop (`ProtonLoop`) on the daemon's engine loop (`EngineContainer`): when
`call_soon` work runs."""

from __future__ import annotations

import argparse
import threading
import time

from proton import Message
from proton.handlers import MessagingHandler
from proton.utils import BlockingConnection

from broker_filter.config import add_serve_arguments, load
from broker_filter.engine.container import EngineContainer, listen
from broker_filter.proxy.loop import MAX_ROUNDS, ProtonLoop


class _Marker:
    """A zero-delay timer: it fires only after the loop's next poll for sockets."""

    def __init__(self, seen: list):
        self.seen = seen

    def on_timer_task(self, event) -> None:
        self.seen.append("select")


def test_a_chain_of_call_soon_work_runs_before_the_next_select():
    container = EngineContainer()
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
    """Queued while the loop has nothing else to do: it must run now, not after the poll's idle
    timeout (or the next timer)."""
    container = EngineContainer()
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
    """Work that always queues more still lets the loop move bytes and fire timers."""
    container = EngineContainer()
    loop = ProtonLoop(container)
    got = {"messages": 0, "rounds": 0, "timer": False}

    class Server(MessagingHandler):
        def on_link_opening(self, event):
            event.link.target.copy(event.link.remote_target)
            event.link.open()
            event.link.flow(100)

        def on_message(self, event):
            got["messages"] += 1
            if got["messages"] == 50:
                event.connection.close()

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    acceptor = listen(container, load(parser.parse_args(["--listen", "127.0.0.1:0"]), {}).listener, Server())
    client = threading.Thread(target=send_fifty, args=(f"127.0.0.1:{acceptor.port}",), daemon=True)
    client.start()

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
