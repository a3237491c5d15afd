"""One event loop on `selectors` (epoll on Linux) that owns every socket, client and upstream.

Theory of operation.  `EventLoop` is an `Engine` (collector, pointer-keyed objects, timer heap)
plus sockets.  A turn: wait on epoll until a socket is ready, a timer is due or another thread
wakes the loop (`call_soon_threadsafe`); read what is ready and push it into the transports (through
TLS and, on a listener, the SASL exchange first); run due timers (heartbeat ticks, handshake
deadlines); drain the collector, dispatching to the handlers; then, per connection that has work,
one `pn_transport_pending`/`peek`/`pop` and a non-blocking send; last the `after_turn` callbacks
(`add_after_turn`: the proxy's `call_soon` work, `broker_filter.proxy.loop`), the events they make
handled the same way.  The poll does not block while a connection has output to encode, a
`call_soon_threadsafe` call waits, or a timer is due.  A socket is watched for writing only while
output waits, and no longer read once its transport takes no more input.

Limits refuse instead of dying: a listener's `max_connections` closes a connection at accept and
counts it; a connection that has not opened AMQP within `handshake_timeout` is closed and counted;
input a transport has not taken yet is bounded by `max_input` (the socket is not read until it
drains); epoll has no descriptor ceiling (the process's RLIMIT_NOFILE is the only one, and
running out of descriptors pauses accepting instead of failing).  A PLAIN login is checked off the
loop, through the listener's `logins.LoginGate` (a delay per source address after failures, a bounded
queue, a small pool of threads; a client that hangs up mid-check takes its check out of the queue).

    loop = EventLoop()
    listener = loop.listen("127.0.0.1", 0, handler, sasl=ServerSasl(("PLAIN",), verify=users.authenticate))
    upstream = loop.connect("127.0.0.1", 5672, other_handler, sasl=SaslClient("PLAIN", "guest", "guest"))
    loop.run()          # until loop.stop() (thread-safe)
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import selectors
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..security import Identity, SaslClientExchange
from ._cproton import ffi
from .endpoints import REMOTE_UNINIT, Condition, Connection, Engine, Handler, SaslClient, Timer
from .linknames import LinkNames
from .logins import REFUSED_FOR_NOW, LoginGate, LoginPolicy
from .streams import ServerSasl, TlsError, TlsStream

log = logging.getLogger("broker_filter.engine")

EVENT_READ, EVENT_WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_READ_SIZE = 64 * 1024
_ACCEPT_BATCH = 64
_CLOSE_WAIT = 5.0  # seconds a closed connection waits for the peer's close before its socket goes
_OUTPUT_HIGH = 1 << 20  # bytes waiting for the socket beyond which the transport is not asked for more
_SPLICE_HOLD = 0.01  # seconds a connection that may be spliced is answered nothing while no link is in
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(frozen=True)
class Limits:
    """Per-listener limits.  0 means none."""

    max_connections: int = 0
    handshake_timeout: float = 10.0  # seconds from accept to the peer's AMQP open
    max_input: int = 1 << 20  # bytes read but not yet taken by the transport, per connection
    idle_timeout: float = 0.0  # the AMQP idle time-out this side announces (heartbeats)
    max_frame: int = 0
    # bytes of a plain connection's AMQP input kept until this side first answers at the AMQP layer,
    # so that the connection can still be spliced to another server (`EventLoop.splice`)
    keep_first_input: int = 0


class Listener:
    """A listening socket of the loop: `port`, `active` connections, `refused` counts by reason,
    `logins` the gate its PLAIN checks pass (`logins.LoginGate`: throttle, bounded queue, pool)."""

    def __init__(self, loop: EventLoop, sock: socket.socket, handler: Handler, *, sasl: ServerSasl | None,
                 tls: ssl.SSLContext | None, limits: Limits, on_refused: Callable[[str, str], None] | None,
                 on_login_failure: Callable[[str], None] | None = None):
        self.loop = loop
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.handler = handler
        self.sasl = sasl
        self.tls = tls
        self.limits = limits
        self.on_refused = on_refused
        self.active = 0
        self.accepted = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self._paused = False
        self.logins: LoginGate | None = None
        if sasl is not None:
            self.logins = LoginGate(sasl.verify, loop, LoginPolicy.of(sasl.logins), remembered=sasl.remembered,
                                    on_failure=on_login_failure)
            loop.gates.append(self.logins)

    def refuse(self, reason: str, mechanism: str = "") -> None:
        """Count a refused connection (`on_refused(reason, SASL mechanism)` hears of it)."""
        self.refused[reason] += 1
        if self.on_refused is not None:
            self.on_refused(reason, mechanism)

    def on_ready(self, mask: int) -> None:
        loop = self.loop
        limits = self.limits
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _OUT_OF_DESCRIPTORS:
                    # The process is out of descriptors: count it, stop accepting for a moment
                    # (the listening socket would stay readable and spin the loop).
                    self.refuse("out-of-descriptors")
                    self._pause(0.1)
                else:
                    log.warning("accepting a connection failed: %s", e)
                return
            if limits.max_connections and self.active >= limits.max_connections:
                self.refuse("limit")
                sock.close()
                continue
            self.accepted += 1
            try:
                loop._adopt_server_socket(sock, self)
            except OSError as e:  # the peer already went (getpeername on a reset socket)
                log.debug("accepted connection lost at once: %s", e)
                sock.close()

    def _pause(self, delay: float) -> None:
        if self._paused or self.sock.fileno() < 0:
            return
        self._paused = True
        self.loop.selector.unregister(self.sock)

        def resume() -> None:
            self._paused = False
            if self.sock.fileno() >= 0:
                self.loop.selector.register(self.sock, EVENT_READ, self.on_ready)

        self.loop.call_later(delay, resume)

    def close(self) -> None:
        """Stop accepting (established connections go on)."""
        if self.sock.fileno() < 0:
            return
        if not self._paused:
            self.loop.selector.unregister(self.sock)
        self.sock.close()
        self.loop.listeners.discard(self)


class _Unborn:
    """The connection of an accepted socket that has not sent a byte yet."""

    ptr = None
    identity = None
    remote_state = REMOTE_UNINIT


_UNBORN = _Unborn()


class _Channel:
    """A socket and the connection it carries: TLS, the server's SASL stage, buffering, limits."""

    __slots__ = ("loop", "sock", "conn", "tls", "sasl", "credentials", "sasl_config", "listener", "inbuf",
                 "out", "mask", "connecting", "closed", "head_closed", "reading", "verifying", "ticket", "peer",
                 "max_input", "handshake_timer", "close_when_flushed", "names", "replay", "hold_until", "__weakref__")

    def __init__(self, loop: EventLoop, sock: socket.socket, conn: Connection | None, *, tls: TlsStream | None,
                 sasl_config: ServerSasl | None, listener: Listener | None, max_input: int, peer: str,
                 connecting: bool = False):
        self.loop = loop
        self.sock = sock
        # An accepted socket gets its proton connection with its first byte: a socket that never
        # sends one costs no transport buffers.
        self.conn: Any = _UNBORN if conn is None else conn
        self.tls = tls
        self.sasl: Any = None
        self.credentials: list = []
        self.sasl_config = sasl_config
        self.listener = listener
        self.inbuf = bytearray()
        self.out = bytearray()
        self.connecting = connecting
        self.closed = False
        self.head_closed = False
        self.reading = True
        self.verifying = False
        self.ticket: Any = None  # the PLAIN check under way (`logins.Ticket`)
        self.peer = peer
        self.max_input = max_input
        self.handshake_timer: Timer | None = None
        self.close_when_flushed = False
        self.names: LinkNames | None = None  # a server connection's link-name aliasing (linknames.py)
        # the AMQP input so far, while nothing has been answered at the AMQP layer (a splice's replay)
        keep = listener.limits.keep_first_input if listener is not None and tls is None else 0
        self.replay: bytearray | None = bytearray() if keep else None
        self.hold_until = 0.0  # while it may be spliced: no output before its first link, or this time
        self.mask = EVENT_WRITE if connecting else EVENT_READ
        if conn is not None:
            conn.io = self
        loop.channels.add(self)
        loop.selector.register(sock, self.mask, self.on_ready)
        if sasl_config is not None and tls is None:
            self._start_sasl(None)

    # --------------------------------------------------------------------------------------------
    # readiness

    def on_ready(self, mask: int) -> None:
        if self.connecting:
            self._connected()
            return
        if mask & EVENT_WRITE:
            self._write()
        if mask & EVENT_READ and not self.closed:
            self._read()

    def _watch(self) -> None:
        if self.closed:
            return
        mask = (EVENT_READ if self.reading else 0) | (EVENT_WRITE if self.out or self.connecting else 0)
        if mask == self.mask:
            return
        selector = self.loop.selector
        if not mask:
            selector.unregister(self.sock)
        elif not self.mask:
            selector.register(self.sock, mask, self.on_ready)
        else:
            selector.modify(self.sock, mask, self.on_ready)
        self.mask = mask

    def _connected(self) -> None:
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            self.fail(Condition("amqp:connection:forced", f"cannot connect to {self.peer}: {os.strerror(error)}"))
            return
        self.connecting = False
        if self.tls is not None:
            self._send_raw(self.tls.start())
        self._watch()
        self.loop.dirty.add(self.conn)

    def _read(self) -> None:
        loop = self.loop
        try:
            size = self.sock.recv_into(loop._rbuffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        if size == 0:
            self._eof()
            return
        if self.conn is _UNBORN:
            self._birth()
        if self.tls is None and self.sasl is None:
            self._feed(loop._crbuffer, size)
            return
        data: Any = loop._rview[:size]
        if self.tls is not None:
            try:
                data = self.tls.receive(data)
            except TlsError as e:
                if self.listener is not None:
                    self.listener.refuse("tls")
                log.info("TLS with %s failed: %s", self.peer, e)
                self.fail(Condition("amqp:connection:forced", f"TLS failed: {e}"))
                return
            self._send_raw(self.tls.take())
            if self.sasl_config is not None and self.sasl is None and self.tls.handshaken \
                    and self.conn.identity is None:
                self._start_sasl(self.tls.peer_certificate)
            if data:
                if self.sasl is not None:
                    self._sasl_receive(data)
                else:
                    self._feed(data, len(data))
            if self.tls.eof:
                self._eof()
            return
        self._sasl_receive(bytes(data))

    def _feed(self, data: Any, size: int) -> None:
        conn = self.conn
        if conn.ptr is None:
            return
        replay = self.replay
        if replay is not None:
            replay += self.loop._rview[:size] if isinstance(data, ffi.CData) else data
            if len(replay) > self.listener.limits.keep_first_input:
                self.replay = None
            elif not self.hold_until:
                # A client's open, begin and first attach may come in more than one read: nothing
                # is answered until its first link is in (or _SPLICE_HOLD has passed), so that the
                # connection can still be spliced when that link asks for it.
                loop = self.loop
                self.hold_until = loop.clock() + _SPLICE_HOLD
                loop.call_later(_SPLICE_HOLD, lambda: loop.dirty.add(conn))
        names = self.names
        if names is not None:
            # attaches whose name is attached already get an alias before proton sees them
            before = names.outbound
            renamed = names.incoming(self.loop._rview[:size] if isinstance(data, ffi.CData) else data)
            if renamed is not None:
                data, size = renamed, len(renamed)
            if before is None and names.outbound is not None:
                self._drain_output()  # the daemon's answer is rewritten from a frame boundary on
            if not size:
                return
        if self.inbuf:
            self.inbuf += ffi.buffer(data, size) if isinstance(data, ffi.CData) else data
            self._push_backlog()
            return
        taken = self.loop.push(conn, data, size)
        if taken < 0:
            self.reading = False  # the transport takes no more input
            self._watch()
        elif taken < size:
            rest = ffi.buffer(data, size)[taken:] if isinstance(data, ffi.CData) else bytes(data[taken:])
            self.inbuf += rest
            self._limit_input()

    def _push_backlog(self) -> None:
        taken = self.loop.push(self.conn, bytes(self.inbuf))
        if taken < 0:
            self.inbuf.clear()
            self.reading = False
        else:
            del self.inbuf[:taken]
        self._limit_input()

    def _limit_input(self) -> None:
        reading = len(self.inbuf) < self.max_input and self.reading_allowed()
        if reading != self.reading:
            self.reading = reading
            self._watch()

    def reading_allowed(self) -> bool:
        return not self.closed and self.conn.ptr is not None

    def _eof(self) -> None:
        self.reading = False
        self._watch()
        if self.sasl is not None or self.conn.ptr is None:
            self.close()  # gone before SASL finished: nothing to tell the transport
            return
        self.loop.close_input(self.conn)

    # --------------------------------------------------------------------------------------------
    # the server's SASL stage

    def _start_sasl(self, certificate: Any) -> None:
        assert self.sasl_config is not None
        self.sasl, self.credentials = self.sasl_config.exchange(certificate)

    def _sasl_receive(self, data: bytes) -> None:
        sasl = self.sasl
        sasl.receive(data)
        if sasl.pending and sasl.buffered >= self.max_input and self.reading:
            # its login check waits (perhaps throttled): no more of its input until it is decided
            self.reading = False
            self._watch()
        self._sasl_advance()

    def _sasl_advance(self) -> None:
        sasl = self.sasl
        out = sasl.data_to_send()
        if out:
            self._send_plain(out)
        listener = self.listener
        if sasl.pending:
            if not self.verifying:
                self.verifying = True
                user, password = self.credentials.pop()
                ticket = listener.logins.submit(self.peer.rpartition(":")[0], user, password, self._sasl_resolved,
                                                peer=self.peer)
                if self.verifying:  # (not decided at once)
                    self.ticket = ticket
            return
        if sasl.failed:
            outcome = sasl.outcome
            if listener is not None:
                if outcome.category in REFUSED_FOR_NOW:  # counted and logged by the gate
                    listener.refuse("login-busy", outcome.mechanism)
                else:
                    listener.logins.refused(outcome.category, {
                        "peer": self.peer, "mechanism": outcome.mechanism, "user": _shown(outcome.user),
                        "reason": outcome.reason, **({"subject": outcome.subject} if outcome.subject else {})})
                    listener.refuse("unauthorized", outcome.mechanism)
            self.sasl = None
            self.close_when_flushed = True
            self.reading = False
            self._watch()
            if not self.out:
                self.close()
            return
        if sasl.done:
            outcome = sasl.outcome
            self.sasl = None
            self.conn.identity = Identity(outcome.user, outcome.mechanism, outcome.password,
                                          self.tls is not None, self.peer, outcome.subject)
            if listener is not None:
                listener.logins.logged_in({"peer": self.peer, "mechanism": outcome.mechanism or "none",
                                           "user": _shown(outcome.user),
                                           **({"subject": outcome.subject} if outcome.subject else {})})
            if sasl.leftover:
                self._feed(sasl.leftover, len(sasl.leftover))
            self.loop.dirty.add(self.conn)

    def _sasl_resolved(self, result: str) -> None:
        self.verifying = False
        self.ticket = None
        if self.closed or self.sasl is None:
            return
        if not self.reading:
            self.reading = True  # (paused while the check waited: `_sasl_receive`)
            self._watch()
        if result == "ok":
            self.sasl.resolve(True)
        elif result in REFUSED_FOR_NOW:
            self.sasl.resolve(False, "too many logins wait for their check; try again later", temporary=True,
                              category=result)
        else:
            self.sasl.resolve(False, "wrong user name or password", category="wrong-credentials")
        self._sasl_advance()

    # --------------------------------------------------------------------------------------------
    # output

    def flush(self) -> None:
        """One pending/peek/pop of the transport, sent (through TLS) without blocking."""
        conn = self.conn
        if self.closed or self.connecting or self.sasl is not None or conn.ptr is None or self.head_closed:
            return
        if self.inbuf:
            self._push_backlog()
        if len(self.out) >= _OUTPUT_HIGH:
            return  # the socket is behind: proton keeps the rest until `_write` catches up
        if self.replay is not None and not any(s.links for s in conn.sessions) \
                and self.loop.clock() < self.hold_until:
            return  # (may still be spliced: see `_feed`)
        out = self.loop.take_output(conn)
        names = self.names
        if out is not None and names is not None and names.outbound is not None and len(out):
            renamed = names.outgoing(out)  # the client's own link names back in the answers
            if renamed is not None:
                out = renamed
            if not len(out):
                self.loop.dirty.add(conn)  # the rest of a held attach is still in proton
                return
            self._send_plain(out)
            self.loop.dirty.add(conn)
            return
        if out is None:
            if not self.head_closed:
                # Our last frame is out; the peer's close (or its end of stream) closes the transport
                # and then this socket (`transport_closed`).  A peer that never answers is dropped.
                self.head_closed = True
                self.loop.call_later(_CLOSE_WAIT, self.close)
            return
        if len(out):
            self._send_plain(out)
            # proton encodes as much as its output buffer holds: ask again (next round or turn)
            # until it has nothing more, or a large message would wait for the next event.
            self.loop.dirty.add(conn)

    def _drain_output(self) -> None:
        """Send everything proton has encoded so far, so its next output starts a frame."""
        conn = self.conn
        if self.closed or self.connecting or self.sasl is not None or conn.ptr is None or self.head_closed:
            return
        for _ in range(1000):
            out = self.loop.take_output(conn)
            if out is None or not len(out):
                return
            self._send_plain(bytes(out))

    def _send_plain(self, data: Any) -> None:
        if self.replay is not None and self.sasl is None:
            self.replay = None  # answered at the AMQP layer: no splice any more
        if self.tls is not None:
            try:
                data = self.tls.send(data)
            except TlsError as e:
                self.fail(Condition("amqp:connection:forced", f"TLS failed: {e}"))
                return
        self._send_raw(data)

    def _send_raw(self, data: Any) -> None:
        if not data or self.closed:
            return
        if self.out or self.connecting:
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._lost(e)
            return
        if sent < len(data):
            self.out += data[sent:]
            self._watch()

    def _write(self) -> None:
        if self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._lost(e)
                return
            del self.out[:sent]
            if len(self.out) < _OUTPUT_HIGH and self.conn.ptr is not None:
                self.loop.dirty.add(self.conn)
        if not self.out:
            if self.close_when_flushed:
                self.close()
                return
            self._watch()

    # --------------------------------------------------------------------------------------------
    # ending

    def _birth(self) -> None:
        """The first byte arrived on an accepted socket: its proton connection."""
        listener = self.listener
        assert listener is not None
        limits = listener.limits
        conn = self.loop.connection(listener.handler, server=True, idle_timeout=limits.idle_timeout,
                                    max_frame=limits.max_frame, name=self.peer)
        conn.io = self
        self.conn = conn
        self.names = LinkNames(conn)
        if listener.sasl is None:
            conn.identity = Identity("anonymous", "", None, self.tls is not None, self.peer)
        listener.handler.on_accepted(conn)

    def handshake_expired(self) -> None:
        self.handshake_timer = None
        conn = self.conn
        if self.closed or (conn is not _UNBORN and (conn.ptr is None or conn.remote_state != REMOTE_UNINIT)):
            return
        if self.listener is not None:
            self.listener.refuse("handshake-timeout")
        log.info("closing a connection that did not open AMQP in time", extra={"fields": {"peer": self.peer}})
        if self.ticket is not None:  # its login check waits still: not the client's doing
            ticket, self.ticket = self.ticket, None
            ticket.cancel(abandoned=False)
        self.fail(Condition("amqp:resource-limit-exceeded", "no AMQP open within the handshake time-out"))

    def _lost(self, error: OSError) -> None:
        self.fail(Condition("amqp:connection:forced", f"connection to {self.peer} failed: {error.strerror or error}"))

    def fail(self, error: Condition) -> None:
        """Drop the socket now; the connection's handler hears `error`."""
        if self.conn.ptr is not None:
            self.loop.abort(self.conn, error)
        self.close()

    def transport_closed(self) -> None:
        """The engine finished the connection: close once queued output is out."""
        self.close_when_flushed = True
        if not self.out or self.connecting:
            self.close()

    def hand_over(self) -> socket.socket:
        """Give the socket up unclosed (a splice takes it; the listener still counts it, until the
        splice ends) and end the connection's endpoint without another byte to the peer."""
        self._leave_loop()
        if self.conn.ptr is not None:
            self.loop.abort(self.conn, Condition("amqp:connection:redirect", "spliced to another server"))
        return self.sock

    def _leave_loop(self) -> None:
        self.closed = True
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
        if self.mask:
            try:
                self.loop.selector.unregister(self.sock)
            except (KeyError, ValueError):
                pass
        self.mask = 0
        self.loop.channels.discard(self)

    def close(self) -> None:
        if self.closed:
            return
        self._leave_loop()
        self.sock.close()
        if self.ticket is not None:  # hung up while its login is checked: abandoned
            ticket, self.ticket = self.ticket, None
            ticket.cancel(abandoned=not self.loop.closing)  # (not when the daemon stops)
        if self.listener is not None:
            self.listener.active -= 1
        if self.conn.ptr is not None:
            self.loop.abort(self.conn)


class EventLoop(Engine):
    """The engine with sockets: listeners, client connections, timers and a thread-safe wake-up."""

    def __init__(self, *, container_id: str | None = None):
        super().__init__(container_id=container_id)
        self.selector = selectors.DefaultSelector()
        self.channels: set[_Channel] = set()
        self.splices: set[Any] = set()  # client connections spliced to another server (engine.splice)
        self.listeners: set[Listener] = set()
        self._rbuffer = bytearray(_READ_SIZE)
        self._crbuffer = ffi.from_buffer(self._rbuffer)
        self._rview = memoryview(self._rbuffer)
        self._calls: collections.deque = collections.deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self.selector.register(self._wake_read, EVENT_READ, self._on_wake)
        self._stopping = False
        self.gates: list[LoginGate] = []  # the listeners' login gates (their threads end with the loop)
        self.closing = False  # `close()` under way
        self.thread: threading.Thread | None = None
        self.after_turn: Callable[[], None] | None = None  # runs once the turn's events are handled (`add_after_turn`)
        self.reuse_port = False  # listeners share their port with other processes' (SO_REUSEPORT)

    # --------------------------------------------------------------------------------------------
    # thread-safe entry points

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on the loop's thread, soon (from any thread)."""
        self._calls.append((callback, args))
        try:
            os.write(self._wake_write, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the loop will wake anyway) or closed (the loop is gone)

    def add_after_turn(self, callback: Callable[[], None]) -> None:
        """Run `callback` at the end of every turn too, after the turn's events are handled (after
        the callbacks added before it).  Events it makes are handled, then it is asked again, up to
        16 times a turn; if the last of those still handled events, the next poll does not block."""
        previous = self.after_turn
        if previous is None:
            self.after_turn = callback
            return

        def both() -> None:
            previous()
            callback()

        self.after_turn = both

    def stop(self) -> None:
        """Make `run()` return after the current turn (from any thread)."""
        self._stopping = True
        self.call_soon_threadsafe(lambda: None)

    def _on_wake(self, mask: int) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    # --------------------------------------------------------------------------------------------
    # sockets

    def listen(self, host: str, port: int, handler: Handler, *, sasl: ServerSasl | None = None,
               tls: ssl.SSLContext | None = None, limits: Limits = Limits(),
               on_refused: Callable[[str, str], None] | None = None, reuse_port: bool = False,
               on_login_failure: Callable[[str], None] | None = None) -> Listener:
        """Serve AMQP on host:port (0: any free port).  `sasl` None: clients speak AMQP without
        SASL; `tls`: an `ssl.SSLContext` for the server side.  `on_login_failure(reason)` counts
        failed, refused and abandoned logins (`logins.LoginGate`)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=4096,
                                    reuse_port=reuse_port or self.reuse_port)
        sock.setblocking(False)
        listener = Listener(self, sock, handler, sasl=sasl, tls=tls, limits=limits, on_refused=on_refused,
                            on_login_failure=on_login_failure)
        self.selector.register(sock, EVENT_READ, listener.on_ready)
        self.listeners.add(listener)
        return listener

    def _adopt_server_socket(self, sock: socket.socket, listener: Listener) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host, port = sock.getpeername()[:2]
        limits = listener.limits
        tls = TlsStream(listener.tls, server_side=True) if listener.tls is not None else None
        listener.active += 1
        channel = _Channel(self, sock, None, tls=tls, sasl_config=listener.sasl, listener=listener,
                           max_input=limits.max_input, peer=f"{host}:{port}")
        if limits.handshake_timeout:
            channel.handshake_timer = self.call_later(limits.handshake_timeout, channel.handshake_expired)

    def spliceable(self, connection: Connection) -> bool:
        """Whether `connection` can still be spliced to another server (`splice`): a plain client
        connection of a listener that keeps the first input, answered nothing yet at the AMQP layer."""
        channel = connection.io
        return isinstance(channel, _Channel) and channel.replay is not None and not channel.closed

    def splice(self, connection: Connection, target: tuple[str, int], login: SaslClientExchange) -> bool:
        """Hand `connection`'s socket to a `Splice` to `target` (HOST, PORT), logged in to with
        `login`: its endpoint ends here without another byte to the client (its handler hears it
        disconnected, as for any lost connection), and the target answers the client's AMQP bytes,
        all of them from its header on.  False (nothing done) if it is not `spliceable`."""
        from .splice import Splice

        if not self.spliceable(connection):
            return False
        channel: _Channel = connection.io
        replay = bytes(channel.replay or b"")
        sock = channel.hand_over()
        Splice(self, sock, replay, target, login, peer=channel.peer, listener=channel.listener)
        return True

    def connect(self, host: str, port: int, handler: Handler, *, sasl: SaslClient | None = None,
                tls: ssl.SSLContext | None = None, server_hostname: str | None = None,
                idle_timeout: float = 0.0, max_input: int = 1 << 20, name: str = "") -> Connection:
        """A client connection to host:port (non-blocking; the handler hears `on_disconnected` with
        the reason if it cannot be made).  Open it (`connection.open(...)`) and add links at once:
        they go out when the socket connects."""
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self.connection(handler, server=False, sasl=sasl, idle_timeout=idle_timeout,
                               name=name or f"{host}:{port}")
        stream = TlsStream(tls, server_side=False, server_hostname=server_hostname or host) if tls else None
        result = sock.connect_ex(address)
        channel = _Channel(self, sock, conn, tls=stream, sasl_config=None, listener=None, max_input=max_input,
                           peer=f"{host}:{port}", connecting=True)
        if result not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            channel.fail(Condition("amqp:connection:forced", f"cannot connect to {host}:{port}: {os.strerror(result)}"))
        return conn

    # --------------------------------------------------------------------------------------------
    # running

    def run(self, *, poll: float = 1.0) -> None:
        """Run turns until `stop()`."""
        self.thread = threading.current_thread()
        self._stopping = False
        while not self._stopping:
            self.run_once(poll)

    def run_once(self, timeout: float = 1.0) -> None:
        """One turn: wait (at most `timeout` s), read, timers, dispatch, write."""
        if self.dirty or self._calls:
            wait = 0.0
        else:
            wait = timeout
            deadline = self.next_deadline()
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - self.clock()))
        for key, mask in self.selector.select(wait):
            try:
                key.data(mask)
            except Exception:  # noqa: BLE001 - one broken connection must not stop the loop
                log.exception("handling socket readiness failed")
                owner = getattr(key.data, "__self__", None)
                if isinstance(owner, _Channel):
                    owner.fail(Condition("amqp:internal-error", "the connection's input could not be handled"))
        calls = self._calls
        for _ in range(len(calls)):
            callback, args = calls.popleft()
            try:
                callback(*args)
            except Exception:  # noqa: BLE001 - one failing callback must not stop the loop
                log.exception("callback %r failed", callback)
        self.run_timers()
        self._settle()
        after_turn = self.after_turn
        if after_turn is not None:
            for _ in range(16):  # what it does may make events; handle them, then ask it again
                after_turn()
                if not self._settle():
                    break
            else:  # the last events handled may have given it work: ask again after a poll that does not block
                calls.append((_nothing, ()))

    def _settle(self) -> int:
        """Dispatch events and write output until quiet (bounded); how many events there were."""
        events = 0
        for _ in range(4):
            events += self.process()
            if not self.dirty:
                break
            dirty, self.dirty = self.dirty, set()
            for conn in dirty:
                if conn.io is not None:
                    conn.io.flush()
        return events

    def close(self) -> None:
        """Close every listener and socket, then free proton's memory (on the loop's thread, after
        `run()` returned)."""
        self.closing = True
        for listener in list(self.listeners):
            listener.close()
        for channel in list(self.channels):
            channel.close()
        for splice in list(self.splices):
            splice.close()
        self.process()
        for conn in list(self.connections.values()):
            self.finish(conn)
        self.release()
        self.selector.close()
        os.close(self._wake_read)
        # -1 before the close: a signal handler's `call_soon_threadsafe` from now on writes to no
        # descriptor (not to one the number was reused for)
        wake_write, self._wake_write = self._wake_write, -1
        os.close(wake_write)
        for gate in self.gates:
            gate.close()


def _nothing() -> None:
    pass


def _shown(user: str | None) -> str | None:
    """A client's user name as logged: at most 100 characters (a SASL frame may carry 64 KiB)."""
    return user if user is None or len(user) <= 100 else user[:100] + "..."

