"""What sits between a socket and a transport: TLS with Python's `ssl` memory BIOs, and the server
side of the SASL exchange (the project's sans-I/O `security.SaslServer`, which verifies PLAIN
against the user database or a pass-through check, ANONYMOUS and EXTERNAL).

Both are byte transformers without I/O of their own; `loop.EventLoop` feeds them.

    tls = TlsStream(context, server_side=True)
    plaintext = tls.receive(ciphertext); socket_bytes = tls.send(plaintext) + tls.take()
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ..security import SaslServer, certificate_subject

_READ = 64 * 1024


class TlsError(Exception):
    """The TLS layer failed (handshake refused, bad record); the connection must close."""


class TlsStream:
    """TLS over memory BIOs.  Plaintext written before the handshake completes waits for it."""

    __slots__ = ("_in", "_out", "_ssl", "handshaken", "_waiting", "eof", "server_side")

    def __init__(self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None):
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_side=server_side,
                                     server_hostname=None if server_side else server_hostname)
        self.server_side = server_side
        self.handshaken = False
        self._waiting = bytearray()
        self.eof = False

    def start(self) -> bytes:
        """Client side: the first handshake bytes to send."""
        self._handshake()
        return self.take()

    def receive(self, data: Any) -> bytes:
        """Ciphertext in, plaintext out (b"" while the handshake runs).  TlsError on failure."""
        self._in.write(data)
        if not self.handshaken and not self._handshake():
            return b""
        chunks = []
        while True:
            try:
                chunk = self._ssl.read(_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.eof = True
                break
            except ssl.SSLError as e:
                raise TlsError(_reason(e)) from None
            if not chunk:
                self.eof = True
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send(self, plaintext: Any) -> bytes:
        """Plaintext in, ciphertext to put on the wire out."""
        if not self.handshaken:
            self._waiting += plaintext
            return b""
        try:
            self._ssl.write(plaintext)
        except ssl.SSLError as e:
            raise TlsError(_reason(e)) from None
        return self._out.read()

    def take(self) -> bytes:
        """Ciphertext the TLS layer produced on its own (handshake, alerts)."""
        return self._out.read()

    @property
    def peer_certificate(self) -> dict | None:
        """The verified client certificate (`ssl.SSLSocket.getpeercert()` form), for SASL EXTERNAL."""
        try:
            return self._ssl.getpeercert() or None
        except ValueError:
            return None

    @property
    def peer_subject(self) -> str | None:
        """The client certificate's subject ("CN=...,O=..."), for SASL EXTERNAL."""
        try:
            return certificate_subject(self._ssl.getpeercert())
        except ValueError:
            return None

    def _handshake(self) -> bool:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as e:
            raise TlsError(_reason(e)) from None
        self.handshaken = True
        if self._waiting:
            waiting, self._waiting = bytes(self._waiting), bytearray()
            self._ssl.write(waiting)
        return True


def _reason(error: ssl.SSLError) -> str:
    """OpenSSL's reason in words ("certificate verify failed: unable to get local issuer certificate")."""
    reason = (getattr(error, "reason", None) or "").lower().replace("_", " ") or str(error)
    detail = getattr(error, "verify_message", None)
    return f"{reason}: {detail}" if detail else reason


Verify = Callable[[str, str], "bool | Awaitable[bool]"]


@dataclass(frozen=True)
class ServerSasl:
    """The listener's SASL offer.  `verify(user, password) -> bool` checks PLAIN (it runs on a worker
    thread of the listener's `logins.LoginGate`, behind its per-address throttle and bounded queue: a
    password hash may take 100 ms); `remembered(user, password) -> bool` answers at once for
    credentials verified recently; `allow_skip` lets a client that sends the plain AMQP header in as
    anonymous; `keep_password` keeps a PLAIN password in the identity (pass-through).
    `certificate_users(cert) -> (subject, user or None)` maps an EXTERNAL client's certificate to a
    user (`security.CertificateUsers`; None: the subject itself is the user name).  `logins`: the
    gate's settings (`logins.LoginPolicy`; None: its defaults)."""

    mechanisms: tuple[str, ...] = ("ANONYMOUS",)
    verify: Verify | None = field(default=None, compare=False)
    allow_skip: bool = False
    keep_password: bool = False
    remembered: Callable[[str, str], bool] | None = field(default=None, compare=False)
    certificate_users: Callable[[Any], tuple[str | None, str | None]] | None = field(default=None, compare=False)
    logins: Any = None

    def exchange(self, certificate: Any) -> tuple[SaslServer, list[tuple[str, str]]]:
        """A fresh server exchange (`certificate`: the client's verified one, or None) and the list
        where PLAIN credentials wait to be verified."""
        credentials: list[tuple[str, str]] = []
        if self.certificate_users is not None:
            subject, user = self.certificate_users(certificate)
        else:
            subject = user = certificate_subject(certificate)
        server = SaslServer(
            self.mechanisms,
            lambda user, password: credentials.append((user, password)),  # decided off the loop
            allow_skip=self.allow_skip,
            external_identity=user,
            external_subject=subject,
            keep_password=self.keep_password,
        )
        return server, credentials
