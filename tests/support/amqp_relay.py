"""A fault injector for what a broker cannot be made to do on demand: a loopback TCP relay between the
daemon and a real broker that reads the daemon's AMQP frames and drops the begin or the attach of a
chosen link, so the broker never answers it.

Frames are read as AMQP 1.0 §2.3 lays them out: a 4-byte size, a data offset in 4-byte words, a type
and a channel; a performative's descriptor follows the header (begin 0x11, attach 0x12).  The protocol
headers (`AMQP\\x03…` for SASL, `AMQP\\x00…`) pass as they are, and so does every frame of any
other session.  A link is chosen by a marker (bytes its attach carries, e.g. its queue's name):

* `mode="attach"`: the attach carrying the marker and every later frame of its session are dropped
  (the session stays begun, its link is never answered);
* `mode="begin"`: a begin is held until the next frame of its channel; when that is an attach carrying
  the marker, the begin, the attach and every later frame of the session are dropped (the session
  is never answered), otherwise the held frames go on in order.

Dropping the daemon's frame rather than the broker's answer leaves nothing behind that the broker
would go on sending for the link (flow, transfers) on a channel or handle the daemon does not know.
"""

from __future__ import annotations

import socket
import struct
import threading

BEGIN, ATTACH = 0x11, 0x12


def _performative(frame: bytes) -> int | None:
    doff = frame[4]
    body = frame[doff * 4:]
    if len(body) < 3 or body[0] != 0:
        return None
    if body[1] == 0x53:
        return body[2]
    if body[1] == 0x80 and len(body) >= 10:
        return int.from_bytes(body[2:10], "big")
    return None


class Relay:
    """Listens on 127.0.0.1 (`port`), relays each connection to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int], marker: bytes = b"", mode: str = "attach"):
        assert mode in ("attach", "begin")
        self.upstream = upstream
        self.marker = marker
        self.mode = mode
        self.dropped = threading.Event()  # set once a chosen begin or attach was dropped
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        self.paused = False  # while set, new connections are closed at once (the broker unreachable)
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        for s in [self._server, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        """Break every connection relayed so far (both ends see it reset); new ones are relayed."""
        sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.paused:
                client.close()
                continue
            try:
                broker = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            self.connections += 1
            self._sockets += [client, broker]
            threading.Thread(target=self._inspect, args=(client, broker), daemon=True).start()
            threading.Thread(target=self._copy, args=(broker, client), daemon=True).start()

    def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        _shut(src, dst)

    def _inspect(self, src: socket.socket, dst: socket.socket) -> None:
        """The daemon's side: frame by frame, dropping the chosen link's."""
        buf = b""
        silent: set[int] = set()  # channels whose frames are dropped
        held: dict[int, list[bytes]] = {}  # channel -> a begin (and what followed) not sent yet
        try:
            while data := src.recv(65536):
                buf += data
                out = []
                while True:
                    if buf[:4] == b"AMQP":
                        if len(buf) < 8:
                            break
                        out.append(buf[:8])
                        buf = buf[8:]
                        continue
                    if len(buf) < 8:
                        break
                    size = struct.unpack(">I", buf[:4])[0]
                    if len(buf) < size:
                        break
                    frame, buf = buf[:size], buf[size:]
                    out.extend(self._frame(frame, silent, held))
                if out:
                    dst.sendall(b"".join(out))
        except OSError:
            pass
        _shut(src, dst)

    def _frame(self, frame: bytes, silent: set[int], held: dict[int, list[bytes]]) -> list[bytes]:
        if len(frame) <= 8 or frame[5] != 0:  # an empty frame (heartbeat) or a SASL frame
            return [frame]
        channel = struct.unpack(">H", frame[6:8])[0]
        if channel in silent:
            return []
        code = _performative(frame)
        if channel in held:
            pending = held.pop(channel) + [frame]
            if code == ATTACH and self.marker in frame:
                silent.add(channel)
                self.dropped.set()
                return []
            return pending
        if self.mode == "begin" and code == BEGIN and not self.dropped.is_set():
            held[channel] = [frame]
            return []
        if (self.mode == "attach" and code == ATTACH and self.marker and self.marker in frame
                and not self.dropped.is_set()):
            silent.add(channel)
            self.dropped.set()
            return []
        return [frame]


def _shut(*sockets: socket.socket) -> None:
    """Both directions of each socket ended (the other side's copy loop then ends too)."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
