"""OASIS AMQP Filter Expressions (filtex): the properties filter and the application-properties filter.

Theory of operation
-------------------
A property filter is a described map of reference values; a message passes when every entry
matches (filtex §4.2.4 for the properties section, symbol keys; §4.2.5 for application-properties,
string keys).  A reference value matches the message's value when (filtex WD09 §4.1.1, as RabbitMQ
4.1+ implements it in `rabbit_amqp_filter_prop.erl`):

* it is NULL: any value matches, but the field must be present;
* it is a string starting `&p:` (prefix) or `&s:` (suffix): the message's value is a string (or
  symbol) that starts or ends with the rest, compared exactly (byte for byte in UTF-8); `&&` stands
  for a leading `&`; any other leading `&` makes the filter invalid;
* both are numbers (integer or floating point of any AMQP width): equal as numbers
  (uint 10 matches double 10.0);
* otherwise the values are equal: strings and symbols by their text, binary by bytes, booleans only
  with booleans, timestamps and uuids by value.

The properties filter checks each field's reference type when it is compiled: `message-id` and
`correlation-id` take ulong, uuid, binary or string; `user-id` binary; `to`, `subject`, `reply-to`,
`group-id`, `reply-to-group-id` strings; `content-type`, `content-encoding` symbols; the two times
timestamps; `group-sequence` uint.  A wrong type, an unknown field, an empty map or more than
`MAX_FIELDS` entries make the filter invalid (`FilterError`, which refuses the link).  A filter
evaluates to True or False, never UNKNOWN.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..amqp.types import Described, symbol, timestamp, uint, ulong
from .base import Filter
from .errors import FilterError
from .index import APP, PROP, exact_terms

MAX_FIELDS = 16  # filtex §7.1: a limit on each expression's complexity (RabbitMQ's figure)

# field (as on the wire) -> (Properties attribute, accepted reference types, string modifiers allowed)
_STRING = (str,)
PROPERTY_FIELDS: dict[str, tuple[str, tuple[type, ...], str]] = {
    "message-id": ("message_id", (ulong, uuid.UUID, bytes, str), "string"),
    "user-id": ("user_id", (bytes,), "binary"),
    "to": ("to", _STRING, "string"),
    "subject": ("subject", _STRING, "string"),
    "reply-to": ("reply_to", _STRING, "string"),
    "correlation-id": ("correlation_id", (ulong, uuid.UUID, bytes, str), "string"),
    "content-type": ("content_type", (symbol,), "symbol"),
    "content-encoding": ("content_encoding", (symbol,), "symbol"),
    "absolute-expiry-time": ("absolute_expiry_time", (timestamp,), "timestamp"),
    "creation-time": ("creation_time", (timestamp,), "timestamp"),
    "group-id": ("group_id", _STRING, "string"),
    "group-sequence": ("group_sequence", (uint,), "uint"),
    "reply-to-group-id": ("reply_to_group_id", _STRING, "string"),
}

_ABSENT = object()


class Prefix(str):
    """A `&p:` reference value (the prefix)."""

    __slots__ = ()


class Suffix(str):
    """A `&s:` reference value (the suffix)."""

    __slots__ = ()


@dataclass(frozen=True)
class PropertyChecks:
    """What a compiled property filter checks, for other backends (Spark): `kind` is properties or
    application-properties; `checks` pairs a Properties attribute or an application-properties key
    with its reference value as matched (None, Prefix, Suffix or a value)."""

    kind: str
    checks: tuple


def _reference(value: Any, where: str) -> Any:
    """A reference value as matched: strings with `&` modifiers become Prefix / Suffix."""
    if isinstance(value, Described):
        value = value.value
    if isinstance(value, str) and not isinstance(value, symbol) and value.startswith("&"):
        if value.startswith("&p:"):
            return Prefix(value[3:])
        if value.startswith("&s:"):
            return Suffix(value[3:])
        if value.startswith("&&"):
            return value[1:]
        raise FilterError(f"{where}: {value!r} starts with '&' but is not '&p:', '&s:' or '&&'")
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not isinstance(v, timestamp)


def _match(ref: Any, value: Any) -> bool:
    """Whether a message's value (never _ABSENT here) matches a reference value."""
    if ref is None:
        return True
    if isinstance(ref, Prefix):
        return isinstance(value, str) and value.startswith(ref)
    if isinstance(ref, Suffix):
        return isinstance(value, str) and value.endswith(ref)
    if _is_number(ref):
        if not _is_number(value):
            return False
        if isinstance(ref, int) and isinstance(value, int):
            return int(ref) == int(value)
        return float(ref) == float(value)
    if isinstance(ref, bool) or isinstance(value, bool):
        return isinstance(ref, bool) and isinstance(value, bool) and ref == value
    if isinstance(ref, timestamp):
        return isinstance(value, timestamp) and int(ref) == int(value)
    if isinstance(ref, str):
        return isinstance(value, str) and str(ref) == str(value)
    if isinstance(ref, (bytes, bytearray)):
        return isinstance(value, (bytes, bytearray)) and bytes(ref) == bytes(value)
    return type(ref) is type(value) and ref == value


def _entries(value: Any, what: str) -> list[tuple[Any, Any]]:
    if isinstance(value, Described):
        value = value.value
    if not isinstance(value, dict):
        raise FilterError(f"a {what} filter's value is a map, not {_type_name(value)}")
    if not value:
        raise FilterError(f"a {what} filter needs at least one entry")
    if len(value) > MAX_FIELDS:
        raise FilterError(f"a {what} filter has {len(value)} entries; at most {MAX_FIELDS} are accepted")
    return list(value.items())


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, symbol):
        return "symbol"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (bytes, bytearray)):
        return "binary"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, uuid.UUID):
        return "uuid"
    if isinstance(v, (int, float)):
        name = type(v).__name__
        if type(v).__module__.endswith(".amqp.types"):
            return {"int32": "int", "float32": "float"}.get(name, name)
        return "long" if isinstance(v, int) else "double"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "list"
    return "value"


def properties_filter(value: Any) -> Filter:
    """The properties filter (filtex §4.2.4) -> Filter; raises FilterError when invalid."""
    checks: list[tuple[str, Any]] = []
    for key, ref in _entries(value, "properties"):
        if not isinstance(key, symbol):
            raise FilterError(f"properties filter: key {key!r} must be a symbol")
        field = PROPERTY_FIELDS.get(str(key))
        if field is None:
            raise FilterError(f"properties filter: {str(key)!r} is not a properties field "
                              f"({', '.join(PROPERTY_FIELDS)})")
        attr, types, type_text = field
        raw = ref.value if isinstance(ref, Described) else ref
        if raw is not None and (not isinstance(raw, types) or (str in types and isinstance(raw, symbol)
                                                              and symbol not in types)):
            raise FilterError(f"properties filter: {str(key)} takes a {type_text} value, not {_type_name(raw)}")
        checks.append((attr, _reference(raw, f"properties filter: {str(key)}") if isinstance(raw, str) else raw))

    def fn(m: Any, receiver: Any = None) -> bool:
        props = m.properties
        if props is None:
            return False
        for attr, ref in checks:
            v = getattr(props, attr)
            if v is None or not _match(ref, v):
                return False
        return True

    description = " AND ".join(f"properties.{a} ~ {r!r}" for a, r in checks)
    return Filter(fn, frozenset({"properties"}), description, ast=PropertyChecks("properties", tuple(checks)),
                  terms=exact_terms(PROP, _indexable(checks)))


def application_properties_filter(value: Any) -> Filter:
    """The application-properties filter (filtex §4.2.5) -> Filter; raises FilterError when invalid."""
    checks: list[tuple[str, Any]] = []
    for key, ref in _entries(value, "application-properties"):
        if not isinstance(key, str) or isinstance(key, symbol):
            raise FilterError(f"application-properties filter: key {key!r} must be a string")
        raw = ref.value if isinstance(ref, Described) else ref
        checks.append((str(key), _reference(raw, f"application-properties filter: {key}")))

    def fn(m: Any, receiver: Any = None) -> bool:
        ap = m.application_properties
        if ap is None:
            return False
        for key, ref in checks:
            v = ap.get(key, _ABSENT)
            if v is _ABSENT or (v is None and ref is not None) or not _match(ref, v):
                return False
        return True

    description = " AND ".join(f"{k} ~ {r!r}" for k, r in checks)
    return Filter(fn, frozenset({"application_properties"}), description,
                  ast=PropertyChecks("application-properties", tuple(checks)), terms=exact_terms(APP, _indexable(checks)))


def _indexable(checks: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The checks with their exact reference values; prefix and suffix (like NULL) are not exact."""
    return [(k, None if isinstance(r, (Prefix, Suffix)) else r) for k, r in checks]
