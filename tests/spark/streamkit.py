"""Helpers for the streaming tests: publishing numbered messages, waiting, reading the archive."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector
from proton.utils import BlockingConnection

from launcher import free_port

REGIONS = ("eu", "us", "asia")


def fresh(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def properties(i: int) -> dict:
    """The application properties of message i: a region and a total that selectors test."""
    return {"i": i, "region": REGIONS[i % 3], "total": (i * 37) % 250}


def publish(url: str, address: str, numbers) -> None:
    """Send message i (body "m<i>", properties(i)) for each i, each confirmed by the broker."""
    conn = BlockingConnection(url, timeout=20)
    try:
        snd = conn.create_sender(address)
        for i in numbers:
            snd.send(Message(body=f"m{i}", properties=properties(i), subject=f"s{i}"))
    finally:
        conn.close()


def wait_for(condition, limit: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")


def archived_numbers(archive) -> list[int]:
    """The `i` of every message in an archive directory, one entry per row (duplicates kept)."""
    from broker_filter.archive.parquet import read_messages

    return [int(m.application_properties["i"]) for _row, m in read_messages(archive)]


class Receiver(MessagingHandler):
    """Accepts messages on one address; rejects the message whose `i` is in `reject` (once each)."""

    def __init__(self, port: int, reject=()):
        super().__init__(prefetch=50, auto_accept=False)
        self.port = port
        self.reject_ids = set(reject)
        self.accepted: list[Message] = []
        self.addresses: list[str] = []
        self.injector = EventInjector()
        self.ready = threading.Event()
        self.connections = []

    def on_start(self, event):
        self.container = event.container
        event.container.selectable(self.injector)
        self.acceptor = event.container.listen(f"127.0.0.1:{self.port}")
        self.ready.set()

    def on_link_opening(self, event):
        if event.link.is_receiver:
            self.addresses.append(event.link.remote_target.address)
            event.link.target.address = event.link.remote_target.address

    def on_message(self, event):
        i = event.message.properties.get("i")
        if i in self.reject_ids:
            self.reject_ids.discard(i)
            self.reject(event.delivery)
        else:
            self.accepted.append(event.message)
            self.accept(event.delivery)

    def on_connection_opened(self, event):
        self.connections.append(event.connection)

    def on_stop(self, event):
        self.acceptor.close()
        self.injector.close()
        for conn in self.connections:
            conn.close()
        self.container.stop()


@contextlib.contextmanager
def receivers():
    """start(reject=()) -> a Receiver (a proton container on a free loopback port, in a thread); every
    receiver started is stopped on exit."""
    started = []

    def start(reject=()):
        r = Receiver(free_port(), reject)
        c = Container(r)
        t = threading.Thread(target=c.run, daemon=True)
        t.start()
        assert r.ready.wait(10)
        started.append((r, c, t))
        return r

    try:
        yield start
    finally:
        for r, _c, t in started:
            r.injector.trigger(ApplicationEvent("stop"))
            t.join(10)
            assert not t.is_alive()
