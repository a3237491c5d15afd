"""Secrets: password hashes for the PLAIN user database, constant-time verification, and redaction of
credentials in URLs before they reach a log line, a metric or an error description.

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
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

SCRYPT_LOG2_N = 15
SCRYPT_R = 8
SCRYPT_P = 1
PBKDF2_ITERATIONS = 600_000
_SALT_BYTES = 16
_KEY_BYTES = 32
# scrypt needs 128 * r * n bytes; hashlib's default cap (32 MiB) is just too small for ln=15, r=8.
_SCRYPT_MAXMEM = 64 * 1024 * 1024

REDACTED = "***"


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
                maxmem=_SCRYPT_MAXMEM,
                dklen=len(self.digest),
            )
        return hashlib.pbkdf2_hmac("sha256", data, self.salt, self.params["i"], dklen=len(self.digest))

    def verify(self, password: str) -> bool:
        return hmac.compare_digest(self.compute(password), self.digest)


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _b64decode(text: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9+/]*", text):
        raise PasswordHashError("salt and hash must be unpadded base64")
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, algorithm: str = "scrypt", salt: bytes | None = None) -> str:
    """A new PHC-style hash of `password` with a random salt."""
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    if algorithm == "scrypt":
        params = {"ln": SCRYPT_LOG2_N, "r": SCRYPT_R, "p": SCRYPT_P}
        head = f"$scrypt$ln={SCRYPT_LOG2_N},r={SCRYPT_R},p={SCRYPT_P}"
    elif algorithm == "pbkdf2-sha256":
        params = {"i": PBKDF2_ITERATIONS}
        head = f"$pbkdf2-sha256$i={PBKDF2_ITERATIONS}"
    else:
        raise ValueError(f"unknown password hash algorithm {algorithm!r} (scrypt or pbkdf2-sha256)")
    digest = PasswordHash(algorithm, params, salt, b"\0" * _KEY_BYTES).compute(password)
    return f"{head}${_b64encode(salt)}${_b64encode(digest)}"


_LIMITS = {
    "scrypt": {"ln": (10, 22), "r": (1, 32), "p": (1, 16)},
    "pbkdf2-sha256": {"i": (10_000, 10_000_000)},
}


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

    Unknown users cost the same work as known ones (verification runs against a dummy hash), so timing
    does not reveal which names exist.  Hashing is deliberately slow (tens of milliseconds); successful
    verifications are remembered under a keyed digest of (user, password) so a client that reconnects
    often does not pay it each time.  The remembered digests are keyed by a per-process random key and
    never leave memory.
    """

    def __init__(self, users: Mapping[str, str] | None = None, *, cache_size: int = 1024):
        self._users = {name: parse_password_hash(h) for name, h in (users or {}).items()}
        self._dummy = parse_password_hash(hash_password(secrets.token_hex(16)))
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def __contains__(self, user: str) -> bool:
        return user in self._users

    def __len__(self) -> int:
        return len(self._users)

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._users)

    def authenticate(self, user: str, password: str) -> bool:
        stored = self._users.get(user)
        token = hmac.new(self._key, f"{user}\0{password}".encode("utf-8", "surrogatepass"), "sha256").digest()
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


def redact_url(url: str) -> str:
    """`amqp://user:secret@host:5672/x` -> `amqp://user:***@host:5672/x`.  Anything unparsable is returned
    with everything between `//` and the last `@` masked, so a secret never survives by accident."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{netloc}"))
    except ValueError:
        if "@" not in url:
            return url
        head, _, rest = url.partition("//")
        return f"{head}//{REDACTED}@{rest.rsplit('@', 1)[1]}"


_URL_IN_TEXT = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/@:]*):([^\s/@]*)@")


def redact_text(text: str) -> str:
    """Mask passwords of URLs embedded anywhere in free text."""
    return _URL_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", text)
