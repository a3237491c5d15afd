"""`limits.idle_timeout`: the daemon announces it in its open frame, and closes a client connection
that stays silent past it (no heartbeat either), freeing its place; a client that sends heartbeats
(proton does, at half the announced time-out) stays connected."""

from __future__ import annotations

import socket
import struct
import time

from proton import Message, Timeout

from broker_filter.amqp import decode, encode
from broker_filter.amqp import types as t
from clients import connect
from launcher import Daemon

HEADER = b"AMQP\x00\x01\x00\x00"
OPEN = 0x10


def frame(payload: bytes) -> bytes:
    return struct.pack(">IBBH", 8 + len(payload), 2, 0, 0) + payload


def read_frames(sock: socket.socket, deadline: float) -> tuple[list, bool]:
    """(performatives and their fields, closed by the daemon) read until the socket closes or `deadline`."""
    data = b""
    closed = False
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            closed = True
            break
        data += chunk
    out, pos = [], 8
    while pos + 8 <= len(data):
        size, doff = struct.unpack_from(">IB", data, pos)
        body = data[pos + doff * 4: pos + size]
        out.append(body)
        pos += size
    return out, closed


def test_a_silent_client_is_closed_after_the_announced_idle_timeout():
    d = Daemon("--set", "limits.idle_timeout=1.5")
    sock = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        sock.sendall(HEADER + frame(encode(t.Described(t.ulong(OPEN), ["silent-client"]))))
        frames, closed = read_frames(sock, time.monotonic() + 15)  # then silence: no heartbeat
        assert closed, "the daemon kept a silent connection"
        opened = decode(frames[0])[0]
        assert opened.descriptor == OPEN
        assert opened.value[4] == 750  # idle-time-out, ms: half the setting (clients heartbeat within it)
        closes = [decode(f)[0] for f in frames[1:] if f[:3] == b"\x00\x53\x18"]
        assert closes and "idle" in str(closes[0].value), closes
        healthy = connect(d.url)  # a client that heartbeats stays connected past the time-out
        try:
            try:
                healthy.wait(lambda: False, timeout=4)  # (processing its events: it heartbeats)
            except Timeout:
                pass
            healthy.create_sender("q").send(Message(body="still connected"))
        finally:
            healthy.close()
    finally:
        sock.close()
        d.stop()
    assert "Traceback" not in d.log()
