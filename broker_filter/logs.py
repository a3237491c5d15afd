"""Structured logs: one line per event, as text or JSON, carrying connection and link ids.

Theory of operation.  Modules log through the standard `logging` module; nothing is configured at
import.  The daemon calls `configure()` once at start-up (from `[logging]` of the configuration);
it installs one handler on the root logger, replacing the one a previous call installed.

Context travels with the logger: `bind(log, conn="c7", link="l3")` returns a logger whose lines
carry those ids; keyword arguments become fields (`log.info("attached", address="orders")`).  Code
that handles one connection's events can also set an ambient context for everything logged meanwhile
(`token = enter(resolve, event)` ... `leave(token)`): `resolve(event)` -> {"conn": ..., "link": ...}
runs only when a line is actually written, so setting it costs next to nothing per event.

Secrets never reach the output: the formatter masks passwords in URLs (`amqp://user:***@host`)
and every secret string registered with `configure(secrets=...)` (the configured passwords), in the
message, the fields and exception text alike.  Message bodies are never logged: a field named
`body` is dropped.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, TextIO

from .security import REDACTED, redact_text

CONTEXT_KEYS = ("conn", "link")
_FORBIDDEN_FIELDS = frozenset({"body"})
_LOGGING_KWARGS = frozenset({"exc_info", "stack_info", "stacklevel", "extra"})
_HANDLER_MARK = "_broker_filter_handler"
_AMBIENT: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("broker_filter_log_context", default=None)


def enter(resolve: Any, subject: Any) -> contextvars.Token:
    """Set the ambient context: lines logged until `leave(token)` carry `resolve(subject)`'s ids."""
    return _AMBIENT.set((resolve, subject))


def leave(token: contextvars.Token) -> None:
    _AMBIENT.reset(token)


def _ambient() -> Mapping[str, Any]:
    current = _AMBIENT.get()
    if current is None:
        return {}
    resolve, subject = current
    try:
        return resolve(subject) or {}
    except Exception:  # noqa: BLE001 - a log line must never fail for its context
        return {}


class Redactor:
    """Masks URL passwords and known secret strings."""

    def __init__(self, secrets: Iterable[str] = ()):
        # Longest first, so a secret containing another is masked whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        text = redact_text(text)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


class _Formatter(logging.Formatter):
    def __init__(self, redactor: Redactor):
        super().__init__()
        self._redact = redactor

    @staticmethod
    def timestamp(record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{seconds}.{int(record.msecs):03d}Z"

    @staticmethod
    def context(record: logging.LogRecord) -> dict[str, Any]:
        out = {}
        ambient = getattr(record, "_broker_filter_ambient", None)
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is None and ambient:
                value = ambient.get(key)
            if value is not None:
                out[key] = value
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                if key not in _FORBIDDEN_FIELDS and key not in out:
                    out[key] = value
        return out

    def exception_text(self, record: logging.LogRecord) -> str:
        if record.exc_info:
            return self.formatException(record.exc_info)
        return record.exc_text or ""


class TextFormatter(_Formatter):
    """`2026-01-01T12:00:00.000Z INFO broker_filter.proxy: message conn=c1 link=l2 key=value`"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{self.timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"]
        for key, value in self.context(record).items():
            text = str(value)
            if not text or any(c.isspace() or c in '"=' for c in text):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        line = " ".join(parts)
        exc = self.exception_text(record)
        if exc:
            line += "\n" + exc
        return self._redact(line)


class JSONFormatter(_Formatter):
    """One JSON object per line: ts, level, logger, msg, conn, link, fields..., exc."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": self.timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in self.context(record).items():
            obj.setdefault(key, value if isinstance(value, (int, float, bool)) or value is None else str(value))
        exc = self.exception_text(record)
        if exc:
            obj["exc"] = exc
        return self._redact(json.dumps(obj, ensure_ascii=False))


class EventLogger(logging.LoggerAdapter):
    """A logger with bound context (connection and link ids) whose keyword arguments become fields."""

    def __init__(self, logger: logging.Logger, context: Mapping[str, Any] | None = None):
        super().__init__(logger, dict(context or {}))

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k not in _LOGGING_KWARGS}
        extra = dict(kwargs.get("extra") or {})
        for key in CONTEXT_KEYS:
            if key in self.extra:
                extra.setdefault(key, self.extra[key])
            if key in fields:
                extra[key] = fields.pop(key)
        bound = {k: v for k, v in self.extra.items() if k not in CONTEXT_KEYS}
        extra["fields"] = {**bound, **dict(extra.get("fields") or {}), **fields}
        kwargs["extra"] = extra
        return msg, kwargs

    def bind(self, **context: Any) -> EventLogger:
        return EventLogger(self.logger, {**self.extra, **context})


def _capture_ambient(record: logging.LogRecord) -> bool:
    """Resolve the ambient context while the event it describes is still being handled."""
    if not hasattr(record, "_broker_filter_ambient"):
        record._broker_filter_ambient = _ambient()
    return True


def bind(logger: logging.Logger | EventLogger | str, **context: Any) -> EventLogger:
    """`logger` with context ids (conn, link) and fields attached to every line."""
    if isinstance(logger, EventLogger):
        return logger.bind(**context)
    if isinstance(logger, str):
        logger = logging.getLogger(logger)
    return EventLogger(logger, context)


def configure(
    format: str = "text",  # noqa: A002 - the configuration key's name
    level: str | int = "INFO",
    *,
    stream: TextIO | None = None,
    secrets: Iterable[str] = (),
) -> logging.Handler:
    """Install the daemon's log handler on the root logger (replacing a previous one); returns it."""
    if format not in ("text", "json"):
        raise ValueError(f"log format must be text or json, got {format!r}")
    redactor = Redactor(secrets)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JSONFormatter(redactor) if format == "json" else TextFormatter(redactor))
    handler.addFilter(_capture_ambient)
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    return handler


def configure_from(config: Any, *, stream: TextIO | None = None) -> logging.Handler:
    """`configure` from a `broker_filter.config.Config`, registering its secrets for masking."""
    return configure(config.logging.format, config.logging.level, stream=stream, secrets=config_secrets(config))


def config_secrets(config: Any) -> list[str]:
    """Every secret string of a configuration: passwords, key passwords, passwords inside URLs."""
    from urllib.parse import urlsplit

    secrets = [
        config.upstream.password,
        config.upstream.tls.key_password,
        config.listener.tls.key_password,
        config.replicas.tls.key_password,
        config.replicas.password,
        config.metrics.token,
        *config.listener.users.values(),
    ]
    for url in config.upstream.urls:
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            secrets.append(password)
    return [s for s in secrets if s]


def unconfigure() -> None:
    """Remove the handler `configure` installed (tests, embedding)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
