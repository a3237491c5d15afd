"""Secrets: password hashes for the PLAIN user database, constant-time verification, and redaction of
credentials in URLs before they reach a log line, a metric or an error description.  Also who a
client connection is (`Identity`, from the SASL exchange) and the listener's TLS context: both I/O
layers (the proton listener in `proxy` and `engine`) use them.

Password hashes are PHC-style strings, so an operator can tell the algorithm and its cost by eye:

    $scrypt$ln=15,r=8,p=1$<salt>$<hash>              (default; hashlib.scrypt, n = 2**ln)
    $pbkdf2-sha256$i=600000$<salt>$<hash>             (hashlib.pbkdf2_hmac)

salt and hash are unpadded standard base64.  `broker-filter hash-password` prints one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from struct import error as struct_error
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SCRYPT_LOG2_N = 15
SCRYPT_R = 8
SCRYPT_P = 1
PBKDF2_ITERATIONS = 600_000
_SALT_BYTES = 16
_KEY_BYTES = 32
# scrypt needs 128 * r * n bytes; hashlib's default cap (32 MiB) is just too small for ln=15, r=8
# (a costlier stored hash raises the cap to what it needs: 2**ln * 1 KiB at r=8).
_SCRYPT_MAXMEM = 64 * 1024 * 1024

REDACTED = "***"


@dataclass(frozen=True)
class Identity:
    """Who a client connection authenticated as.  `user` is the configured user: PLAIN's user name as
    verified (or as the upstream accepted it, pass-through), the user an EXTERNAL certificate maps to
    (`CertificateUsers`; `subject` is the certificate's), `anonymous` for ANONYMOUS."""

    user: str | None
    mechanism: str  # PLAIN, ANONYMOUS, EXTERNAL, "" (no SASL)
    password: str | None = field(default=None, repr=False)  # pass-through only
    tls: bool = False  # TLS terminated by the daemon (proton's own acceptor does not report it)
    peer: str = ""  # "host:port" of the client
    subject: str | None = None  # EXTERNAL: the client certificate's subject that `user` was mapped from


ANONYMOUS = Identity("anonymous", "ANONYMOUS")


def identity_of(connection: Any) -> Identity:
    """The Identity the listener gave a client connection (ANONYMOUS when it gave none)."""
    identity = getattr(connection, "identity", None)
    return identity if isinstance(identity, Identity) else ANONYMOUS


# Mozilla's "intermediate" server profile (ssl-config.mozilla.org, version 5.7): TLS 1.2 with ECDHE
# key exchange and AEAD ciphers only (its DHE suites are left out: the listener has no DH
# parameters), TLS 1.3 with OpenSSL's default suites (all three are the profile's), and the groups
# X25519, P-256 and P-384.
INTERMEDIATE_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
))
INTERMEDIATE_GROUPS = ("X25519", "prime256v1", "secp384r1")
TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsSettingError(ValueError):
    """A TLS setting OpenSSL does not accept: `key` names the setting (`ciphers`, `groups`, ...)."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def server_ssl_context(tls: Any) -> ssl.SSLContext:
    """An `ssl.SSLContext` for `[listener.tls]`: its certificate, `min_version`, `ciphers`, `groups`,
    and client certificates checked against `ca_file` (and `crl_file`, leaf certificates)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    harden(context, tls, tls.groups)
    context.load_cert_chain(tls.cert_file, tls.key_file, password=tls.key_password or None)
    if tls.ca_file:
        context.load_verify_locations(tls.ca_file)
    if getattr(tls, "crl_file", ""):
        try:
            context.load_verify_locations(tls.crl_file)
        except ssl.SSLError as e:
            raise TlsSettingError("crl_file", f"{tls.crl_file} holds no PEM certificate revocation list "
                                              f"({e.reason or e})") from None
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    context.verify_mode = ssl.CERT_REQUIRED if tls.verify_client else ssl.CERT_NONE
    return context


def replica_ssl_context(tls: Any, listener: Any) -> ssl.SSLContext:
    """An `ssl.SSLContext` for the replicas' connections to each other's TLS listener, from
    `[replicas.tls]` (`tls`) and `[listener.tls]` (`listener`): the peers' certificates checked against
    `ca_file` (else the listener's `ca_file`, else the system's CAs), with their name too unless
    `verify = "peer"`; the client certificate `cert_file` (else the listener's own); `min_version`
    and `ciphers` as the listener's (`harden`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # the chain is checked, and the name
    harden(context, tls)
    ca_file = tls.ca_file or listener.ca_file
    if ca_file:
        context.load_verify_locations(ca_file)
    else:
        context.load_default_certs()
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file or None, password=tls.key_password or None)
    elif listener.cert_file:
        context.load_cert_chain(listener.cert_file, listener.key_file or None, password=listener.key_password or None)
    context.check_hostname = tls.verify != "peer"
    return context


def harden(context: ssl.SSLContext, tls: Any, groups: tuple[str, ...] = ()) -> None:
    """Apply `min_version` and `ciphers` (TLS 1.2's; TLS 1.3 keeps OpenSSL's suites) of a TLS
    settings section, and the key exchange `groups` a listener restricts itself to, to `context`;
    TlsSettingError names the setting OpenSSL refused.  No compression, no renegotiation, a fresh
    ECDHE key per handshake.

    A client context (upstream, replicas) keeps OpenSSL's own list of groups.  A
    client whose list was set here (`X25519:prime256v1:secp384r1`) failed TLS 1.2 handshakes with an
    OpenSSL 3.0 server holding a P-256 ECDSA certificate ("no shared cipher"), where OpenSSL's own
    list, which names the same groups first, succeeds; the listener's list restricts what the daemon
    accepts, which is what the profile is about."""
    context.minimum_version = TLS_VERSIONS.get(getattr(tls, "min_version", "TLSv1.2"), ssl.TLSVersion.TLSv1_2)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_SINGLE_ECDH_USE | getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    ciphers = getattr(tls, "ciphers", INTERMEDIATE_CIPHERS)
    try:
        context.set_ciphers(ciphers)
    except ssl.SSLError:
        raise TlsSettingError("ciphers", f"OpenSSL selects no cipher from {ciphers!r}") from None
    set_groups(context, tuple(groups))


def set_groups(context: ssl.SSLContext, groups: tuple[str, ...]) -> None:
    """Limit the key-exchange groups (curves) of `context` to `groups`.

    Python 3.11's `ssl` sets one curve only (`set_ecdh_curve`); OpenSSL's `SSL_CTX_set1_groups_list`
    takes a list, so it is called through ctypes on the context's own `SSL_CTX` (the first field
    after the object header of CPython's SSLContext), found in the `_ssl` module's own OpenSSL and
    checked before use: the pointer must report the context's options and verify mode.  Where that
    check fails (another Python), the first group alone is set with `set_ecdh_curve`: still inside
    the list, fewer choices for the client."""
    if not groups:
        return
    for group in groups:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", group):
            raise TlsSettingError("groups", f"{group!r} is not a group name")
    setter = _groups_setter()
    if setter is not None:
        ok = setter(context, ":".join(groups))
        if ok is not None:
            if not ok:
                raise TlsSettingError("groups", f"OpenSSL does not know one of {', '.join(groups)}")
            return
    try:
        context.set_ecdh_curve(groups[0])
    except (ValueError, ssl.SSLError):
        raise TlsSettingError("groups", f"OpenSSL does not know the curve {groups[0]!r}") from None


_SSL_CTRL_SET_GROUPS_LIST = 92  # SSL_CTX_set1_groups_list is this SSL_CTX_ctrl call (ssl.h)
_groups_lib: Any = None


def _groups_setter() -> Callable[[ssl.SSLContext, str], bool | None] | None:
    """`set(context, "A:B:C") -> True/False` (None: the context's SSL_CTX could not be found), or
    None where ctypes or the symbols are missing."""
    global _groups_lib
    if _groups_lib is None:
        try:
            import ctypes

            lib = ctypes.CDLL(ssl._ssl.__file__)  # type: ignore[attr-defined]
            ctrl, options, verify = lib.SSL_CTX_ctrl, lib.SSL_CTX_get_options, lib.SSL_CTX_get_verify_mode
            ctrl.restype, ctrl.argtypes = ctypes.c_long, [ctypes.c_void_p, ctypes.c_int, ctypes.c_long,
                                                          ctypes.c_char_p]
            options.restype, options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
            verify.restype, verify.argtypes = ctypes.c_int, [ctypes.c_void_p]
            _groups_lib = (ctypes, ctrl, options, verify)
        except (ImportError, OSError, AttributeError):
            _groups_lib = False
    if not _groups_lib:
        return None
    ctypes, ctrl, options, verify = _groups_lib

    def set_list(context: ssl.SSLContext, names: str) -> bool | None:
        pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
        if not pointer or options(pointer) != int(context.options) or verify(pointer) != int(context.verify_mode):
            return None
        return ctrl(pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, names.encode("ascii")) == 1

    return set_list


class PasswordHashError(ValueError):
    """A stored password hash that cannot be used (unknown algorithm, bad parameters, bad base64)."""


@dataclass(frozen=True)
class PasswordHash:
    algorithm: str  # "scrypt" | "pbkdf2-sha256"
    params: Mapping[str, int]
    salt: bytes
    digest: bytes

    def compute(self, password: str) -> bytes:
        data = password.encode("utf-8")
        if self.algorithm == "scrypt":
            return hashlib.scrypt(
                data,
                salt=self.salt,
                n=1 << self.params["ln"],
                r=self.params["r"],
                p=self.params["p"],
                maxmem=max(_SCRYPT_MAXMEM, _scrypt_memory(self.params) + (1 << 20)),
                dklen=len(self.digest),
            )
        return hashlib.pbkdf2_hmac("sha256", data, self.salt, self.params["i"], dklen=len(self.digest))

    def verify(self, password: str) -> bool:
        return hmac.compare_digest(self.compute(password), self.digest)


def _scrypt_memory(params: Mapping[str, int]) -> int:
    """Bytes scrypt needs (OpenSSL's count: 128 * r * (N + 2 + p))."""
    return 128 * params["r"] * ((1 << params["ln"]) + 2 + params["p"])


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _b64decode(text: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9+/]*", text):
        raise PasswordHashError("salt and hash must be unpadded base64")
    return base64.b64decode(text + "=" * (-len(text) % 4))


_LIMITS = {
    "scrypt": {"ln": (10, 22), "r": (1, 32), "p": (1, 16)},
    "pbkdf2-sha256": {"i": (10_000, 10_000_000)},
}
# The cost parameter of each algorithm (`hash-password --cost`): scrypt's log2 N, PBKDF2's iterations.
COST_PARAMETER = {"scrypt": "ln", "pbkdf2-sha256": "i"}
DEFAULT_COST = {"scrypt": SCRYPT_LOG2_N, "pbkdf2-sha256": PBKDF2_ITERATIONS}


def check_cost(algorithm: str, cost: int) -> int:
    """`cost` if it is within the range a stored hash of `algorithm` may have, else ValueError saying the range."""
    if algorithm not in COST_PARAMETER:
        raise ValueError(f"unknown password hash algorithm {algorithm!r} (scrypt or pbkdf2-sha256)")
    name = COST_PARAMETER[algorithm]
    low, high = _LIMITS[algorithm][name]
    if not low <= cost <= high:
        what = "log2 of N" if algorithm == "scrypt" else "iterations"
        raise ValueError(f"{algorithm} cost ({what}) must be within {low}..{high}, not {cost}")
    return cost


def hash_password(password: str, *, algorithm: str = "scrypt", salt: bytes | None = None,
                  cost: int | None = None) -> str:
    """A new PHC-style hash of `password` with a random salt.  `cost`: scrypt's log2 N (default 15) or
    PBKDF2's iterations (default 600,000); verification reads it from the stored hash."""
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    cost = check_cost(algorithm, DEFAULT_COST.get(algorithm, 0) if cost is None else cost)
    if algorithm == "scrypt":
        params = {"ln": cost, "r": SCRYPT_R, "p": SCRYPT_P}
        head = f"$scrypt$ln={cost},r={SCRYPT_R},p={SCRYPT_P}"
    else:
        params = {"i": cost}
        head = f"$pbkdf2-sha256$i={cost}"
    digest = PasswordHash(algorithm, params, salt, b"\0" * _KEY_BYTES).compute(password)
    return f"{head}${_b64encode(salt)}${_b64encode(digest)}"


def parse_password_hash(text: str) -> PasswordHash:
    """Parse a stored hash; PasswordHashError says what is wrong (never echoing the hash itself)."""
    if not isinstance(text, str):
        raise PasswordHashError("must be a password hash string such as $scrypt$ln=15,r=8,p=1$...")
    parts = text.split("$")
    if len(parts) != 5 or parts[0] != "":
        raise PasswordHashError(
            "must be a password hash ($scrypt$... or $pbkdf2-sha256$...), as printed by `broker-filter hash-password`;"
            " plain-text passwords are not accepted"
        )
    _, algorithm, param_text, salt_text, digest_text = parts
    limits = _LIMITS.get(algorithm)
    if limits is None:
        raise PasswordHashError(f"unknown password hash algorithm {algorithm!r} (scrypt or pbkdf2-sha256)")
    params: dict[str, int] = {}
    for item in param_text.split(","):
        name, eq, value = item.partition("=")
        if not eq or name not in limits or not value.isdigit():
            raise PasswordHashError(f"bad {algorithm} parameter {item!r}")
        params[name] = int(value)
    for name, (low, high) in limits.items():
        if name not in params:
            raise PasswordHashError(f"{algorithm} hash lacks parameter {name!r}")
        if not low <= params[name] <= high:
            raise PasswordHashError(f"{algorithm} parameter {name}={params[name]} out of range {low}..{high}")
    salt, digest = _b64decode(salt_text), _b64decode(digest_text)
    if len(salt) < 8 or len(digest) < 16:
        raise PasswordHashError("salt or hash too short")
    return PasswordHash(algorithm, params, salt, digest)


class UserDatabase:
    """The PLAIN user database: user name -> password hash, verified in constant time.

    Unknown users cost the same work as known ones (verification runs against a dummy hash of the
    costliest stored hash's algorithm and cost), so timing does not reveal which names exist.  Hashing is deliberately slow (tens of milliseconds); successful
    verifications are remembered under a keyed digest of (user, password) so a client that reconnects
    often does not pay it each time.  The remembered digests are keyed by a per-process random key and
    never leave memory.
    """

    def __init__(self, users: Mapping[str, str] | None = None, *, cache_size: int = 1024):
        self._users = {name: parse_password_hash(h) for name, h in (users or {}).items()}
        self._dummy = _dummy_like(self._users.values())
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def replace(self, users: Mapping[str, str]) -> None:
        """The users and hashes of a reloaded configuration (SIGHUP): every remembered login is
        forgotten, so a removed user or a changed password takes effect at the next login."""
        parsed = {name: parse_password_hash(h) for name, h in users.items()}
        with self._lock:
            self._users = parsed
            self._dummy = _dummy_like(parsed.values())
            self._verified.clear()

    def __contains__(self, user: str) -> bool:
        return user in self._users

    def __len__(self) -> int:
        return len(self._users)

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._users)

    def _token(self, user: str, password: str) -> bytes:
        return hmac.new(self._key, f"{user}\0{password}".encode("utf-8", "surrogatepass"), "sha256").digest()

    def remembered(self, user: str, password: str) -> bool:
        """Whether (user, password) verified recently: a keyed digest, microseconds, no hashing (the
        listener answers such logins at once, without queueing a check)."""
        if user not in self._users or self._cache_size <= 0:
            return False
        token = self._token(user, password)
        with self._lock:
            if token in self._verified:
                self._verified.move_to_end(token)
                return True
        return False

    def authenticate(self, user: str, password: str) -> bool:
        stored = self._users.get(user)
        token = self._token(user, password)
        if stored is not None:
            with self._lock:
                if token in self._verified:
                    self._verified.move_to_end(token)
                    return True
        ok = (stored or self._dummy).verify(password) and stored is not None
        if ok and self._cache_size > 0:
            with self._lock:
                self._verified[token] = None
                while len(self._verified) > self._cache_size:
                    self._verified.popitem(last=False)
        return ok


def _cost_rank(stored: PasswordHash) -> tuple:
    if stored.algorithm == "scrypt":
        return (1, (1 << stored.params["ln"]) * stored.params["r"] * stored.params["p"])
    return (0, stored.params["i"])


def _dummy_like(stored: Any) -> PasswordHash:
    """A hash of a random password with the algorithm and cost of the costliest of `stored` (scrypt's
    default without any): what an unknown user's password is checked against."""
    costliest = max(stored, key=_cost_rank, default=None)
    if costliest is None:
        return parse_password_hash(hash_password(secrets.token_hex(16)))
    return PasswordHash(costliest.algorithm, costliest.params, secrets.token_bytes(_SALT_BYTES),
                        secrets.token_bytes(len(costliest.digest)))


def redact_url(url: str) -> str:
    """`amqp://user:secret@host:5672/x` -> `amqp://user:***@host:5672/x`.  A URL whose credentials are
    not plain to read (an `@` past the host part: a password with an unescaped `/`, `?` or `#`, or
    one the parser refuses) has everything between `//` and its last `@` masked, so a secret never
    survives by accident."""
    head, sep, rest = url.partition("//")
    if not sep:  # no scheme: `user:pass@host` all the same
        return f"{REDACTED}@{url.rsplit('@', 1)[1]}" if "@" in url else url
    if "@" not in rest:
        return url
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        clean = "@" in netloc and "@" not in rest[len(netloc):]
        if clean and parts.password is None:
            return url
        if clean:
            host = netloc.rsplit("@", 1)[1]
            return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{REDACTED}@{host}"))
    except ValueError:
        pass
    return f"{head}//{REDACTED}@{rest.rsplit('@', 1)[1]}"


_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"]*")


def redact_text(text: str) -> str:
    """Mask passwords of URLs embedded anywhere in free text."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def certificate_subject(cert: Any) -> str | None:
    """A peer certificate's subject as "key=value,..." (`ssl.SSLSocket.getpeercert()` form), the
    identity SASL EXTERNAL reports; None without a certificate."""
    if not cert:
        return None
    parts = []
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            parts.append(f"{key}={value}")
    return ",".join(parts) or None


# OpenSSL's long attribute names (as `getpeercert()` gives them) -> the short ones of RFC 4514
_SHORT_NAMES = {
    "commonname": "CN", "organizationname": "O", "organizationalunitname": "OU", "countryname": "C",
    "localityname": "L", "stateorprovincename": "ST", "streetaddress": "STREET", "domaincomponent": "DC",
    "userid": "UID", "emailaddress": "emailAddress", "serialnumber": "serialNumber",
}


def _short(key: str) -> str:
    key = key.strip()
    short = _SHORT_NAMES.get(key.lower())
    if short is not None:
        return short
    upper = key.upper()
    return upper if upper in {v.upper() for v in _SHORT_NAMES.values()} and upper != "EMAILADDRESS" else key


def _subject_pairs(cert: Any) -> list[tuple[str, str]]:
    return [(_short(key), str(value)) for rdn in (cert or {}).get("subject", ()) for key, value in rdn]


def normalize_subject(text: str) -> str:
    """A subject as `CN=client-1,O=Acme` (short attribute names, no spaces around `,` and `=`), from
    `CN=client-1, O=Acme`, `commonName=client-1,...` or OpenSSL's `/O=Acme/CN=client-1`.  Values with
    an escaped `,` are not supported."""
    text = text.strip()
    items = text.strip("/").split("/") if text.startswith("/") else text.split(",")
    pairs = []
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{item.strip()!r} is not an attribute such as CN=name")
        pairs.append(f"{_short(key)}={value.strip()}")
    return ",".join(pairs)


class CertificateUsers:
    """SASL EXTERNAL: which configured user a verified client certificate is.

    `mapping` (`[listener.certificate_users]`): a key with `=` is a whole subject (`CN=app,O=Acme`,
    in the certificate's order or the reverse, RFC 4514's), a key without is a common name; the value
    is the user name.  A certificate whose subject or CN is not a key is the user named by its CN
    when that is a configured user (`users`, or a value of `mapping`).  Anything else maps to no
    user, and its EXTERNAL login is refused."""

    def __init__(self, mapping: Mapping[str, str] | None = None, users: Any = ()):
        self._subjects: dict[str, str] = {}
        self._names: dict[str, str] = {}
        for key, user in (mapping or {}).items():
            if "=" in key:
                self._subjects[normalize_subject(key)] = user
            else:
                self._names[key.strip()] = user
        self.users = frozenset(users) | frozenset((mapping or {}).values())

    def __call__(self, cert: Any) -> tuple[str | None, str | None]:
        """(the certificate's subject as `CN=...,O=...`, the user it maps to or None); (None, None)
        without a certificate."""
        pairs = _subject_pairs(cert)
        if not pairs:
            return None, None
        subject = ",".join(f"{k}={v}" for k, v in pairs)
        backwards = ",".join(f"{k}={v}" for k, v in reversed(pairs))
        for form in (subject, backwards):
            if form in self._subjects:
                return subject, self._subjects[form]
        common = [v for k, v in pairs if k == "CN"]
        cn = common[-1] if common else None
        if cn is not None and cn in self._names:
            return subject, self._names[cn]
        if cn is not None and cn in self.users:
            return subject, cn
        return subject, None


# --------------------------------------------------------------------------------------------------
# SASL server (sans-I/O)
#
# Proton's built-in SASL (without Cyrus) verifies only ANONYMOUS and EXTERNAL on the server side, so
# PLAIN against our user database -- and pass-through, which needs the client's password -- happens
# here, before proton sees the connection: bytes in, bytes out, an outcome.  After a successful
# exchange the rest of the stream (starting with the client's AMQP protocol header) goes to a proton
# server Transport without a SASL layer of its own.

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SASL_OK, SASL_AUTH, SASL_SYS, SASL_SYS_PERM, SASL_SYS_TEMP = range(5)
_SASL_FRAME_TYPE = 1
_SASL_MAX_FRAME = 64 * 1024
_SASL_INIT = (0x41, "amqp:sasl-init:list")


@dataclass(frozen=True, repr=False)
class SaslOutcome:
    ok: bool
    mechanism: str  # "PLAIN", "ANONYMOUS", "EXTERNAL"; "" when the client skipped SASL
    user: str | None = None
    password: str | None = None  # the client's PLAIN password, for pass-through only; never logged
    reason: str = ""  # why it failed, for the log (never the password)
    # what kind of failure, for the metric: wrong-credentials, unknown-certificate, mechanism, malformed,
    # queue-full, throttled
    category: str = ""
    subject: str | None = None  # EXTERNAL: the certificate subject `user` was mapped from

    def __repr__(self) -> str:
        return (f"SaslOutcome(ok={self.ok}, mechanism={self.mechanism!r}, user={self.user!r}, "
                f"reason={self.reason!r}, category={self.category!r})")


class _SaslExchange:
    """What both sides of a SASL exchange tell: finished well, or not."""

    _state = "header"

    @property
    def done(self) -> bool:
        return self._state == "done"

    @property
    def failed(self) -> bool:
        return self._state == "failed"


class SaslServer(_SaslExchange):
    """The server side of an AMQP SASL exchange, without I/O.

    Feed received bytes to `receive()`, send what `data_to_send()` returns.  When `done` is set,
    `outcome` says whether the client is in; `leftover` holds the bytes that followed the exchange
    (give them, and everything received later, to the proton Transport).  `failed` connections must
    be closed once `data_to_send()` is flushed.

    `verify(user, password)` checks PLAIN credentials: True / False, or None to decide later (e.g.
    pass-through, which first opens an upstream connection with them) and call `resolve(ok)`.
    `allow_skip`: a client that sends the plain AMQP header without SASL is let in as anonymous.
    EXTERNAL is offered when the client presented a certificate (`external_subject`) or an identity
    for it is given; `external_identity` is the user it maps to (None: it maps to no user, and an
    EXTERNAL login is refused).
    """

    def __init__(
        self,
        mechanisms: tuple[str, ...] | list[str],
        verify: Callable[[str, str], bool | None] | None = None,
        *,
        allow_skip: bool = False,
        external_identity: str | None = None,
        keep_password: bool = False,
        external_subject: str | None = None,
    ):
        self.mechanisms = tuple(m for m in mechanisms if m != "EXTERNAL" or external_identity or external_subject)
        self._verify = verify
        self._allow_skip = allow_skip
        self._external = external_identity
        self._subject = external_subject
        self._keep_password = keep_password
        self._buffer = bytearray()
        self._out = bytearray()
        self._state = "header"
        self._pending: SaslOutcome | None = None
        self.outcome: SaslOutcome | None = None
        self.leftover = b""

    @property
    def pending(self) -> bool:
        """Waiting for `resolve()`."""
        return self._state == "pending"

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken (what a client sent behind its sasl-init while it waits)."""
        return len(self._buffer)

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive(self, data: bytes) -> None:
        if self._state in ("done", "failed"):
            if self._state == "done":
                self.leftover += data
            return
        self._buffer += data
        try:
            self._advance()
        except (ValueError, IndexError, TypeError, struct_error) as e:
            self._fail("malformed SASL frame", SASL_SYS_PERM, category="malformed")

    def resolve(self, ok: bool, reason: str = "", *, temporary: bool = False, category: str = "") -> None:
        """Finish a PLAIN exchange whose `verify` answered None.  `temporary`: refused for now (the
        checks are busy), SASL's sys-temp outcome instead of auth."""
        if self._state != "pending" or self._pending is None:
            raise RuntimeError("no SASL verification pending")
        pending = self._pending
        self._pending = None
        if ok:
            self._succeed(pending)
        else:
            self._fail(reason or "authentication failed", SASL_SYS_TEMP if temporary else SASL_AUTH,
                       pending.mechanism, pending.user, category=category or "wrong-credentials")
        if self.done:
            self._advance_leftover()

    def _advance(self) -> None:
        if self._state == "header":
            if len(self._buffer) < 8:
                if not (SASL_HEADER.startswith(bytes(self._buffer)) or AMQP_HEADER.startswith(bytes(self._buffer))):
                    self._reject_header()
                return
            header = bytes(self._buffer[:8])
            if header == SASL_HEADER:
                del self._buffer[:8]
                self._out += SASL_HEADER + _sasl_frame(0x40, [_symbol_array(self.mechanisms)])
                self._state = "init"
            elif header == AMQP_HEADER and self._allow_skip:
                self.outcome = SaslOutcome(True, "", "anonymous")
                self._state = "done"
                self._advance_leftover()
                return
            else:
                self._reject_header()
                return
        if self._state == "init":
            frame = self._take_frame()
            if frame is None:
                return
            self._on_init(frame)
        if self._state == "done":
            self._advance_leftover()

    def _advance_leftover(self) -> None:
        self.leftover += bytes(self._buffer)
        self._buffer.clear()

    def _reject_header(self) -> None:
        # Spec: answer a header we do not speak with the one we do, then close.
        self._out += SASL_HEADER
        self.outcome = SaslOutcome(False, "", reason="client did not start SASL", category="malformed")
        self._state = "failed"

    def _take_frame(self) -> bytes | None:
        return _take_sasl_frame(self._buffer)

    def _on_init(self, body: bytes) -> None:
        from .amqp import types as t
        from .amqp import decode

        value, _ = decode(body, 0)
        if not isinstance(value, t.Described) or value.descriptor not in _SASL_INIT:
            raise ValueError("expected sasl-init")
        fields = list(value.value or [])
        fields += [None] * (3 - len(fields))
        mechanism, response = str(fields[0] or ""), fields[1]
        if mechanism not in self.mechanisms:
            self._fail(f"mechanism {mechanism[:40]!r} not offered", SASL_AUTH, mechanism, category="mechanism")
            return
        if mechanism == "ANONYMOUS":
            self._succeed(SaslOutcome(True, mechanism, "anonymous"))
        elif mechanism == "EXTERNAL":
            if self._external is None:
                self._fail(f"the client certificate {self._subject} maps to no configured user", SASL_AUTH,
                           mechanism, category="unknown-certificate", subject=self._subject)
                return
            self._succeed(SaslOutcome(True, mechanism, self._external, subject=self._subject))
        else:  # PLAIN: [authzid] NUL authcid NUL passwd (RFC 4616)
            parts = bytes(response or b"").split(b"\0")
            if len(parts) != 3:
                self._fail("malformed PLAIN response", SASL_AUTH, mechanism, category="malformed")
                return
            try:
                authzid, user, password = (p.decode("utf-8") for p in parts)
            except UnicodeDecodeError:
                self._fail("PLAIN response is not UTF-8", SASL_AUTH, mechanism, category="malformed")
                return
            if authzid and authzid != user:
                self._fail("authorization identity differs from the user", SASL_AUTH, mechanism, user,
                           category="malformed")
                return
            verdict = self._verify(user, password) if self._verify is not None else False
            kept = password if self._keep_password else None
            if verdict is None:
                self._pending = SaslOutcome(True, mechanism, user, kept)
                self._state = "pending"
            elif verdict:
                self._succeed(SaslOutcome(True, mechanism, user, kept))
            else:
                self._fail("wrong user name or password", SASL_AUTH, mechanism, user, category="wrong-credentials")

    def _succeed(self, outcome: SaslOutcome) -> None:
        self._out += _sasl_frame(0x44, [_ubyte(SASL_OK)])
        self.outcome = outcome
        self._state = "done"

    def _fail(self, reason: str, code: int, mechanism: str = "", user: str | None = None, *,
              category: str = "", subject: str | None = None) -> None:
        self._out += _sasl_frame(0x44, [_ubyte(code)])
        self.outcome = SaslOutcome(False, mechanism, user, reason=reason, category=category, subject=subject)
        self._state = "failed"


class SaslClientExchange(_SaslExchange):
    """The client side of an AMQP SASL exchange, without I/O: PLAIN with `user` and `password`, else
    ANONYMOUS (a splice's login to the queue's owner, as the replicas log in to each other).

    Send `data_to_send()` (the SASL header and the sasl-init, at once: no round trip for the
    mechanisms), feed what comes back to `receive()`.  `done`: the server said ok, and `leftover`
    holds what followed its outcome (the start of its AMQP layer).  `failed`: it refused, or spoke
    something else (`reason` says what)."""

    def __init__(self, user: str | None = None, password: str | None = None):
        self.mechanism = "PLAIN" if user else "ANONYMOUS"
        response = b"\0" + user.encode() + b"\0" + (password or "").encode() if user else b""
        from .amqp import types as t

        self._out = SASL_HEADER + _sasl_frame(0x41, [t.symbol(self.mechanism), response])
        self._buffer = bytearray()
        self._state = "header"
        self.reason = ""
        self.leftover = b""

    def data_to_send(self) -> bytes:
        out, self._out = self._out, b""
        return out

    def receive(self, data: bytes) -> None:
        if self._state == "done":
            self.leftover += data
            return
        if self._state == "failed":
            return
        self._buffer += data
        try:
            self._advance()
        except (ValueError, IndexError, TypeError, struct_error) as e:
            self._fail(f"malformed SASL frame from the server ({e})")

    def _fail(self, reason: str) -> None:
        self.reason = reason
        self._state = "failed"

    def _advance(self) -> None:
        from .amqp import types as t
        from .amqp import decode

        if self._state == "header":
            if len(self._buffer) < 8:
                return
            if bytes(self._buffer[:8]) != SASL_HEADER:
                self._fail(f"the server answered with the header {bytes(self._buffer[:8])!r}, not SASL's")
                return
            del self._buffer[:8]
            self._state = "frames"
        while self._state == "frames":
            body = _take_sasl_frame(self._buffer)
            if body is None:
                return
            value, _ = decode(body, 0)
            code = int(value.descriptor) if isinstance(value, t.Described) and not isinstance(value.descriptor, str) else -1
            if code == 0x40:  # sasl-mechanisms: the init is on its way already
                continue
            if code != 0x44:
                self._fail(f"the server sent SASL frame {code:#x}, not an outcome (no challenge is expected)")
                return
            fields = list(value.value or [])
            outcome = int(fields[0]) if fields else SASL_SYS
            if outcome != SASL_OK:
                self._fail(f"the server refused the {self.mechanism} login (sasl-outcome code {outcome})")
                return
            self._state = "done"
            self.leftover = bytes(self._buffer)
            self._buffer.clear()


def _take_sasl_frame(buffer: bytearray) -> bytes | None:
    """The body of the SASL frame at the start of `buffer`, taken out of it (None: not all in yet)."""
    if len(buffer) < 8:
        return None
    size = int.from_bytes(buffer[:4], "big")
    doff, ftype = buffer[4], buffer[5]
    if size > _SASL_MAX_FRAME or size < 8 or doff < 2 or doff * 4 > size or ftype != _SASL_FRAME_TYPE:
        raise ValueError("bad SASL frame header")
    if len(buffer) < size:
        return None
    body = bytes(buffer[doff * 4 : size])
    del buffer[:size]
    return body


def _ubyte(n: int) -> Any:
    from .amqp import types as t

    return t.ubyte(n)


def _symbol_array(names: tuple[str, ...]) -> Any:
    from .amqp import types as t

    return t.Array("symbol", [t.symbol(n) for n in names])


def _sasl_frame(code: int, fields: list) -> bytes:
    from .amqp import types as t
    from .amqp import encode

    body = encode(t.Described(t.ulong(code), fields))
    return (8 + len(body)).to_bytes(4, "big") + bytes((2, _SASL_FRAME_TYPE, 0, 0)) + body
