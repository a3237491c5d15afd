"""Connection-level limits: the upstream heartbeat (idle time-out) and the largest client message."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from proton import Disposition, Message

from clients import bodies, connect, receive_n, receiver
from launcher import Daemon, InProcessDaemon


def _publish_raw(conn, snd, data: bytes, tag: str):
    conn.wait(lambda: snd.link.credit > 0, timeout=10)
    dlv = snd.link.delivery(tag)
    snd.link.send(data)
    snd.link.advance()
    conn.wait(lambda: dlv.remote_state != 0, timeout=20)
    return dlv


@pytest.mark.parametrize("body_size", [5_000, 300_000])  # one frame, and many frames
def test_a_message_over_the_size_limit_is_refused_and_not_stored(body_size):
    d = Daemon("--set", "limits.max_message_size=4096")
    conn = connect(d.url)
    try:
        snd = conn.create_sender("sized", name="producer")
        assert snd.link.remote_max_message_size == 4096  # advertised on the attach
        big = Message(body=b"x" * body_size).encode()
        dlv = _publish_raw(conn, snd, big, "big")
        assert dlv.remote_state == Disposition.REJECTED
        assert dlv.remote.condition.name == "amqp:resource-limit-exceeded"
        assert "4096" in dlv.remote.condition.description
        # The link and connection go on: a message within the limit is accepted and delivered alone.
        ok = _publish_raw(conn, snd, Message(body="small").encode(), "small")
        assert ok.remote_state == Disposition.ACCEPTED
        assert bodies(receive_n(receiver(conn, "sized"), 1)) == ["small"]
    finally:
        conn.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


class Relay:
    """A TCP relay between the front daemon and its upstream that can go silent without closing:
    a network partition, the one fault here that cannot be caused with the real parts alone."""

    def __init__(self, port: int):
        self.target = port
        self.silent = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                while self.silent.is_set():  # hold every byte: nothing gets through
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.silent.clear()
        self.server.close()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def test_a_silent_upstream_connection_is_detected_by_the_heartbeat():
    upstream = InProcessDaemon()
    relay = Relay(upstream.port)
    front = Daemon("--upstream", f"amqp://127.0.0.1:{relay.port}", "--set", "upstream.heartbeat=1",
                   "--set", "upstream.reconnect.initial_delay=30", ready="connected (")
    conn = connect(front.url)
    try:
        r = receiver(conn, "beats")
        relay.silent.set()
        t0 = time.monotonic()
        front.wait_for("connection lost", 10)
        waited = time.monotonic() - t0
        assert waited < 8, waited
        # the queue link stays attached, waiting for the upstream to come back (proxy/resume.py)
        assert r.link.state & r.link.REMOTE_ACTIVE
        assert "1 link(s) of beats wait for it" in front.log()
    finally:
        conn.close()
        front.stop()
        relay.close()
        upstream.stop()
