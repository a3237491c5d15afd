"""The daemon's configuration: one frozen dataclass tree, `Config`.

Theory of operation.  Every setting is declared once, as a dataclass field made by `setting()`, which
records its kind, default, documentation and checks.  Values come from four layers, each overriding
the one before: the defaults, a TOML file (`--config PATH` or `BROKER_FILTER_CONFIG`), environment
variables named after the key (`limits.selector_length` -> `BROKER_FILTER_LIMITS_SELECTOR_LENGTH`)
and command-line flags (`--listen`, `--upstream`, `--metrics`, `--log-format`, `--log-level`,
`--set KEY=VALUE`).  The layers are merged as raw values first, then converted and checked in one
pass, so a bad value anywhere raises `ConfigError(key, reason)` naming the dotted key, before the
daemon opens a socket.  Unknown keys are errors too (typos must not be silently ignored).

Table-valued settings (`listener.users`, `address_rules`, `virtual_addresses`, `security.roles`,
`security.settings`) come from the file or `--set` only.  Environment variables and flags carry text
and are parsed by the setting's kind: lists are comma-separated, booleans are true/false/yes/no/1/0,
tri-states also accept `auto`.

Secrets (passwords, key passwords, credentials inside URLs) never appear in `repr`, in error
messages or in `Config.to_dict()`.

`reload_security` is the daemon's SIGHUP: it reads the same sources again and returns the new users,
roles and security settings, or the error (the running ones then stay).

`python -m broker_filter.config` prints the Markdown reference table that README.md carries.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import ipaddress
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from .authorization import ARTEMIS_PERMISSIONS, ANONYMOUS_USER, OPERATIONS, PatternError, Permissions, pattern_node
from .security import (INTERMEDIATE_CIPHERS, INTERMEDIATE_GROUPS, TLS_VERSIONS, PasswordHashError, TlsSettingError,
                       normalize_subject, parse_password_hash, redact_text, redact_url)

ENV_PREFIX = "BROKER_FILTER_"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
CONFIG_ENV = "BROKER_FILTER_CONFIG"
# Variables the daemon once read and no longer does: set, they stop it with the reason rather than
# being ignored.
RETIRED_ENV = {
    "BROKER_FILTER_IO": "no longer read: the daemon always runs on proton-c's engine (the `--io container` "
                        "loop is gone); unset it",
}


class ConfigError(ValueError):
    """A setting that cannot be used.  `key` is the dotted key, `reason` says why (secret-free)."""

    exit_code = 2

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# Declaring settings


class _Text(str):
    """A raw value that came as text (environment, command line) and must be parsed by kind."""

    origin: str = ""

    def __new__(cls, value: str, origin: str) -> _Text:
        self = super().__new__(cls, value)
        self.origin = origin
        return self


def setting(
    default: Any,
    doc: str,
    *,
    kind: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    secret: bool = False,
    env: bool = True,
    shown_default: str | None = None,
) -> Any:
    """A leaf setting.  kind: str, int, float, bool, tristate, list, port, hostport, table."""
    metadata = {
        "kind": kind,
        "doc": doc,
        "minimum": minimum,
        "maximum": maximum,
        "choices": choices,
        "secret": secret,
        "env": env and kind != "table",
        "shown_default": shown_default,
    }
    if isinstance(default, (dict, list, tuple)) or callable(default):
        factory = default if callable(default) else (lambda d=default: d)
        return field(default_factory=factory, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


def section(cls: type, doc: str) -> Any:
    return field(default_factory=cls, metadata={"kind": "section", "doc": doc})


# --------------------------------------------------------------------------------------------------
# The settings


@dataclass(frozen=True)
class ListenerTLS:
    cert_file: str = setting("", "PEM certificate (chain) the listener presents; setting it turns TLS on", kind="str")
    key_file: str = setting("", "PEM private key of `cert_file`", kind="str")
    key_password: str = setting("", "password of an encrypted `key_file`", kind="str", secret=True)
    ca_file: str = setting("", "PEM CA certificates that client certificates must chain to", kind="str")
    verify_client: bool = setting(False, "require a client certificate signed by `ca_file`", kind="bool")
    crl_file: str = setting(
        "", "PEM certificate revocation list(s) of `ca_file`'s CAs: a revoked client certificate is refused "
        "(with a CRL, every client certificate's issuer needs one in this file)", kind="str")
    min_version: str = setting("TLSv1.2", "oldest TLS version accepted", kind="str", choices=tuple(TLS_VERSIONS))
    ciphers: str = setting(
        INTERMEDIATE_CIPHERS,
        "TLS 1.2 cipher suites, in OpenSSL's cipher-list syntax (TLS 1.3 suites are OpenSSL's defaults); the "
        "default is Mozilla's intermediate profile: ECDHE with AES-GCM or CHACHA20-POLY1305",
        kind="str", shown_default="Mozilla intermediate (ECDHE+AESGCM, ECDHE+CHACHA20)")
    groups: tuple[str, ...] = setting(
        INTERMEDIATE_GROUPS, "key exchange groups (curves) offered, OpenSSL names", kind="list")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True)
class ListenerLogin:
    workers: int = setting(
        2,
        "threads that check PLAIN passwords (scrypt / PBKDF2 run there, never on the event loop)",
        kind="int", minimum=1, maximum=64,
    )
    queue: int = setting(
        32,
        "password checks waiting for a thread, over every source address; a login beyond it is refused at "
        "once (SASL sys-temp, counted as `queue-full`)",
        kind="int", minimum=1,
    )
    per_address: int = setting(
        8,
        "logins of one source address waiting for their check (delayed or queued); one beyond it is refused "
        "at once (SASL sys-temp, counted as `throttled`)",
        kind="int", minimum=1,
    )
    delay: float = setting(
        0.1,
        "seconds a failed login delays the next check of its source address; doubled with each further "
        "failure (other addresses are not delayed)",
        kind="float", minimum=0,
    )
    max_delay: float = setting(5.0, "the longest such delay (seconds)", kind="float", minimum=0)
    forget: float = setting(
        60.0, "seconds without a failed login after which a source address's failures are forgotten",
        kind="float", minimum=0.001,
    )
    log_rate: int = setting(
        10,
        "log lines a second about failed, refused and abandoned logins (successful ones: ten times that); "
        "the number left out is logged with the next line",
        kind="int", minimum=1,
    )


@dataclass(frozen=True)
class Listener:
    host: str = setting("127.0.0.1", "interface the AMQP listener binds (`0.0.0.0` or `::` for all)", kind="str")
    port: int = setting(5672, "AMQP listener port (0: any free port)", kind="port")
    sasl_mechanisms: tuple[str, ...] = setting(
        ("ANONYMOUS", "PLAIN"),
        "SASL mechanisms offered to clients: ANONYMOUS, PLAIN, EXTERNAL (TLS client certificate)",
        kind="list",
        choices=("ANONYMOUS", "PLAIN", "EXTERNAL"),
    )
    allow_anonymous: bool | None = setting(
        None,
        "accept SASL ANONYMOUS; `auto`: only when `host` is a loopback address",
        kind="tristate",
    )
    users: Mapping[str, str] = setting(
        lambda: MappingProxyType({}),
        "PLAIN users, `name = \"<hash>\"`, hashes from `broker-filter hash-password` (scrypt or pbkdf2-sha256)",
        kind="table",
        secret=True,
        shown_default="{}",
    )
    certificate_users: Mapping[str, str] = setting(
        lambda: MappingProxyType({}),
        "EXTERNAL: client certificate -> user, `\"CN=app,O=Acme\" = \"alice\"` (a whole subject) or "
        "`app = \"alice\"` (a common name); a certificate not listed is the user named by its CN when that "
        "is a configured user (`users`, `security.roles` or a value here), else refused",
        kind="table",
        shown_default="{}",
    )
    workers: int = setting(
        1,
        "worker processes serving this listener on one port (`SO_REUSEPORT`, Linux), each a daemon of its "
        "own under a supervising parent; more than 1 needs `upstream.urls` and no journal",
        kind="int",
        minimum=1,
    )
    tls: ListenerTLS = section(ListenerTLS, "TLS on the client listener")
    login: ListenerLogin = section(ListenerLogin, "PLAIN checks: throttle per source address, queue, threads")

    @property
    def is_loopback(self) -> bool:
        return _is_loopback(self.host)

    @property
    def anonymous_allowed(self) -> bool:
        if "ANONYMOUS" not in self.sasl_mechanisms:
            return False
        return self.is_loopback if self.allow_anonymous is None else self.allow_anonymous

    @property
    def effective_mechanisms(self) -> tuple[str, ...]:
        """The mechanisms actually offered: ANONYMOUS only when allowed."""
        return tuple(m for m in self.sasl_mechanisms if m != "ANONYMOUS" or self.anonymous_allowed)


@dataclass(frozen=True)
class UpstreamTLS:
    ca_file: str = setting("", "PEM CA certificates trusted for the upstream broker (amqps:// URLs)", kind="str")
    cert_file: str = setting("", "PEM client certificate presented to the upstream broker", kind="str")
    key_file: str = setting("", "PEM private key of `cert_file`", kind="str")
    key_password: str = setting("", "password of an encrypted `key_file`", kind="str", secret=True)
    verify: str = setting(
        "peer-name",
        "upstream certificate check: `peer-name` (chain and host name), `peer` (chain only), `none`",
        kind="str",
        choices=("peer-name", "peer", "none"),
    )
    min_version: str = setting("TLSv1.2", "oldest TLS version offered to the upstream broker", kind="str",
                               choices=tuple(TLS_VERSIONS))
    ciphers: str = setting(
        INTERMEDIATE_CIPHERS, "TLS 1.2 cipher suites offered to the upstream broker, in OpenSSL's cipher-list "
        "syntax (TLS 1.3 suites are OpenSSL's defaults); the default is Mozilla's intermediate profile, as on "
        "the listener (a broker that accepts only older suites needs them named here)",
        kind="str", shown_default="Mozilla intermediate (ECDHE+AESGCM, ECDHE+CHACHA20)")


@dataclass(frozen=True)
class Reconnect:
    initial_delay: float = setting(
        0.5, "seconds before the first reconnect attempt", kind="float", minimum=0.001
    )
    max_delay: float = setting(30.0, "longest wait between attempts (seconds)", kind="float", minimum=0)
    multiplier: float = setting(2.0, "backoff growth factor per failed attempt", kind="float", minimum=1)
    jitter: float = setting(0.1, "random fraction added to each wait (0-1)", kind="float", minimum=0, maximum=1)

    def delay(self, attempt: int, rand: float = 0.0) -> float:
        """Seconds to wait before reconnect attempt `attempt` (0-based); `rand` in [0, 1) scales the jitter."""
        base = self.initial_delay * self.multiplier ** min(attempt, 64)
        return min(base, self.max_delay) * (1.0 + self.jitter * rand)


@dataclass(frozen=True)
class Upstream:
    urls: tuple[str, ...] = setting(
        (),
        "upstream broker URLs `amqp[s]://[user:pass@]host[:port]`, tried in order for failover; "
        "empty: the embedded in-memory broker",
        kind="list",
    )
    user: str = setting("", "SASL PLAIN user for URLs without one", kind="str")
    password: str = setting(
        "", "password of `user` (better from the environment, `BROKER_FILTER_UPSTREAM_PASSWORD`, or "
        "`password_file`, than in a URL on the command line)", kind="str", secret=True)
    password_file: str = setting("", "file holding `password` (its first line), instead of `password`", kind="str")
    credentials: str = setting(
        "configured",
        "`configured`: the proxy's own credentials (URL or user/password, else ANONYMOUS); "
        "`pass-through`: each client's PLAIN credentials open its own upstream connection (a client without a "
        "password, ANONYMOUS or EXTERNAL, is refused with amqp:unauthorized-access)",
        kind="str",
        choices=("configured", "pass-through"),
    )
    evaluates_selectors: bool | None = setting(
        None,
        "whether the upstream filters natively (selectors pushed down); `auto`: when it offers APACHE.ORG:SELECTOR",
        kind="tristate",
    )
    heartbeat: float = setting(
        60.0,
        "idle time-out of the upstream connection (AMQP heartbeats, seconds): nothing received for this long "
        "and the connection counts as lost and is reconnected; 0: off",
        kind="float",
        minimum=0,
    )
    answer_timeout: float = setting(
        5.0,
        "seconds the upstream may take to answer a session's begin or a link's attach: past it the waiting "
        "client link is refused and the upstream connection is reconnected",
        kind="float",
        minimum=0.1,
    )
    subscription_expiry: float = setting(
        60.0,
        "RabbitMQ 4 (3.x given `management_url`): seconds the queue the daemon declares for a subscription to "
        "`/topic/K`, `/exchange/X[/K]` or `/exchanges/X[/KEY]` outlives the loss of the upstream connection, "
        "collecting what is routed to it (its `x-expires`): back within it, the subscribers' links are served "
        "again with nothing missed; later, they are detached with the reason.  Also how long such a queue is "
        "left on the broker when the daemon dies without deleting it",
        kind="float",
        minimum=1,
    )
    management_url: str = setting(
        "",
        "RabbitMQ 3.x: its management plugin's HTTP API (`http[s]://host:15672`, the upstream's login), over which "
        "the daemon keeps JMS durable subscriptions on topics as queues on the broker, and declares the queue of "
        "each subscription to `/topic/` and `/exchange/` so that it outlives an upstream reconnect; empty: "
        "durable subscriptions kept by the daemon while its upstream connection lives, and subscriptions detached "
        "by a reconnect (RabbitMQ 4 needs none: its /management node is used)",
        kind="str",
    )
    tls: UpstreamTLS = section(UpstreamTLS, "TLS to the upstream broker")
    reconnect: Reconnect = section(Reconnect, "reconnect backoff")

    @property
    def embedded(self) -> bool:
        return not self.urls

    @property
    def redacted_urls(self) -> tuple[str, ...]:
        return tuple(redact_url(u) for u in self.urls)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={self.redacted_urls if f.name == 'urls' else getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.repr
        )
        return f"Upstream({shown})"


ROUTING_TYPES = ("anycast", "multicast")


@dataclass(frozen=True)
class AddressRule:
    """An `[[address_rules]]` table: `pattern` in AMQ wildcard syntax (`.` separates words, `*` one
    word, `#` zero or more words).  `broker_filter.proxy.routing` applies the rules."""

    pattern: str
    routing_type: str = ""  # "" leaves the choice to the client / upstream
    upstream: str = "{address}"  # `{address}` is replaced by the client's address


@dataclass(frozen=True)
class VirtualAddress:
    """A `[virtual_addresses.NAME]` table: an address whose messages are those of `upstream` that pass
    the filter.  `broker_filter.proxy.routing` routes to it, with the filter compiled once."""

    name: str
    upstream: str
    selector: str | None = None
    filter_set: Mapping[str, Any] | None = None  # the filter core's JSON form
    dialect: str = "jms"
    routing_type: str = ""

    def compile(self, limits: Limits | None = None) -> Any:
        """The filter as a `FilterSet` of the filter core (a selector becomes one selector entry, key
        `VIRTUAL_FILTER_KEY`), so it combines with a client's filter-set and can be pushed down;
        FilterError if invalid."""
        from .filters import compile_filter_set

        limits = limits or Limits()
        if self.selector is not None:
            spec: Any = {VIRTUAL_FILTER_KEY: {"descriptor": "apache.org:selector-filter:string", "value": self.selector}}
        else:
            spec = _thaw(self.filter_set)
        return compile_filter_set(
            spec, dialect=self.dialect, limits=limits.filter_limits(), max_depth=limits.nesting_depth
        )


VIRTUAL_FILTER_KEY = "broker-filter:virtual-address"


@dataclass(frozen=True)
class Limits:
    selector_length: int = setting(4096, "longest selector accepted, in characters", kind="int", minimum=1)
    nesting_depth: int = setting(
        32, "deepest nesting of parentheses and and/or/not filters accepted", kind="int", minimum=1
    )
    links_per_connection: int = setting(256, "links one client connection may attach", kind="int", minimum=1)
    connections: int = setting(1024, "client connections accepted at once", kind="int", minimum=1)
    connections_per_user: int = setting(
        0, "client connections one user (its login; ANONYMOUS clients are one user) may have at once; "
        "beyond, refused with amqp:resource-limit-exceeded (0: no limit)", kind="int", minimum=0)
    connections_per_address: int = setting(
        0, "client connections one source address may have at once (0: no limit)", kind="int", minimum=0)
    links_per_user: int = setting(
        0, "links one user may have attached over all its connections (0: no limit)", kind="int", minimum=0)
    unfinished_bytes: int = setting(
        64 * 1024 * 1024,
        "bytes of messages a client connection may have in transfer, not yet complete, over all its links; "
        "beyond, what arrives is dropped and the message refused with amqp:resource-limit-exceeded when "
        "complete (0: no limit)", kind="int", minimum=0)
    idle_timeout: float = setting(
        120.0,
        "seconds a client connection may stay silent (not even a heartbeat) before the daemon closes it; its "
        "open frame announces half of it as its idle time-out, so clients heartbeat in time (0: none); the "
        "default has clients heartbeat every 30 s, as RabbitMQ's default heartbeat does",
        kind="float", minimum=0)
    handshake_timeout: float = setting(
        10.0,
        "seconds a client connection has from accept to its AMQP open (TLS and SASL included); then it is "
        "closed and counted (refused: handshake-timeout)",
        kind="float",
        minimum=0.001,
    )
    upstream_window: int = setting(
        100,
        "messages a link may hold from upstream beyond its client's credit",
        kind="int",
        minimum=0,
    )
    subscription_index: bool = setting(
        True,
        "match each message of a shared upstream subscription against the links' filters through the "
        "subscription index; false: evaluate every link's filter (the reference behaviour)",
        kind="bool",
    )
    index_cache_size: int = setting(
        1024, "candidate lists a shared subscription's index remembers (0: no cache)", kind="int", minimum=0
    )
    max_message_size: int = setting(
        16 * 1024 * 1024,
        "largest message (encoded bytes) a client may publish; larger ones are refused with "
        "amqp:resource-limit-exceeded (0: unlimited)",
        kind="int",
        minimum=0,
    )
    kept_subscriptions: int = setting(
        1000,
        "durable subscriptions the daemon keeps for their subscribers in front of an upstream without "
        "named subscriptions (RabbitMQ 3.10; RabbitMQ 4 for non-topic addresses), attached or detached; "
        "a new one beyond is refused at its attach with amqp:resource-limit-exceeded (in front of "
        "RabbitMQ 4 a durable subscription on a topic is a queue on the broker and is not counted)",
        kind="int",
        minimum=1,
    )

    def filter_limits(self) -> Any:
        """These limits in the filter core's terms (`broker_filter.filters.parser.Limits`)."""
        from .filters.parser import Limits as FilterLimits

        return FilterLimits(max_length=self.selector_length, max_depth=self.nesting_depth)


@dataclass(frozen=True)
class Metrics:
    listen: str = setting(
        "",
        "`HOST:PORT` of the HTTP exporter (`/metrics`, `/healthz`, `/readyz`, `/links`); `:PORT` binds loopback "
        "(127.0.0.1); empty (the default): off, and the per-message path pays nothing for metrics",
        kind="hostport",
    )
    token: str = setting(
        "",
        "bearer token `/links` asks for (`Authorization: Bearer TOKEN`); only a request with it sees filter "
        "texts.  Without one, `/links` answers on a loopback listener only, filter texts hidden",
        kind="str", secret=True,
    )
    token_file: str = setting("", "file holding `token` (its first line), instead of `token`", kind="str")
    links_interval: float = setting(
        1.0, "seconds one `/links` report is served before the daemon's loop makes the next, whoever asks",
        kind="float", minimum=0,
    )
    links_limit: int = setting(1000, "links in one `/links` report (then `truncated`)", kind="int", minimum=1)
    snapshot_interval: float = setting(
        1.0, "seconds between two snapshots of the gauges (connections, links, held, credit, moves per "
        "address, upstream status): each walks every feed and link on the daemon's loop", kind="float",
        minimum=0.05)
    http_threads: int = setting(
        8, "requests the HTTP exporter answers at once (one thread each); more wait", kind="int", minimum=1,
        maximum=256,
    )
    request_timeout: float = setting(
        5.0, "seconds a client of the HTTP exporter has to send its request, and to take the answer; then the "
        "connection is dropped", kind="float", minimum=0.1,
    )
    filter_text_in_labels: bool = setting(
        False,
        "show the start of each filter's text in `broker_filter_costliest_filter_info` (anyone who scrapes "
        "sees it); false: its kind and hash only",
        kind="bool",
    )
    costliest_filters: int = setting(
        10,
        "filters shown by `broker_filter_costliest_filter_info` (the links' filters that took the most "
        "evaluation time); 0: none",
        kind="int",
        minimum=0,
    )
    address_labels: int = setting(
        100,
        "distinct `address` label values before further addresses are counted as `other`",
        kind="int",
        minimum=1,
    )

    @property
    def enabled(self) -> bool:
        return bool(self.listen)

    @property
    def host(self) -> str:
        return split_hostport(self.listen)[0] if self.listen else ""

    @property
    def port(self) -> int:
        return split_hostport(self.listen)[1] if self.listen else 0


@dataclass(frozen=True)
class Logging:
    format: str = setting("text", "`text` (one line per event) or `json` (one object per line)", kind="str",
                          choices=("text", "json"))
    level: str = setting("INFO", "DEBUG, INFO, WARNING, ERROR or CRITICAL", kind="str",
                         choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))


@dataclass(frozen=True)
class Shutdown:
    grace_period: float = setting(
        10.0,
        "seconds SIGTERM waits for in-flight settlements before links are detached; a second signal forces",
        kind="float",
        minimum=0,
    )


@dataclass(frozen=True)
class Embedded:
    default_routing_type: str = setting(
        "anycast", "routing type of addresses auto-created on first use", kind="str", choices=ROUTING_TYPES
    )
    max_messages: int = setting(1_000_000, "messages one address may hold (0: unlimited)", kind="int", minimum=0)
    max_bytes: int = setting(
        256 * 1024 * 1024, "bytes one address may hold (0: unlimited)", kind="int", minimum=0
    )
    max_total_bytes: int = setting(
        256 * 1024 * 1024,
        "bytes of messages every address together may hold; a publish beyond is refused with "
        "amqp:resource-limit-exceeded (0: unlimited)",
        kind="int", minimum=0)
    dead_letter_address: str = setting("", "where rejected messages go; empty: dropped", kind="str")


@dataclass(frozen=True)
class Journal:
    enabled: bool = setting(False, "append messages seen on `addresses` to Parquet files (needs the `journal` extra)", kind="bool")
    directory: str = setting("", "directory of the journal's Parquet files", kind="str")
    addresses: tuple[str, ...] = setting((), "addresses journaled (AMQ wildcards allowed); empty: all", kind="list")
    roll_bytes: int = setting(64 * 1024 * 1024, "roll a file after this many bytes", kind="int", minimum=1)
    roll_seconds: float = setting(300.0, "roll a file after this many seconds", kind="float", minimum=0.001)


@dataclass(frozen=True)
class ReplicasTLS:
    """How the replicas reach each other's listener when it speaks TLS (`listener.tls`): they connect
    as clients of that listener, so what they check and present is set here."""

    ca_file: str = setting(
        "", "PEM CA certificates the peers' listener certificates must chain to; empty: `listener.tls.ca_file`, "
        "else the system's trusted CAs", kind="str")
    verify: str = setting(
        "peer-name",
        "the peers' certificate check: `peer-name` (chain, and the peer's host as `replicas.peers` names it, "
        "or `server_name`, in the certificate) or `peer` (chain only)",
        kind="str", choices=("peer-name", "peer"))
    server_name: str = setting(
        "", "the name every peer's certificate must carry, checked instead of the peer's host (e.g. the one name "
        "a certificate the replicas share carries); with `replicas.dns`, empty: its NAME", kind="str")
    cert_file: str = setting(
        "", "PEM client certificate the replicas present to each other (a listener with `verify_client` asks "
        "for one); empty: the listener's own (`listener.tls.cert_file`, which must then allow client use)",
        kind="str")
    key_file: str = setting("", "PEM private key of `cert_file`", kind="str")
    key_password: str = setting("", "password of an encrypted `key_file`", kind="str", secret=True)
    min_version: str = setting("TLSv1.2", "oldest TLS version offered", kind="str", choices=tuple(TLS_VERSIONS))
    ciphers: str = setting(
        INTERMEDIATE_CIPHERS, "TLS 1.2 cipher suites offered, in OpenSSL's cipher-list syntax (TLS 1.3 suites "
        "are OpenSSL's defaults); the default is Mozilla's intermediate profile, as on the listener",
        kind="str", shown_default="Mozilla intermediate (ECDHE+AESGCM, ECDHE+CHACHA20)")


@dataclass(frozen=True)
class Replicas:
    peers: tuple[str, ...] = setting(
        (),
        "`HOST:PORT` of every replica's AMQP listener, this one's included; empty: off (one daemon, no owners)",
        kind="list",
    )
    dns: str = setting(
        "",
        "`NAME:PORT` instead of `peers`: NAME resolved every 5 s, each address found a replica listening on "
        "PORT (a Kubernetes headless Service)",
        kind="hostport",
    )
    self: str = setting("", "`HOST:PORT` of this replica in `peers` (as the others reach it; with `dns`, "
                        "its address as NAME resolves to it, e.g. the pod's IP)", kind="hostport")
    heartbeat: float = setting(
        2.0, "idle timeout (seconds) of the connections between replicas: a silent peer counts as gone after it",
        kind="float", minimum=0.1)
    user: str = setting("", "PLAIN user the replicas log in to each other with (empty: ANONYMOUS)", kind="str")
    password: str = setting("", "its password", kind="str", secret=True)
    splice: bool = setting(
        False,
        "a plain client connection whose first link is on a queue another replica owns (a receiver's source "
        "or a sender's target), sent with its open (pipelined, as rhea does), is spliced to the owner at the "
        "byte level: the owner ends the "
        "connection, as after a redirect, so it ends when the owner goes (the client reconnects); off, or "
        "otherwise, the link is served through the owner (a second AMQP hop, which carries on when the owner "
        "goes)",
        kind="bool")
    tls: ReplicasTLS = section(ReplicasTLS, "TLS between the replicas (with `listener.tls` on)")

    @property
    def enabled(self) -> bool:
        return bool(self.peers or self.dns)


@dataclass(frozen=True)
class SecuritySetting:
    """A `[[security.settings]]` table, in Artemis's vocabulary: `match` (an address pattern, AMQ
    wildcards) and the roles granted each operation.  `index` is its position in the file (named in
    refusals).  `broker_filter.authorization` decides with them."""

    index: int
    match: str
    send: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    browse: tuple[str, ...] = ()
    manage: tuple[str, ...] = ()
    durable: tuple[str, ...] = ()


@dataclass(frozen=True)
class Security:
    roles: Mapping[str, tuple[str, ...]] = setting(
        lambda: MappingProxyType({}),
        "`[security.roles]`: `user = [\"role\", ...]` (`anonymous` is the ANONYMOUS login); reloaded on SIGHUP",
        kind="table",
        shown_default="{}",
    )
    settings: tuple[SecuritySetting, ...] = setting(
        (),
        "`[[security.settings]]` tables: `match` (AMQ wildcards, RabbitMQ v1/v2 addresses) and the roles per "
        "permission `send`, `consume`, `browse`, `manage`, `durable`; the most specific match decides, what is "
        "not granted is refused; none: everything is allowed (docs/security.md); reloaded on SIGHUP",
        kind="table",
        shown_default="[]",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.settings)


@dataclass(frozen=True)
class Config:
    listener: Listener = section(Listener, "the AMQP listener clients connect to")
    upstream: Upstream = section(Upstream, "where messages come from and go to")
    address_rules: tuple[AddressRule, ...] = setting(
        (),
        "`[[address_rules]]` tables: `pattern` (AMQ wildcards), `routing_type` (anycast/multicast), "
        "`upstream` (rewrite, `{address}` = the client's address); first match wins",
        kind="table",
        shown_default="[]",
    )
    virtual_addresses: Mapping[str, VirtualAddress] = setting(
        lambda: MappingProxyType({}),
        "`[virtual_addresses.NAME]` tables: `upstream` address plus `selector` or `filter_set` (JSON form), "
        "optional `dialect`, `routing_type`; a client's own filters are ANDed",
        kind="table",
        shown_default="{}",
    )
    limits: Limits = section(Limits, "limits that protect the daemon")
    metrics: Metrics = section(Metrics, "Prometheus exporter and health endpoints")
    logging: Logging = section(Logging, "log output")
    shutdown: Shutdown = section(Shutdown, "SIGTERM behaviour")
    embedded: Embedded = section(Embedded, "the embedded in-memory broker (no upstream URLs)")
    journal: Journal = section(Journal, "message journal for the Spark pipeline")
    replicas: Replicas = section(Replicas, "replicas in front of one broker: one owner per queue")
    security: Security = section(Security, "who may do what on which address (Artemis's security-settings)")

    def to_dict(self) -> dict[str, Any]:
        """The effective configuration as plain data, secrets replaced by `***` (for `--print-config`)."""
        return _to_plain(self)


# --------------------------------------------------------------------------------------------------
# Helpers used by the settings


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_hostport(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT` or `:PORT` (all interfaces) -> (host, port).  ValueError says why."""
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]*):(\d+)", text.strip())
    if not match:
        raise ValueError(f"must be HOST:PORT, got {text!r}")
    host = match.group(1) or match.group(3) or "0.0.0.0"
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ValueError(f"port must be 0-65535, got {port}")
    return host, port


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(obj, Listener) and f.name == "users":
                out[f.name] = {name: "***" for name in value}
            elif f.metadata.get("secret"):
                out[f.name] = "***" if value else ""
            elif isinstance(obj, Upstream) and f.name == "urls":
                out[f.name] = list(obj.redacted_urls)
            else:
                out[f.name] = _to_plain(value)
        return out
    if isinstance(obj, Mapping):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [_to_plain(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------------
# Converting raw values


def _describe(value: Any) -> str:
    """A value for an error message, with passwords in URLs masked."""
    if isinstance(value, _Text):
        shown = redact_text(f"{str(value)!r}")
        return f"{shown} (from {value.origin})" if value.origin else shown
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return f"a {'table' if isinstance(value, dict) else 'list'}"
    return redact_text(repr(value))


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _convert(key: str, value: Any, meta: Mapping[str, Any]) -> Any:
    kind = meta["kind"]
    origin = f" (from {value.origin})" if isinstance(value, _Text) and value.origin else ""
    got = "" if meta.get("secret") else f", got {_describe(value)}"
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string{got or origin}")
        result = str(value)
        choices = meta.get("choices")
        if choices:
            folded = {c.lower(): c for c in choices}
            if result.lower() not in folded:
                raise ConfigError(key, f"must be one of {', '.join(choices)}{got}")
            result = folded[result.lower()]
        return result
    if kind in ("int", "port"):
        if isinstance(value, _Text):
            try:
                value = int(value.strip(), 10)
            except ValueError:
                raise ConfigError(key, f"must be an integer{got}") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(key, f"must be an integer{got}")
        if kind == "port":
            if not 0 <= value <= 65535:
                raise ConfigError(key, f"must be a port number 0-65535, got {value}{origin}")
            return value
        minimum, maximum = meta.get("minimum"), meta.get("maximum")
        if minimum is not None and value < minimum:
            word = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ConfigError(key, f"must be {word}, got {value}{origin}")
        if maximum is not None and value > maximum:
            raise ConfigError(key, f"must be <= {maximum:g}, got {value}{origin}")
        return value
    if kind == "float":
        if isinstance(value, _Text):
            try:
                value = float(value.strip())
            except ValueError:
                raise ConfigError(key, f"must be a number{got}") from None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise ConfigError(key, f"must be a number{got}")
        minimum, maximum = meta.get("minimum"), meta.get("maximum")
        if minimum is not None and value < minimum:
            raise ConfigError(key, f"must be >= {minimum:g}, got {value:g}{origin}")
        if maximum is not None and value > maximum:
            raise ConfigError(key, f"must be <= {maximum:g}, got {value:g}{origin}")
        return float(value)
    if kind in ("bool", "tristate"):
        if isinstance(value, str):
            text = value.strip().lower()
            if kind == "tristate" and text == "auto":
                return None
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        elif isinstance(value, bool):
            return value
        allowed = "true, false or auto" if kind == "tristate" else "true or false"
        raise ConfigError(key, f"must be {allowed}{got}")
    if kind == "list":
        if isinstance(value, _Text):
            items = [item.strip() for item in value.split(",") if item.strip()]
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            items = list(value)
        else:
            raise ConfigError(key, f"must be a list of strings{got}")
        choices = meta.get("choices")
        if choices:
            folded = {c.lower(): c for c in choices}
            for item in items:
                if item.lower() not in folded:
                    raise ConfigError(key, f"items must be among {', '.join(choices)}, got {item!r}")
            items = [folded[item.lower()] for item in items]
        return tuple(items)
    if kind == "hostport":
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a HOST:PORT string{got}")
        if not value.strip():
            return ""
        if key == "metrics.listen" and value.strip().startswith(":"):
            value = "127.0.0.1" + value.strip()  # (a bare port: the metrics listener binds loopback)
        try:
            host, port = split_hostport(value)
        except ValueError as e:
            raise ConfigError(key, f"{e}{origin}") from None
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    raise AssertionError(f"unknown kind {kind}")  # pragma: no cover - a programming error


def _build_section(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(prefix, f"must be a table, got {_describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in raw:
        if name not in fields:
            key = f"{prefix}.{name}" if prefix else str(name)
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(key, f"unknown setting{hint}")
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        key = f"{prefix}.{name}" if prefix else name
        kind = f.metadata["kind"]
        if kind == "section":
            values[name] = _build_section(f.default_factory, raw[name], key)
        elif kind == "table":
            values[name] = _TABLE_BUILDERS[(cls, name)](raw[name], key)
        else:
            values[name] = _convert(key, raw[name], f.metadata)
    return cls(**values)


def _build_users(raw: Any, key: str) -> Mapping[str, str]:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, "must be a table of `name = \"<password hash>\"`")
    users = {}
    for name, value in raw.items():
        if not name:
            raise ConfigError(key, "user names must not be empty")
        try:
            parse_password_hash(value)
        except PasswordHashError as e:
            raise ConfigError(f"{key}.{name}", str(e)) from None
        users[str(name)] = str(value)
    return MappingProxyType(users)


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def _build_rules(raw: Any, key: str) -> tuple[AddressRule, ...]:
    if not isinstance(raw, list):
        raise ConfigError(key, "must be an array of tables ([[address_rules]])")
    rules = []
    allowed = {"pattern", "routing_type", "upstream"}
    for i, item in enumerate(raw):
        here = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(here, "must be a table with `pattern`, optional `routing_type` and `upstream`")
        for name in item:
            if name not in allowed:
                raise ConfigError(f"{here}.{name}", "unknown setting (pattern, routing_type, upstream)")
        pattern = item.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{here}.pattern", "must be a non-empty address pattern such as `orders.#`")
        routing = _routing_type(item.get("routing_type", ""), f"{here}.routing_type")
        upstream = item.get("upstream", "{address}")
        if not isinstance(upstream, str) or not upstream:
            raise ConfigError(f"{here}.upstream", "must be a non-empty address template")
        for placeholder in _PLACEHOLDER.findall(upstream):
            if placeholder != "address":
                raise ConfigError(f"{here}.upstream", f"unknown placeholder {{{placeholder}}} (only {{address}})")
        rules.append(AddressRule(pattern, routing, upstream))
    return tuple(rules)


def _routing_type(value: Any, key: str) -> str:
    if value in ("",) + ROUTING_TYPES:
        return value
    raise ConfigError(key, f"must be anycast or multicast, got {_describe(value)}")


def _build_virtual(raw: Any, key: str) -> Mapping[str, VirtualAddress]:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, "must be a table of [virtual_addresses.NAME] tables")
    allowed = {"upstream", "selector", "filter_set", "dialect", "routing_type"}
    out = {}
    for name, item in raw.items():
        here = f"{key}.{name}"
        if not isinstance(item, Mapping):
            raise ConfigError(here, "must be a table with `upstream` and `selector` or `filter_set`")
        for field_name in item:
            if field_name not in allowed:
                raise ConfigError(f"{here}.{field_name}", f"unknown setting ({', '.join(sorted(allowed))})")
        upstream = item.get("upstream")
        if not isinstance(upstream, str) or not upstream:
            raise ConfigError(f"{here}.upstream", "must name the upstream address")
        if upstream == name:
            raise ConfigError(f"{here}.upstream", "must differ from the virtual address itself")
        selector, filter_set = item.get("selector"), item.get("filter_set")
        if (selector is None) == (filter_set is None):
            raise ConfigError(here, "needs exactly one of `selector` or `filter_set`")
        if filter_set is not None:
            if isinstance(filter_set, str):
                try:
                    filter_set = json.loads(filter_set)
                except ValueError as e:
                    raise ConfigError(f"{here}.filter_set", f"invalid JSON: {e}") from None
            if not isinstance(filter_set, Mapping) or not filter_set:
                raise ConfigError(f"{here}.filter_set", "must be a non-empty filter-set table (or its JSON text)")
        if selector is not None and not isinstance(selector, str):
            raise ConfigError(f"{here}.selector", "must be a string")
        dialect = item.get("dialect", "jms")
        if not isinstance(dialect, str):
            raise ConfigError(f"{here}.dialect", "must be a string")
        routing = _routing_type(item.get("routing_type", ""), f"{here}.routing_type")
        out[str(name)] = VirtualAddress(str(name), upstream, selector, _freeze(filter_set), dialect, routing)
    return MappingProxyType(out)


def _build_certificate_users(raw: Any, key: str) -> Mapping[str, str]:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, "must be a table of `\"CN=name,O=org\" = \"user\"` or `name = \"user\"`")
    out = {}
    for name, user in raw.items():
        here = f"{key}.{name}"
        if not str(name).strip():
            raise ConfigError(key, "a certificate subject or common name must not be empty")
        if not isinstance(user, str) or not user:
            raise ConfigError(here, "must be a user name (a non-empty string)")
        if "=" in str(name):
            try:
                normalize_subject(str(name))
            except ValueError as e:
                raise ConfigError(here, f"is not a certificate subject: {e}") from None
        out[str(name)] = user
    return MappingProxyType(out)


def _role_list(value: Any, key: str) -> tuple[str, ...]:
    """A list of role names, or Artemis's comma-separated string (`"admin, guest"`)."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(role, str) for role in value):
        raise ConfigError(key, f"must be a list of role names, got {_describe(value)}")
    for role in value:
        if not role.strip():
            raise ConfigError(key, "role names must not be empty")
    return tuple(dict.fromkeys(value))


def _build_roles(raw: Any, key: str) -> Mapping[str, tuple[str, ...]]:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, "must be a table of `user = [\"role\", ...]`")
    roles = {}
    for user, value in raw.items():
        if not user:
            raise ConfigError(key, "user names must not be empty")
        roles[str(user)] = _role_list(value, f"{key}.{user}")
    return MappingProxyType(roles)


def _build_security_settings(raw: Any, key: str) -> tuple[SecuritySetting, ...]:
    if not isinstance(raw, list):
        raise ConfigError(key, "must be an array of tables ([[security.settings]])")
    allowed = ("match",) + OPERATIONS
    out = []
    for i, item in enumerate(raw):
        here = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(here, f"must be a table with `match` and role lists ({', '.join(OPERATIONS)})")
        for name in item:
            if name in ARTEMIS_PERMISSIONS:
                raise ConfigError(f"{here}.{name}", f"Artemis's permission is not one of the daemon's: "
                                                    f"{ARTEMIS_PERMISSIONS[name]}")
            if name not in allowed:
                close = difflib.get_close_matches(str(name), list(allowed), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"{here}.{name}", f"unknown setting ({hint}{', '.join(allowed)})")
        match = item.get("match")
        if not isinstance(match, str) or not match:
            raise ConfigError(f"{here}.match", "must be a non-empty address pattern such as `orders.#`")
        try:
            pattern_node(match, "embedded")
        except PatternError as e:
            raise ConfigError(f"{here}.match", f"{match!r}: {e}") from None
        grants = {op: _role_list(item[op], f"{here}.{op}") for op in OPERATIONS if op in item}
        out.append(SecuritySetting(i, match, **grants))
    return tuple(out)


_TABLE_BUILDERS: dict[tuple[type, str], Callable[[Any, str], Any]] = {
    (Listener, "users"): _build_users,
    (Listener, "certificate_users"): _build_certificate_users,
    (Config, "address_rules"): _build_rules,
    (Config, "virtual_addresses"): _build_virtual,
    (Security, "roles"): _build_roles,
    (Security, "settings"): _build_security_settings,
}


def _check_security(config: Config) -> None:
    """The settings compile in every address model the daemon may decide them in: the embedded
    broker's, or in front of an upstream both RabbitMQ's and the AMQ-style one (the upstream's kind is
    known only once connected).  Two matches naming the same addresses are refused."""
    security = config.security
    if not security.settings:
        return
    if ANONYMOUS_USER in config.listener.users:
        raise ConfigError(f"listener.users.{ANONYMOUS_USER}", f"`{ANONYMOUS_USER}` is the ANONYMOUS login's name "
                          "in security.roles: give this PLAIN user another name")
    kinds = ("embedded",) if config.upstream.embedded else ("other", "rabbitmq")
    for kind in kinds:
        try:
            Permissions.from_config(config, kind)
        except PatternError as e:
            index = e.index if e.index is not None else 0
            where = " in front of RabbitMQ" if kind == "rabbitmq" else ""
            raise ConfigError(f"security.settings[{index}].match",
                              f"{security.settings[index].match!r}{where}: {e}") from None


def _check(config: Config) -> None:
    """Rules that span several settings."""
    listener = config.listener
    if not listener.sasl_mechanisms:
        raise ConfigError("listener.sasl_mechanisms", "must offer at least one mechanism")
    tls = listener.tls
    _check_cert_and_key(tls, "listener.tls")
    if tls.verify_client and not tls.ca_file:
        raise ConfigError("listener.tls.ca_file", "is required with listener.tls.verify_client")
    if "EXTERNAL" in listener.sasl_mechanisms and not tls.verify_client:
        raise ConfigError("listener.sasl_mechanisms", "EXTERNAL needs listener.tls.verify_client = true")
    external_users = listener.users or listener.certificate_users or config.security.roles
    if "EXTERNAL" in listener.sasl_mechanisms and not external_users:
        raise ConfigError("listener.certificate_users", "EXTERNAL maps a client certificate to a configured user: "
                          "list them here (or name them in listener.users or security.roles); with none, every "
                          "certificate is refused")
    if listener.login.max_delay < listener.login.delay:
        raise ConfigError("listener.login.max_delay", "must be >= listener.login.delay")
    for name in ("cert_file", "key_file", "ca_file", "crl_file"):
        _check_file(f"listener.tls.{name}", getattr(tls, name))
    if tls.crl_file and not tls.verify_client:
        raise ConfigError("listener.tls.crl_file", "needs listener.tls.verify_client = true (it is checked against "
                          "client certificates)")
    if tls.enabled:
        _check_tls(tls, "listener.tls", groups=tls.groups, crl_file=tls.crl_file)
    upstream = config.upstream
    if upstream.credentials == "pass-through" and "PLAIN" not in listener.sasl_mechanisms:
        raise ConfigError("upstream.credentials", "pass-through needs PLAIN in listener.sasl_mechanisms")
    if upstream.credentials == "pass-through" and upstream.embedded:
        raise ConfigError("upstream.credentials", "pass-through needs upstream.urls (the embedded broker has no users)")
    can_authenticate = (
        listener.anonymous_allowed
        or ("PLAIN" in listener.sasl_mechanisms and (listener.users or upstream.credentials == "pass-through"
                                                     or (config.replicas.enabled and config.replicas.user)))
        or ("EXTERNAL" in listener.sasl_mechanisms and external_users)
    )
    if not can_authenticate:
        if "ANONYMOUS" not in listener.sasl_mechanisms:
            why = "ANONYMOUS is not in listener.sasl_mechanisms"
        elif listener.allow_anonymous is False:
            why = "ANONYMOUS is off (listener.allow_anonymous = false)"
        else:
            why = (f"ANONYMOUS is off on {listener.host} (not loopback; set listener.allow_anonymous = true "
                   "to allow it)")
        raise ConfigError(
            "listener.users",
            f"no client could log in: {why}, and there are no PLAIN users and no pass-through",
        )
    for i, url in enumerate(upstream.urls):
        _check_url(f"upstream.urls[{i}]", url)
    if upstream.password and not upstream.user:
        raise ConfigError("upstream.user", "is required with upstream.password")
    for name in ("ca_file", "cert_file", "key_file"):
        _check_file(f"upstream.tls.{name}", getattr(upstream.tls, name))
    _check_tls(upstream.tls, "upstream.tls")
    if upstream.reconnect.max_delay < upstream.reconnect.initial_delay:
        raise ConfigError("upstream.reconnect.max_delay", "must be >= upstream.reconnect.initial_delay")
    if listener.workers > 1 and not config.upstream.urls:
        raise ConfigError("listener.workers", "several workers need an upstream broker (upstream.urls): the "
                          "embedded broker's addresses live in one process")
    if listener.workers > 1 and config.journal.enabled:
        raise ConfigError("listener.workers", "several workers cannot share one journal (journal.enabled)")
    if config.journal.enabled and not config.journal.directory:
        raise ConfigError("journal.directory", "is required when journal.enabled = true")
    if config.journal.enabled:
        _check_extra("journal.enabled", "journal", "pyarrow")
    _check_replicas(config)
    _check_metrics(config.metrics)
    _check_security(config)
    for name, virtual in config.virtual_addresses.items():
        if not name:
            raise ConfigError("virtual_addresses", "names must not be empty")
        from .filters import FilterError, get_dialect

        what = "selector" if virtual.selector is not None else "filter_set"
        try:
            get_dialect(virtual.dialect)
        except FilterError as e:
            raise ConfigError(f"virtual_addresses.{name}.dialect", e.message) from None
        try:
            compiled = virtual.compile(config.limits)
        except FilterError as e:
            raise ConfigError(f"virtual_addresses.{name}.{what}", e.describe()) from None
        for ignored in compiled.ignored:
            raise ConfigError(f"virtual_addresses.{name}.{what}", f"entry {ignored.key!r}: {ignored.reason}")
        if not compiled.entries:
            raise ConfigError(f"virtual_addresses.{name}.{what}", "applies no filter")


def _check_replicas(config: Config) -> None:
    replicas = config.replicas
    if replicas.dns:
        if replicas.peers:
            raise ConfigError("replicas.dns", "names the replicas instead of replicas.peers: set one of them")
        if not replicas.self:
            raise ConfigError("replicas.self", "is required with replicas.dns: this replica's address and port")
        if split_hostport(replicas.dns)[1] == 0:
            raise ConfigError("replicas.dns", f"needs a port other than 0, got {replicas.dns!r}")
        _check_replicas_with(config)
        return
    if not replicas.peers:
        if replicas.self:
            raise ConfigError("replicas.self", "needs replicas.peers (the list it is one of)")
        return
    peers = []
    for i, peer in enumerate(replicas.peers):
        try:
            host, port = split_hostport(peer)
        except ValueError as e:
            raise ConfigError(f"replicas.peers[{i}]", str(e)) from None
        if port == 0:
            raise ConfigError(f"replicas.peers[{i}]", f"needs a port other than 0, got {peer!r}")
        peers.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if len(set(peers)) != len(peers):
        raise ConfigError("replicas.peers", "names a replica twice")
    if not replicas.self:
        raise ConfigError("replicas.self", "is required with replicas.peers: which of them this replica is")
    if replicas.self not in peers:
        raise ConfigError("replicas.self", f"{replicas.self} is not in replicas.peers ({', '.join(peers)})")
    _check_replicas_with(config)


def _check_replicas_with(config: Config) -> None:
    """What replicas cannot be combined with."""
    replicas = config.replicas
    if config.listener.tls.enabled:
        _check_replicas_tls(config)
    else:
        for f in dataclasses.fields(ReplicasTLS):
            if getattr(replicas.tls, f.name) != getattr(_REPLICAS_TLS_DEFAULTS, f.name):
                raise ConfigError(f"replicas.tls.{f.name}", "needs listener.tls: the replicas reach each other's "
                                  "listener, and speak TLS to it only when it does")
    if not config.upstream.urls:
        raise ConfigError("replicas.peers", "replicas need an upstream broker (upstream.urls): the embedded "
                          "broker's queues live in one process")
    if config.upstream.credentials == "pass-through":
        raise ConfigError("replicas.peers", "replicas cannot be combined with upstream.credentials = pass-through")
    if config.listener.workers > 1:
        raise ConfigError("replicas.peers", "replicas cannot be combined with listener.workers > 1")
    if replicas.password and not replicas.user:
        raise ConfigError("replicas.user", "is required with replicas.password")
    if not replicas.user and not config.listener.is_loopback:
        raise ConfigError("replicas.user", f"is required when the listener is beyond loopback "
                          f"({config.listener.host}): replicas are recognised by their login, and without one any "
                          "client that reaches the listener could pass for a replica")
    if not replicas.user:
        return
    # The replicas log in to each other with replicas.user and replicas.password (PLAIN).  The
    # listener accepts that login from listener.users when the user is there (its hash wins), else
    # from a hash of replicas.password made at start (app.listener_users): a deployment needs no hash.
    if not replicas.password:
        raise ConfigError("replicas.password", f"is required with replicas.user ({replicas.user!r}): the replicas "
                          "log in to each other with it")
    if "PLAIN" not in config.listener.sasl_mechanisms:
        raise ConfigError("listener.sasl_mechanisms", "needs PLAIN with replicas.user: the replicas log in to each "
                          "other with it")
    if replicas.user == ANONYMOUS_USER and config.security.settings:
        raise ConfigError("replicas.user", f"`{ANONYMOUS_USER}` is the ANONYMOUS login's name in security.roles: "
                          "give the replicas' login another name")
    stored = config.listener.users.get(replicas.user)
    if stored is not None and not parse_password_hash(stored).verify(replicas.password):
        raise ConfigError("replicas.password", f"is not the password of listener.users.{replicas.user}, whose hash "
                          "the listener checks the replicas' login against: the replicas could not log in to each "
                          "other (remove that entry to have the listener take replicas.password alone)")


_REPLICAS_TLS_DEFAULTS = ReplicasTLS()


def _check_replicas_tls(config: Config) -> None:
    """With `listener.tls`, the replicas connect to each other over TLS (`replicas.tls`): what they
    check and present must load, as the daemon will load it (`security.replica_ssl_context`)."""
    import ssl

    from .security import replica_ssl_context

    replicas, tls = config.replicas, config.replicas.tls
    if replicas.splice:
        raise ConfigError("replicas.splice", "cannot be combined with listener.tls: a spliced connection's bytes "
                          "would go to the owner as they came, and its TLS ends on the replica that accepted it "
                          "(turn replicas.splice off: links are then served through the owner, over the "
                          "replicas' TLS connections)")
    _check_cert_and_key(tls, "replicas.tls")
    if tls.key_password and not tls.key_file:
        raise ConfigError("replicas.tls.key_file", "is required with replicas.tls.key_password")
    if tls.verify == "peer" and tls.server_name:
        raise ConfigError("replicas.tls.server_name", "is not checked with replicas.tls.verify = peer (set "
                          "verify = peer-name, or leave server_name empty)")
    for name in ("ca_file", "cert_file", "key_file"):
        _check_file(f"replicas.tls.{name}", getattr(tls, name))
    _check_tls(tls, "replicas.tls")
    ca = tls.ca_file or config.listener.tls.ca_file
    ca_key = "replicas.tls.ca_file" if tls.ca_file else "listener.tls.ca_file"
    cert = tls.cert_file or config.listener.tls.cert_file
    cert_key = "replicas.tls.cert_file" if tls.cert_file else "listener.tls.cert_file"
    key_key = "replicas.tls.key_file" if tls.cert_file else "listener.tls.key_file"
    if ca:
        try:
            ssl.create_default_context(cafile=ca)
        except (ssl.SSLError, OSError, ValueError):
            raise ConfigError(ca_key, f"{ca} holds no PEM CA certificate (the replicas check each other's "
                              "certificates against it)") from None
    if not _holds_pem(cert, "CERTIFICATE"):
        raise ConfigError(cert_key, f"{cert} holds no PEM certificate (the replicas present it to each other)")
    try:
        replica_ssl_context(tls, config.listener.tls)
    except (ssl.SSLError, OSError, ValueError):
        raise ConfigError(key_key, f"does not hold the private key of {cert} (or its key password does not "
                          "open it): the replicas present that certificate to each other") from None
    except TlsSettingError as e:
        raise ConfigError(f"replicas.tls.{e.key}", e.reason) from None


def _holds_pem(path: str, label: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f"-----BEGIN {label}-----".encode() in f.read(1 << 20)
    except OSError:
        return False


def _check_cert_and_key(tls: Any, prefix: str) -> None:
    """A certificate needs its key, and a key its certificate."""
    if tls.cert_file and not tls.key_file:
        raise ConfigError(f"{prefix}.key_file", f"is required with {prefix}.cert_file")
    if tls.key_file and not tls.cert_file:
        raise ConfigError(f"{prefix}.cert_file", f"is required with {prefix}.key_file")


def _check_tls(tls: Any, prefix: str, *, groups: tuple[str, ...] = (), crl_file: str = "") -> None:
    """The TLS settings OpenSSL must accept (`ciphers`; a listener's `groups` and `crl_file`), tried
    on a context of their own."""
    import ssl

    from .security import harden

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        harden(context, tls, groups)
    except TlsSettingError as e:
        raise ConfigError(f"{prefix}.{e.key}", e.reason) from None
    if crl_file:
        try:
            context.load_verify_locations(crl_file)
        except (ssl.SSLError, OSError):
            raise ConfigError(f"{prefix}.crl_file", f"{crl_file} holds no PEM certificate revocation list") from None


def _check_metrics(metrics: Metrics) -> None:
    if metrics.token and not re.fullmatch(r"[\x21-\x7e]+", metrics.token):
        raise ConfigError("metrics.token", "must be printable ASCII without spaces (it is sent in an HTTP header)")


def _check_extra(key: str, extra: str, module: str) -> None:
    """The setting needs `module`, which the package's `[extra]` brings (found without importing it)."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(key, f"needs the [{extra}] extra (pip install 'broker-filter[{extra}]'): "
                               f"{module} is not installed")


def _check_file(key: str, path: str) -> None:
    if path and not os.path.isfile(path):
        raise ConfigError(key, f"file not found: {path}")


_URL_HINT = "(in a user name or password, @ : / ? # and % are written percent-encoded: %40 %3A %2F %3F %23 %25)"


def _check_url(key: str, url: str) -> None:
    # The messages are ours, never the parser's: its text may quote a piece of the password.
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(key, f"is not a URL amqp[s]://[user:pass@]host[:port]: {shown} {_URL_HINT}") from None
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(key, f"port must be a number 1-65535: {shown} {_URL_HINT}") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigError(key, f"must be an amqp:// or amqps:// URL, got {shown}")
    if not parts.hostname:
        raise ConfigError(key, f"has no host: {shown} {_URL_HINT}")
    if port == 0:
        raise ConfigError(key, f"port must be 1-65535: {shown}")


# --------------------------------------------------------------------------------------------------
# Loading


def _leaves(cls: type = Config, prefix: str = "") -> Any:
    """(dotted key, field) for every setting, sections expanded, in declaration order."""
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if f.metadata.get("kind") == "section":
            yield from _leaves(f.default_factory, key + ".")
        elif "kind" in f.metadata:
            yield key, f


def env_name(key: str) -> str:
    return ENV_PREFIX + key.replace(".", "_").upper()


def _set(raw: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = raw
    walked = []
    for part in parents:
        walked.append(part)
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(walked), f"must be a table, got {_describe(child)}")
        node = child
    node[last] = value


def read_file(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("config", f"file not found: {path}") from None
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("config", f"{path}: invalid TOML: {e}") from None


def load(args: argparse.Namespace | None = None, environ: Mapping[str, str] = os.environ, *,
         check: bool = True) -> Config:
    """The effective configuration: defaults < TOML file < environment < command-line flags.
    `check=False` skips the checks across settings (what `serve` would refuse to start with)."""
    for name, reason in RETIRED_ENV.items():
        if name in environ:
            raise ConfigError(f"environment variable {name}", reason)
    path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    raw: dict = read_file(path) if path else {}
    leaves = dict(_leaves())
    for key, f in leaves.items():
        if not f.metadata["env"]:
            continue
        name = env_name(key)
        if name in environ:
            _set(raw, key, _Text(environ[name], f"environment variable {name}"))
    if args is not None:
        _apply_flags(raw, args, leaves)
    config = _build_section(Config, raw, "")
    config = _read_secret_files(config)
    if check:
        _check(config)
    return config


def _read_secret_files(config: Config) -> Config:
    """`metrics.token_file` and `upstream.password_file` read into `metrics.token`, `upstream.password`."""
    metrics, upstream = config.metrics, config.upstream
    if metrics.token_file:
        token = _read_secret("metrics.token_file", metrics.token_file, "metrics.token", metrics.token)
        config = dataclasses.replace(config, metrics=dataclasses.replace(metrics, token=token))
    if upstream.password_file:
        password = _read_secret("upstream.password_file", upstream.password_file, "upstream.password",
                                upstream.password)
        config = dataclasses.replace(config, upstream=dataclasses.replace(upstream, password=password))
    return config


def _read_secret(key: str, path: str, other: str, given: str) -> str:
    """The first line of the file `path` (its line end dropped); never shown in a message."""
    if given:
        raise ConfigError(key, f"and {other} are both set: set one of them")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.readline(64 * 1024)
    except FileNotFoundError:
        raise ConfigError(key, f"file not found: {path}") from None
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(key, f"{path} is not UTF-8 text") from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(key, f"{path} is empty (the secret is its first line)")
    return secret


_SECRET_KEYS = ("listener.tls.key_password", "listener.users", "upstream.password", "replicas.password",
                "replicas.tls.key_password", "metrics.token")


def file_warnings(path: str | None) -> list[str]:
    """Warnings about the configuration file itself: readable by others (group or world) while it holds
    a secret (a password, a key's password, a token, password hashes, a URL with a password)."""
    if not path:
        return []
    try:
        mode = os.stat(path).st_mode
        raw = read_file(path)
    except (OSError, ConfigError):
        return []
    if not mode & 0o077:
        return []
    held = []
    for key in _SECRET_KEYS:
        node: Any = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node:
            held.append(key)
    urls = raw.get("upstream", {}).get("urls") if isinstance(raw.get("upstream"), Mapping) else None
    if isinstance(urls, list) and any(isinstance(u, str) and redact_url(u) != u for u in urls):
        held.append("upstream.urls (a password)")
    if not held:
        return []
    return [f"the configuration file {path} is readable by others (mode {mode & 0o777:o}) and holds secrets "
            f"({', '.join(held)}): make it readable by its owner only (chmod 600), or move the secrets to "
            "files of their own (upstream.password_file, metrics.token_file) or the environment"]


def _apply_flags(raw: dict, args: argparse.Namespace, leaves: Mapping[str, Any]) -> None:
    listen = getattr(args, "listen", None)
    if listen is not None:
        try:
            host, port = split_hostport(listen)
        except ValueError as e:
            raise ConfigError("--listen", str(e)) from None
        _set(raw, "listener.host", host)
        _set(raw, "listener.port", port)
    upstream = getattr(args, "upstream", None)
    if upstream is not None:
        urls = [u for u in upstream if u]
        _set(raw, "upstream.urls", urls)
    for flag, key in (("metrics", "metrics.listen"), ("log_format", "logging.format"), ("log_level", "logging.level"),
                      ("workers", "listener.workers")):
        value = getattr(args, flag, None)
        if value is not None:
            _set(raw, key, _Text(value, f"--{flag.replace('_', '-')}"))
    for item in getattr(args, "set", None) or ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ConfigError(key or "--set", "--set needs KEY=VALUE")
        if key in leaves and leaves[key].metadata["kind"] != "table":
            _set(raw, key, _Text(value, "--set"))
            continue
        # Table-valued keys take an inline TOML value: --set 'listener.users={alice="$scrypt$..."}'
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(key, f"--set value is not a TOML value: {e}") from None
        _set(raw, key, parsed)


@dataclass(frozen=True)
class Reloaded:
    """What `reload_security` read: `config` is the running configuration with the file's users, roles
    and settings (None when the file has an error: then `error` says why and the old ones stay);
    `ignored` lists the other keys whose value changed, which need a restart."""

    config: Config | None
    error: ConfigError | None = None
    ignored: tuple[str, ...] = ()


_RELOADED = ("listener.users", "security.roles", "security.settings")


def _value(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def reload_security(current: Config, args: argparse.Namespace | None = None,
                    environ: Mapping[str, str] = os.environ) -> Reloaded:
    """On SIGHUP: read the configuration again (the same file, environment and flags as at start) and
    take its `listener.users`, `security.roles` and `security.settings`; everything else stays as it
    runs.  A configuration error returns `Reloaded(None, error)`: the daemon keeps the old settings and
    logs the error (it names the key)."""
    try:
        fresh = load(args, environ)
        merged = dataclasses.replace(
            current, listener=dataclasses.replace(current.listener, users=fresh.listener.users),
            security=fresh.security)
        _check(merged)
    except ConfigError as e:
        return Reloaded(None, e)
    ignored = tuple(key for key, _ in _leaves() if key not in _RELOADED and _value(fresh, key) != _value(current, key))
    return Reloaded(merged, None, ignored)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The configuration flags of `broker-filter serve`."""
    group = parser.add_argument_group("configuration (flags override BROKER_FILTER_* variables override the file)")
    group.add_argument("--config", metavar="PATH", help=f"TOML configuration file (also ${CONFIG_ENV})")
    group.add_argument("--listen", metavar="HOST:PORT", help="AMQP listener address (default 127.0.0.1:5672)")
    group.add_argument(
        "--upstream",
        metavar="URL",
        action="append",
        help="upstream broker amqp[s]://[user:pass@]host[:port]; repeat for failover (default: embedded broker)",
    )
    group.add_argument("--metrics", metavar="HOST:PORT", help="HTTP exporter for /metrics, /healthz, /readyz")
    group.add_argument("--workers", metavar="N", help="worker processes on the listener's port (listener.workers)")
    group.add_argument("--log-format", choices=("text", "json"), help="log line format (default text)")
    group.add_argument(
        "--log-level", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), help="default INFO"
    )
    group.add_argument("--set", metavar="KEY=VALUE", action="append", help="any setting by its dotted key")
    group.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as JSON (secrets masked) and exit 0; what serve would refuse "
        "in it is said on standard error",
    )


def load_for_cli(args: argparse.Namespace, environ: Mapping[str, str] = os.environ, *, stderr: Any = None) -> Config:
    """`load` for a command: a bad value prints `broker-filter: config error: KEY: REASON` and exits 2;
    `--print-config` prints the effective configuration and exits 0, and when `serve` would refuse
    to start with it (no client could log in, ...) says why on standard error."""
    stderr = stderr or sys.stderr
    printing = bool(getattr(args, "print_config", False))
    try:
        config = load(args, environ, check=not printing)
    except ConfigError as e:
        print(f"broker-filter: config error: {e}", file=stderr)
        raise SystemExit(ConfigError.exit_code) from None
    for warning in file_warnings(getattr(args, "config", None) or environ.get(CONFIG_ENV)):
        print(f"broker-filter: warning: {warning}", file=stderr)
    if printing:
        print(json.dumps(config.to_dict(), indent=2))
        try:
            _check(config)
        except ConfigError as e:
            print(f"broker-filter: serve would refuse this configuration: {e}", file=stderr)
        raise SystemExit(0)
    return config


# --------------------------------------------------------------------------------------------------
# Reference documentation


def _shown_default(f: dataclasses.Field) -> str:
    meta = f.metadata
    if meta.get("shown_default") is not None:
        return meta["shown_default"]
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if meta["kind"] == "tristate" and value is None:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def reference_table() -> str:
    """The Markdown table of every setting: key, environment variable, default, meaning."""
    lines = ["| key | environment variable | default | meaning |", "|---|---|---|---|"]
    for key, f in _leaves():
        env = f"`{env_name(key)}`" if f.metadata["env"] else "(file or `--set`)"
        doc = f.metadata["doc"].replace("|", "\\|")
        default = _shown_default(f).replace("|", "\\|")
        lines.append(f"| `{key}` | {env} | `{default}` | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_table())
