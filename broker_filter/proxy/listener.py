"""The client listener: TLS and SASL in front of proton's AMQP engine.

Theory of operation.  Proton's built-in SASL verifies only ANONYMOUS and EXTERNAL on the server
side, and proton's TLS layer keeps the cleartext to itself, so PLAIN users and pass-through
credentials cannot be checked inside proton.  When the configuration needs them, a front end
accepts client connections on its own asyncio thread, runs TLS (Python's `ssl`) and the SASL
exchange (`security.SaslServer`), and only then hands the connection to the proton Container
through one end of a socket pair, copying bytes both ways (without TLS the client's own socket is
handed over, so no byte is copied).  The Container adopts that socket as its own acceptor would,
with a server Transport without a SASL layer, and the Connection carries the client's `Identity`
(`identity_of(connection)`).  When only ANONYMOUS is needed, proton's own
acceptor serves the listener (with proton TLS when configured) and no bytes are copied.

Wrong credentials end the exchange with the SASL outcome `auth`, which clients report as
`amqp:unauthorized-access`.  Passwords live only in the `Identity` of a pass-through connection
(the daemon needs them to open that client's upstream connection) and are never logged.

    listening = listen(container, config.listener, handler, passthrough=verify_upstream_login)
    listening.port; listening.close()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from ..security import (  # noqa: F401 - Identity, ANONYMOUS, IDENTITY_ATTRIBUTE, server_ssl_context: re-exported
    ANONYMOUS,
    IDENTITY_ATTRIBUTE,
    Identity,
    SaslServer,
    UserDatabase,
    certificate_subject,
    server_ssl_context,
)

log = logging.getLogger("broker_filter.listener")

_CHUNK = 64 * 1024


def identity_of(connection: Any) -> Identity:
    """The Identity a listener attached to a proton Connection (ANONYMOUS for proton's own acceptor)."""
    try:
        return getattr(connection, IDENTITY_ATTRIBUTE)
    except AttributeError:
        return ANONYMOUS


# --------------------------------------------------------------------------------------------------
# TLS contexts from the configuration


def proton_server_ssl_domain(tls: Any) -> Any:
    """A proton `SSLDomain` for `[listener.tls]` (proton's own acceptor)."""
    from proton import SSLDomain

    domain = SSLDomain(SSLDomain.MODE_SERVER)
    domain.set_credentials(tls.cert_file, tls.key_file, tls.key_password or None)
    if tls.ca_file:
        domain.set_trusted_ca_db(tls.ca_file)
    if tls.verify_client:
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER, tls.ca_file)
    else:
        domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
    return domain


def proton_client_ssl_domain(tls: Any) -> Any:
    """The proton `SSLDomain` for `[upstream.tls]`: amqps:// upstream connections and pass-through logins."""
    from proton import SSLDomain

    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    if tls.ca_file:
        domain.set_trusted_ca_db(tls.ca_file)
    if tls.cert_file:  # no key_file: the key is in cert_file
        domain.set_credentials(tls.cert_file, tls.key_file or None, tls.key_password or None)
    mode = {"peer-name": SSLDomain.VERIFY_PEER_NAME, "peer": SSLDomain.VERIFY_PEER, "none": SSLDomain.ANONYMOUS_PEER}
    domain.set_peer_authentication(mode[tls.verify], tls.ca_file or None)
    return domain


def upstream_login(urls: tuple[str, ...] | list[str], tls: Any = None, *,
                   timeout: float = 10.0) -> Callable[[str, str], bool]:
    """A pass-through check for `listen(passthrough=...)`: do `user` / `password` open a connection to
    the upstream broker?  URLs are tried in order (failover): True on the first that opens, False as
    soon as one refuses the credentials (`amqp:unauthorized-access`) or when none can be reached.
    Blocking; the front end runs it on a worker thread."""
    from urllib.parse import urlsplit, urlunsplit

    targets = []
    for url in urls:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        targets.append((urlunsplit(parts._replace(netloc=netloc)), parts.scheme == "amqps"))

    def check(user: str, password: str) -> bool:
        from proton import ConnectionException
        from proton.utils import BlockingConnection

        for url, secure in targets:
            kwargs: dict[str, Any] = {"user": user, "password": password, "allowed_mechs": "PLAIN"}
            if secure and tls is not None:
                kwargs["ssl_domain"] = proton_client_ssl_domain(tls)
            try:
                connection = BlockingConnection(url, timeout=timeout, **kwargs)
            except ConnectionException as e:
                if "unauthorized-access" in str(e):
                    return False
                log.warning("pass-through check: upstream %s failed: %s", url, type(e).__name__)
                continue
            except Exception as e:  # noqa: BLE001 - an unreachable upstream: try the next one
                log.warning("pass-through check: upstream %s failed: %s", url, type(e).__name__)
                continue
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - the login already succeeded
                pass
            return True
        return False

    return check


# --------------------------------------------------------------------------------------------------
# The Container side: adopting sockets whose SASL exchange is done


class WakePipe:
    """The wake-up pipe an Adopter's selectable watches; proton closes it with the selectable."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe()
        os.set_blocking(self.read, False)
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self.read

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                os.write(self.write, b"!")

    def drain(self) -> None:
        try:
            os.read(self.read, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.read)
                os.close(self.write)


class Adopter:
    """Hands sockets to a proton Container from any thread (a selectable on a pipe, like proton's
    EventInjector).  `adopt()` is thread-safe; the Connection is created on the Container's thread."""

    def __init__(self, container: Any, handler: Any):
        self._container = container
        self._handler = handler
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pipe = WakePipe()
        self._closed = False
        selectable = container.selectable(handler=self, delegate=self._pipe)
        selectable._transport = None  # proton's IOHandler looks at every selectable's transport

    def adopt(self, sock: socket.socket, identity: Identity, leftover: bytes = b"") -> None:
        """Serve `sock` on the Container; `leftover`: bytes already read from it after SASL."""
        if self._closed:
            sock.close()
            return
        self._queue.put((sock, identity, leftover))
        self._pipe.wake()

    def close(self) -> None:
        """Stop adopting (thread-safe); the pipe closes once the Container has let go of it."""
        self._closed = True
        self._pipe.wake()

    # proton selectable callbacks (Container thread)

    def on_selectable_init(self, event: Any) -> None:
        selectable = event.context
        selectable.reading = True
        selectable.update()

    def on_selectable_readable(self, event: Any) -> None:
        self._pipe.drain()
        while True:
            try:
                sock, identity, leftover = self._queue.get_nowait()
            except queue.Empty:
                break
            if self._closed:
                sock.close()
                continue
            try:
                self._adopt(sock, identity, leftover)
            except Exception:  # noqa: BLE001 - one bad socket must not stop the container
                log.exception("adopting a client connection failed")
                sock.close()
        if self._closed:
            selectable = event.context
            selectable.terminate()
            selectable.update()

    def _adopt(self, sock: socket.socket, identity: Identity, leftover: bytes) -> None:
        from proton import Transport, Url
        from proton._handlers import IOHandler

        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # As proton's own acceptor does: no Nagle delay on small frames (dispositions, flow).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        container = self._container
        connection = container.connection(self._handler)
        connection._acceptor = self  # tells proton's IOHandler the socket already exists
        host, _, port = identity.peer.rpartition(":")
        connection.url = Url(host=host or "127.0.0.1", port=int(port) if port.isdigit() else 0)
        setattr(connection, IDENTITY_ATTRIBUTE, identity)
        transport = Transport(Transport.SERVER)
        transport.bind(connection)
        if leftover:
            transport.push(leftover)
        selectable = container.selectable(delegate=sock)
        selectable._transport = transport
        transport._selectable = selectable
        IOHandler.update(transport, selectable, container.now)


# --------------------------------------------------------------------------------------------------
# The front end (asyncio thread): TLS, SASL, then the byte bridge


Verify = Callable[[str, str], "bool | Awaitable[bool]"]


class FrontEnd:
    """Accepts clients, runs TLS and SASL, hands authenticated connections to
    `adopt(sock, identity, leftover)`.  Without TLS the client's own socket is handed over once SASL is
    done (proton then reads it directly); with TLS, which stays here, through a socket pair bridged
    both ways."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        mechanisms: tuple[str, ...],
        verify: Verify | None,
        adopt: Callable[[socket.socket, Identity, bytes], None],
        ssl_context: ssl.SSLContext | None = None,
        allow_skip: bool = False,
        keep_password: bool = False,
        handshake_timeout: float = 10.0,
        max_connections: int = 0,
        on_refused: Callable[[str, str], None] | None = None,
    ):
        self._host, self._requested_port = host, port
        self._mechanisms = mechanisms
        self._verify = verify
        self._adopt = adopt
        self._ssl = ssl_context
        self._allow_skip = allow_skip
        self._keep_password = keep_password
        self._timeout = handshake_timeout
        self._max_connections = max_connections
        self._on_refused = on_refused or (lambda reason, mechanism: None)
        self._active = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None  # TLS: asyncio's stream server
        self._listening: socket.socket | None = None  # plain TCP: our own listening socket
        self._accepting: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    def start(self) -> None:
        """Bind and serve on a thread of its own; OSError if the address cannot be bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                if self._ssl is not None:
                    self._server = loop.run_until_complete(
                        asyncio.start_server(
                            self._serve, self._host, self._requested_port, ssl=self._ssl,
                            ssl_handshake_timeout=self._timeout, limit=_CHUNK,
                        )
                    )
                    self.port = self._server.sockets[0].getsockname()[1]
                else:
                    family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
                    self._listening = socket.create_server((self._host, self._requested_port), family=family)
                    self._listening.setblocking(False)
                    self.port = self._listening.getsockname()[1]
                    self._accepting = loop.create_task(self._accept_plain())
            except BaseException as e:  # noqa: BLE001 - reported to start()
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="broker-filter-listener", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    def close(self) -> None:
        """Stop accepting and drop every bridged connection (idempotent)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def stop() -> None:
            self._stop_listening()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5)

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)

    def stop_accepting(self) -> None:
        """Close the listening socket; established connections go on."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._stop_listening)

    def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        if self._listening is not None:
            self._listening.close()
            self._listening = None

    async def _accept_plain(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listening is not None
        listening = self._listening
        while True:
            try:
                sock, _ = await loop.sock_accept(listening)
            except asyncio.CancelledError:
                return
            except OSError as e:
                if self._listening is None:
                    return
                log.warning("accepting a client connection failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            task = loop.create_task(self._serve_plain(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_plain(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        handed_over = False
        self._active += 1
        try:
            if self._max_connections and self._active > self._max_connections:
                self._on_refused("limit", "")
                return
            peer = sock.getpeername()
            identity, sasl = await self._authenticate(
                lambda: loop.sock_recv(sock, _CHUNK), lambda data: loop.sock_sendall(sock, data),
                f"{peer[0]}:{peer[1]}", tls=False, external=None,
            )
            if identity is None or sasl is None:
                return
            self._adopt(sock, identity, sasl.leftover)
            handed_over = True
        except (ConnectionError, TimeoutError, asyncio.CancelledError):
            pass
        except Exception:  # noqa: BLE001 - one client must not take the listener down
            log.exception("client connection failed")
        finally:
            self._active -= 1
            if not handed_over:
                sock.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._active += 1
        try:
            if self._max_connections and self._active > self._max_connections:
                self._on_refused("limit", "")
                return
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # close() cancels the connection tasks; ending quietly keeps asyncio's stream callback
            # (which asks a finished task for its exception) from logging an error at shutdown.
            pass
        except Exception:  # noqa: BLE001 - one client must not take the listener down
            log.exception("client connection failed")
        finally:
            self._active -= 1
            self._tasks.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("", 0)
        tls = writer.get_extra_info("ssl_object")
        external = certificate_subject(writer.get_extra_info("peercert")) if tls is not None else None

        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        identity, sasl = await self._authenticate(
            lambda: reader.read(_CHUNK), send, f"{peer[0]}:{peer[1]}", tls=tls is not None, external=external
        )
        if identity is None or sasl is None:
            return
        ours, theirs = socket.socketpair()
        try:
            self._adopt(theirs, identity, b"")
        except BaseException:
            ours.close()
            theirs.close()
            raise
        inner_reader, inner_writer = await asyncio.open_connection(sock=ours, limit=_CHUNK)
        try:
            if sasl.leftover:
                inner_writer.write(sasl.leftover)
            await _bridge(reader, writer, inner_reader, inner_writer)
        finally:
            inner_writer.close()

    async def _authenticate(
        self,
        recv: Callable[[], Awaitable[bytes]],
        send: Callable[[bytes], Awaitable[None]],
        peer_text: str,
        *,
        tls: bool,
        external: str | None,
    ) -> tuple[Identity | None, SaslServer | None]:
        """The SASL exchange; (identity, the finished SaslServer) when the client is in, else (None, None)."""
        credentials: list[tuple[str, str]] = []
        sasl = SaslServer(
            self._mechanisms,
            lambda user, password: credentials.append((user, password)),  # decided below, off the parser
            allow_skip=self._allow_skip,
            external_identity=external,
            keep_password=self._keep_password,
        )
        async with asyncio.timeout(self._timeout):
            while not (sasl.done or sasl.failed):
                if sasl.pending:
                    user, password = credentials.pop()
                    ok = await self._check(user, password)
                    sasl.resolve(ok, "" if ok else "wrong user name or password")
                else:
                    data = await recv()
                    if not data:
                        return None, None
                    sasl.receive(data)
                out = sasl.data_to_send()
                if out:
                    await send(out)
        outcome = sasl.outcome
        assert outcome is not None
        if not outcome.ok:
            log.info("client authentication refused", extra={"fields": {
                "peer": peer_text, "mechanism": outcome.mechanism, "user": outcome.user, "reason": outcome.reason}})
            self._on_refused("unauthorized", outcome.mechanism)
            return None, None
        return Identity(outcome.user, outcome.mechanism, outcome.password, tls, peer_text), sasl

    async def _check(self, user: str, password: str) -> bool:
        if self._verify is None:
            return False
        if inspect.iscoroutinefunction(self._verify):
            return bool(await self._verify(user, password))
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(None, self._verify, user, password)
        if inspect.isawaitable(result):
            result = await result
        return bool(result)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await reader.read(_CHUNK)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def _bridge(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    inner_reader: asyncio.StreamReader,
    inner_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until the daemon's side ends (it closes after the AMQP close) or the client goes."""
    upstream = asyncio.ensure_future(_pump(client_reader, inner_writer))
    downstream = asyncio.ensure_future(_pump(inner_reader, client_writer))
    try:
        await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        if upstream.done() and not downstream.done():
            # The client stopped sending; let the daemon's last frames out, briefly.
            await asyncio.wait({downstream}, timeout=5)
    finally:
        for task in (upstream, downstream):
            task.cancel()
        await asyncio.gather(upstream, downstream, return_exceptions=True)


# --------------------------------------------------------------------------------------------------
# Choosing and starting


class Listening:
    """A started listener: `port`, `stop_accepting()`, `close()`."""

    def __init__(self, port: int, *, acceptor: Any = None, front: FrontEnd | None = None,
                 adopter: Adopter | None = None):
        self.port = port
        self._acceptor = acceptor
        self._front = front
        self._adopter = adopter

    @property
    def front_end(self) -> bool:
        return self._front is not None

    def stop_accepting(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
        if self._front is not None:
            self._front.stop_accepting()

    def close(self) -> None:
        self.stop_accepting()
        if self._front is not None:
            self._front.close()
        if self._adopter is not None:
            self._adopter.close()


def needs_front_end(listener: Any, passthrough: bool = False) -> bool:
    """Whether the listener configuration needs the front end (anything beyond proton's ANONYMOUS)."""
    mechanisms = listener.effective_mechanisms
    return bool(listener.users) or passthrough or "EXTERNAL" in mechanisms or "ANONYMOUS" not in mechanisms


def listen(
    container: Any,
    listener: Any,
    handler: Any,
    *,
    passthrough: Verify | None = None,
    max_connections: int = 0,
    on_refused: Callable[[str, str], None] | None = None,
) -> Listening:
    """Start the client listener of `config.listener` on `container`, connections served by `handler`.

    `passthrough(user, password)`: with `upstream.credentials = "pass-through"`, checks a client's
    PLAIN credentials against the upstream (may block or be a coroutine function); the client's
    Identity then keeps the password for its upstream connection.  Must be called on the thread that
    will run the container, before it runs (or on its thread)."""
    if not needs_front_end(listener, passthrough is not None):
        acceptor = container.acceptor(listener.host, listener.port, handler)
        if listener.tls.enabled:
            acceptor.set_ssl_domain(proton_server_ssl_domain(listener.tls))
        port = acceptor._selectable._delegate.getsockname()[1]
        return Listening(port, acceptor=acceptor)
    verify: Verify | None
    if passthrough is not None:
        verify = passthrough
    elif listener.users:
        verify = UserDatabase(listener.users).authenticate
    else:
        verify = None
    adopter = Adopter(container, handler)
    front = FrontEnd(
        listener.host,
        listener.port,
        mechanisms=listener.effective_mechanisms,
        verify=verify,
        adopt=adopter.adopt,
        ssl_context=server_ssl_context(listener.tls) if listener.tls.enabled else None,
        allow_skip=listener.anonymous_allowed,
        keep_password=passthrough is not None,
        max_connections=max_connections,
        on_refused=on_refused,
    )
    try:
        front.start()
    except BaseException:
        adopter.close()
        raise
    return Listening(front.port, front=front, adopter=adopter)
