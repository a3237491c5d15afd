"""A client's connection spliced to another server at the byte level.

Theory of operation.  A listener that keeps its connections' first input (`Limits.keep_first_input`)
lets a handler hand a fresh connection over to another AMQP server while it has answered nothing at
the AMQP layer yet (`EventLoop.splice`): the connection's proton endpoint ends without another byte
to the client, and a `Splice` takes its socket.  It connects to the target, logs in there (SASL, as
`SaslClientExchange`: the handler's credentials, not the client's, which this side checked), drops
the target's SASL answer, then sends the client's AMQP bytes as they came (its header, open, begin,
attach, and whatever followed) and from then on copies bytes both ways, nothing else: the target
answers the client's open, begin and attach itself and serves the connection from then on.

So the target ends the client's AMQP connection, as if the client had connected there; when either
socket closes, so does the other (the client sees its connection lost, and reconnects).  Nothing
is parsed after the login; a side that does not take what is sent to it stops the reading of the
other (a bound of `_HIGH` bytes waiting).  A target that cannot be reached, refuses the login or
does not answer it within `LOGIN_TIMEOUT` seconds closes the client's connection (it had been
answered nothing at the AMQP layer: its client sees a connection lost before its open was
answered, and reconnects).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from selectors import EVENT_READ, EVENT_WRITE
from typing import Any, Protocol

from ..security import SaslClientExchange

log = logging.getLogger("broker_filter.engine.splice")


class SpliceLoop(Protocol):
    """What a splice needs of the event loop that owns its sockets (`engine.loop.EventLoop`; this
    module is below it: the loop imports splices, never the other way)."""

    selector: Any
    splices: set

    def call_later(self, delay: float, fn: Any) -> Any: ...


class SpliceListener(Protocol):
    """The listener that accepted the client (`engine.loop.Listener`): its count of active connections."""

    active: int

LOGIN_TIMEOUT = 10.0  # seconds for the target to accept the connection and answer the login
_HIGH = 1 << 20  # bytes waiting for one side beyond which the other side is not read
_READ = 64 * 1024


class _Side:
    """One socket of a splice and what waits to be written to it."""

    __slots__ = ("sock", "out", "mask", "eof")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.out = bytearray()
        self.mask = 0
        self.eof = False  # it sent its last byte


class Splice:
    """The client socket `client` (its AMQP input so far: `replay`) spliced to `target`
    (HOST, PORT), logged in there with `login`."""

    def __init__(self, loop: SpliceLoop, client: socket.socket, replay: bytes, target: tuple[str, int],
                 login: SaslClientExchange, *, peer: str, listener: SpliceListener | None = None):
        self.loop = loop
        self.client = _Side(client)
        self.login = login
        self.replay = replay
        self.held = bytearray()  # what the client sends before the splice is made
        self.peer = peer
        self.target_name = f"{target[0]}:{target[1]}"
        self.listener = listener
        self.closed = False
        self.state = "connecting"  # -> "login" -> "spliced"
        self.timer: Any = None
        infos = socket.getaddrinfo(target[0], target[1], type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.target = _Side(sock)
        loop.splices.add(self)
        self.timer = loop.call_later(LOGIN_TIMEOUT, self._login_expired)
        result = sock.connect_ex(address)
        if result not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._end(f"cannot connect to {self.target_name}: {os.strerror(result)}")
            return
        self._watch()

    # --------------------------------------------------------------------------------------------

    def _set(self, side: _Side, mask: int) -> None:
        if mask == side.mask:
            return
        selector = self.loop.selector
        callback = self._on_client if side is self.client else self._on_target
        if not mask:
            selector.unregister(side.sock)
        elif not side.mask:
            selector.register(side.sock, mask, callback)
        else:
            selector.modify(side.sock, mask, callback)
        side.mask = mask

    def _watch(self) -> None:
        """Read a side while what it sent is not backing up; write a side while something waits for it."""
        if self.closed:
            return
        client, target = self.client, self.target
        reading = not client.eof and len(target.out) + len(self.held) < _HIGH
        self._set(client, (EVENT_READ if reading else 0) | (EVENT_WRITE if client.out else 0))
        if self.state == "connecting":
            self._set(target, EVENT_WRITE)
            return
        reading = not target.eof and len(client.out) < _HIGH
        self._set(target, (EVENT_READ if reading else 0) | (EVENT_WRITE if target.out else 0))

    def _pass(self, src: _Side, dst: _Side) -> bool:
        """The common case once spliced, in one go: what `src` has is read and all taken by `dst`
        at once, nothing waiting either way (no watch to change).  False: the general path."""
        if dst.out or src.out:
            return False
        try:
            data = src.sock.recv(_READ)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            self._end(f"{self._name(src)}: {e.strerror or e}")
            return True
        if not data:
            src.eof = True
            self._after()
            return True
        try:
            sent = dst.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._end(f"{self._name(dst)}: {e.strerror or e}")
            return True
        if sent < len(data):
            dst.out += memoryview(data)[sent:]
            self._watch()
        return True

    def _on_client(self, mask: int) -> None:
        if self.state == "spliced" and mask == EVENT_READ and self._pass(self.client, self.target):
            return
        if mask & EVENT_WRITE:
            self._write(self.client)
        if mask & EVENT_READ and not self.closed:
            data = self._read(self.client)
            if data and self.state == "spliced":
                self.target.out += data
                self._write(self.target)
            elif data:
                self.held += data
        self._after()

    def _on_target(self, mask: int) -> None:
        if self.state == "spliced" and mask == EVENT_READ and self._pass(self.target, self.client):
            return
        if self.state == "connecting":
            error = self.target.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                self._end(f"cannot connect to {self.target_name}: {os.strerror(error)}")
                return
            self.state = "login"
            self.target.out += self.login.data_to_send()
            self._write(self.target)
            self._watch()
            return
        if mask & EVENT_WRITE:
            self._write(self.target)
        if mask & EVENT_READ and not self.closed:
            data = self._read(self.target)
            if data and self.state == "login":
                self.login.receive(data)
                if self.login.failed:
                    self._end(f"{self.target_name} refused the login: {self.login.reason}")
                    return
                data = b""
                if self.login.done:
                    self._spliced()
                    data = self.login.leftover
            if data:
                self.client.out += data
                self._write(self.client)
        self._after()

    def _spliced(self) -> None:
        self.state = "spliced"
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # the client's AMQP bytes as they came, then what it sent meanwhile
        self.target.out += self.replay
        self.target.out += self.held
        self.replay, self.held = b"", bytearray()
        self._write(self.target)
        log.info("connection from %s spliced to %s", self.peer, self.target_name)

    def _after(self) -> None:
        if self.closed:
            return
        if self.state != "spliced":
            if self.client.eof:
                self._end("the client left before the splice was made")
            elif self.target.eof:
                self._end(f"{self.target_name} closed the connection during the login")
            else:
                self._watch()
            return
        for side, other in ((self.client, self.target), (self.target, self.client)):
            if side.eof and not other.out:
                self._end("")  # one side finished, and the other has had everything it sent
                return
        self._watch()

    def _read(self, side: _Side) -> bytes:
        try:
            data = side.sock.recv(_READ)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as e:
            self._end(f"{self._name(side)}: {e.strerror or e}")
            return b""
        if not data:
            side.eof = True
        return data

    def _write(self, side: _Side) -> None:
        if not side.out or self.closed:
            return
        try:
            sent = side.sock.send(side.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._end(f"{self._name(side)}: {e.strerror or e}")
            return
        del side.out[:sent]

    def _name(self, side: _Side) -> str:
        return f"the client {self.peer}" if side is self.client else self.target_name

    def _login_expired(self) -> None:
        self.timer = None
        if self.state != "spliced":
            self._end(f"{self.target_name} did not answer the login within {LOGIN_TIMEOUT:g} s")

    def _end(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        if reason:
            log.info("splice of the connection from %s to %s ends: %s", self.peer, self.target_name, reason)
        for side in (self.client, self.target):
            if side.mask:
                try:
                    self.loop.selector.unregister(side.sock)
                except (KeyError, ValueError):
                    pass
            side.mask = 0
            side.sock.close()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.loop.splices.discard(self)
        if self.listener is not None:
            self.listener.active -= 1

    def close(self) -> None:
        """End both connections now (the loop closes)."""
        self._end("the daemon stops")


def splice_target(text: str) -> tuple[str, int]:
    """(HOST, PORT) of `HOST:PORT` or `[V6]:PORT`."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


__all__ = ["LOGIN_TIMEOUT", "Splice", "splice_target"]
