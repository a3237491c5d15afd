"""Two links with one name and role on one session (issue 28 item 4): the daemon attaches both, as
RabbitMQ 4 and Artemis do, instead of proton-c's transport closing the whole connection.

The client here is a raw AMQP client on a socket (frames built with broker_filter.amqp): it attaches
two receivers named alike on its one session, with different selectors, on the embedded broker and
on RabbitMQ 3.10 and 4.0 (`daemon` fixture).  Each gets exactly its selected messages, both attach
answers carry the client's own name, the connection stays open, and closing one link leaves the
other working.  (A python-qpid-proton client cannot do this itself: its own transport closes the
connection when the second answer names a link it has attached already, in front of RabbitMQ 4 as
in front of the daemon; `test_a_proton_client_is_answered_as_rabbitmq_4_answers_it` pins that the
daemon is no longer the one closing.)
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from proton import Message

from broker_filter.amqp import decode, encode
from broker_filter.amqp import types as t
from clients import connect, link_name

D, u = t.Described, t.ulong
SELECTOR = u(0x0000468C00000004)
HEADER = b"AMQP\x00\x01\x00\x00"
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)


def frame(code: int, fields: list, channel: int = 0) -> bytes:
    body = encode(D(u(code), fields))
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def receiver_attach(name: str, handle: int, address: str, selector: str) -> bytes:
    source = D(u(0x28), [address, t.uint(0), t.symbol("session-end"), t.uint(0), False, None, None,
                         {t.symbol("selector"): D(SELECTOR, selector)}])
    return frame(ATTACH, [name, t.uint(handle), True, None, None, source, D(u(0x29), [None])])


class RawClient:
    """One connection, one session (channel 0), frames in and out by hand."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.frames: list[tuple[int, list, bytes]] = []  # (code, fields, payload) received
        self.sock.sendall(HEADER + frame(OPEN, [f"raw-{uuid.uuid4().hex[:8]}"])
                          + frame(BEGIN, [None, t.uint(0), t.uint(5000), t.uint(5000)]))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def pump(self, seconds: float, until=None) -> None:
        """Read frames for `seconds`, or until `until()` is true; transfers are settled (accepted) as
        they come."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until is not None and until()):
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            self.buf += chunk
            self._parse()

    def _parse(self) -> None:
        if self.buf.startswith(b"AMQP"):
            self.buf = self.buf[8:]
        while len(self.buf) >= 8:
            size, doff = struct.unpack_from(">IB", self.buf)
            if len(self.buf) < size:
                return
            raw, self.buf = self.buf[:size], self.buf[size:]
            if size == 8:
                continue
            performative, end = decode(raw, doff * 4)
            code, fields = int(performative.descriptor), list(performative.value)
            self.frames.append((code, fields, raw[end:]))
            if code == TRANSFER and not (len(fields) > 4 and fields[4]):
                self.send(frame(DISPOSITION, [True, t.uint(int(fields[1])), None, True, D(u(0x24), [])]))

    def of(self, code: int) -> list[list]:
        return [f for c, f, _ in self.frames if c == code]

    def received(self, handle: int) -> list:
        out = []
        for c, f, payload in self.frames:
            if c == TRANSFER and int(f[0]) == handle:
                m = Message()
                m.decode(payload)
                out.append(m)
        return out

    def close(self) -> None:
        try:
            self.send(frame(CLOSE, []))
        finally:
            self.sock.close()


def _bodies(client: RawClient, handle: int) -> list:
    return [m.body for m in client.received(handle)]


def _publish(url: str, address: str, colours: list[str], start: int) -> None:
    c = connect(url)
    try:
        s = c.create_sender(address, name=link_name())
        for i, colour in enumerate(colours, start):
            s.send(Message(body=f"{colour}-{i}", properties={"colour": colour}))
    finally:
        c.close()


def _flow(handle: int, credit: int) -> bytes:
    return frame(FLOW, [t.uint(0), t.uint(5000), t.uint(0), t.uint(5000), t.uint(handle), t.uint(0), t.uint(credit)])


def test_two_receivers_named_alike_on_one_session_both_attach(daemon):
    address = daemon.forms[1].format(f"names-{uuid.uuid4().hex[:8]}")
    name = f"container-{uuid.uuid4().hex[:6]}-{address}"
    client = RawClient(daemon.port)
    try:
        client.send(receiver_attach(name, 0, address, "colour = 'red'"))
        client.pump(10.0, until=lambda: client.of(ATTACH) or client.of(CLOSE))
        client.send(receiver_attach(name, 1, address, "colour = 'blue'") + _flow(0, 20) + _flow(1, 20))
        client.pump(10.0, until=lambda: len(client.of(ATTACH)) >= 2 or client.of(CLOSE) or client.of(DETACH))
        answers = client.of(ATTACH)
        assert [a[0] for a in answers] == [name, name], answers  # the client's own name, twice
        assert not client.of(CLOSE), client.of(CLOSE)
        assert not client.of(DETACH), client.of(DETACH)
        ours = [int(a[1]) for a in answers]  # the daemon's handles; answer i is for our handle i

        _publish(daemon.url, address, ["red", "blue", "green", "blue", "red"], 0)
        client.pump(10.0, until=lambda: len(_bodies(client, ours[0])) >= 2 and len(_bodies(client, ours[1])) >= 2)
        client.pump(0.3)  # (and any that should not come)
        red, blue = _bodies(client, ours[0]), _bodies(client, ours[1])
        assert sorted(red) == ["red-0", "red-4"], (red, blue)
        assert sorted(blue) == ["blue-1", "blue-3"], (red, blue)
        assert not client.of(CLOSE)

        # closing the first leaves the second working
        client.send(frame(DETACH, [t.uint(0), True]))
        client.pump(10.0, until=lambda: client.of(DETACH))
        _publish(daemon.url, address, ["blue", "red", "blue"], 10)
        client.pump(10.0, until=lambda: len(_bodies(client, ours[1])) >= 4)
        client.pump(0.3)
        assert sorted(_bodies(client, ours[1])) == ["blue-1", "blue-10", "blue-12", "blue-3"]
        assert sorted(_bodies(client, ours[0])) == ["red-0", "red-4"]
        assert not client.of(CLOSE), client.of(CLOSE)
    finally:
        client.close()
    deadline = time.monotonic() + 5
    while "link name already attached on this session" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "link name already attached on this session: attached as" in daemon.log()


def test_a_proton_client_is_answered_as_rabbitmq_4_answers_it(daemon):
    """python-qpid-proton names both receivers `<container-id>-<address>`: the daemon attaches the
    second and answers it with the client's name, and then proton's own transport gives up on the
    name, exactly as in front of RabbitMQ 4 (before, the daemon closed the connection itself)."""
    address = daemon.forms[1].format(f"names-{uuid.uuid4().hex[:8]}")
    c = connect(daemon.url)
    try:
        c.create_receiver(address, credit=5)
        with pytest.raises(Exception) as failure:
            c.create_receiver(address, credit=5)
        # proton's own transport error ("disconnected"), not the daemon's close ("closed due to")
        assert "disconnected" in str(failure.value) and "link name already attached" in str(failure.value), \
            failure.value
    finally:
        try:
            c.close()
        except Exception:
            pass
