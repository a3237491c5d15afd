"""The message model: the sections of an AMQP 1.0 message that filters read, with AMQP types kept.

Pure Python (no proton).  Converters from and to wire bytes live in `broker_filter.amqp`, from and
to proton messages in the proxy.  The JSON form (`Message.from_json` / `Message.to_json`) is a public
format documented in docs/message-json.md:

* plain JSON values map naturally: string -> string, integer -> long, float -> double,
  bool -> boolean, null -> null, array -> list, object -> map with string keys;
* any value may be typed explicitly as {"type": "<AMQP type name>", "value": ...}: binary as hex,
  timestamp as epoch milliseconds, uuid as canonical text, char as a one-character string, decimals
  as strings, float/double also as "NaN" / "Infinity" / "-Infinity", map as a list of [key, value]
  pairs, array as {"type": "array", "element_type": T, "value": [...]}, described as
  {"type": "described", "descriptor": D, "value": V};
* header and properties fields have fixed AMQP types, so plain values are converted to them
  (priority 7 is a ubyte); annotation keys written as JSON object keys are symbols.
"""

from __future__ import annotations

import decimal
import math
import uuid
from typing import Any

from . import types as t


class MessageFormatError(ValueError):
    """A JSON message that does not fit the documented form; `path` says where."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


HEADER_FIELDS: dict[str, str] = {
    "durable": "boolean",
    "priority": "ubyte",
    "ttl": "uint",
    "first_acquirer": "boolean",
    "delivery_count": "uint",
}

# Field -> fixed AMQP type, or None where the field admits several types (message ids).
PROPERTIES_FIELDS: dict[str, str | None] = {
    "message_id": None,
    "user_id": "binary",
    "to": "string",
    "subject": "string",
    "reply_to": "string",
    "correlation_id": None,
    "content_type": "symbol",
    "content_encoding": "symbol",
    "absolute_expiry_time": "timestamp",
    "creation_time": "timestamp",
    "group_id": "string",
    "group_sequence": "uint",
    "reply_to_group_id": "string",
}
_MESSAGE_ID_TYPES = frozenset({"ulong", "uuid", "binary", "string"})
_INTEGER_TYPES = frozenset({"ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp"})


class Header:
    __slots__ = tuple(HEADER_FIELDS)

    def __init__(self, durable=None, priority=None, ttl=None, first_acquirer=None, delivery_count=None):
        self.durable = durable
        self.priority = priority
        self.ttl = ttl
        self.first_acquirer = first_acquirer
        self.delivery_count = delivery_count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Header) and all(_same(getattr(self, f), getattr(other, f)) for f in HEADER_FIELDS)

    def __repr__(self) -> str:
        return "Header(%s)" % ", ".join(f"{f}={getattr(self, f)!r}" for f in HEADER_FIELDS if getattr(self, f) is not None)


class Properties:
    __slots__ = tuple(PROPERTIES_FIELDS)

    def __init__(self, **fields: Any):
        for f in PROPERTIES_FIELDS:
            setattr(self, f, fields.pop(f, None))
        if fields:
            raise TypeError(f"unknown properties field(s): {', '.join(sorted(fields))}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Properties) and all(
            _same(getattr(self, f), getattr(other, f)) for f in PROPERTIES_FIELDS
        )

    def __repr__(self) -> str:
        return "Properties(%s)" % ", ".join(
            f"{f}={getattr(self, f)!r}" for f in PROPERTIES_FIELDS if getattr(self, f) is not None
        )


_NO_BODY = object()


class Message:
    """An AMQP 1.0 message as filters see it.  Absent sections are None.

    `body` is the value of an amqp-value section (bytes stand for a data section); `has_body` tells
    a null body from none at all.
    """

    __slots__ = (
        "header",
        "delivery_annotations",
        "message_annotations",
        "properties",
        "application_properties",
        "_body",
        "encoded_size",
    )

    def __init__(
        self,
        header: Header | None = None,
        delivery_annotations: dict | None = None,
        message_annotations: dict | None = None,
        properties: Properties | None = None,
        application_properties: dict | None = None,
        body: Any = _NO_BODY,
    ):
        self.header = header
        self.delivery_annotations = delivery_annotations
        self.message_annotations = message_annotations
        self.properties = properties
        self.application_properties = application_properties
        self._body = body
        self.encoded_size: int | None = None  # bytes on the wire, when known (Artemis AMQSize)

    @property
    def body(self) -> Any:
        return None if self._body is _NO_BODY else self._body

    @body.setter
    def body(self, value: Any) -> None:
        self._body = value

    @property
    def has_body(self) -> bool:
        return self._body is not _NO_BODY

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Message)
            and self.header == other.header
            and self.properties == other.properties
            and _same(self.delivery_annotations, other.delivery_annotations)
            and _same(self.message_annotations, other.message_annotations)
            and _same(self.application_properties, other.application_properties)
            and self.has_body == other.has_body
            and _same(self.body, other.body)
        )

    def __repr__(self) -> str:
        parts = [
            f"{name}={getattr(self, name)!r}"
            for name in ("header", "delivery_annotations", "message_annotations", "properties", "application_properties")
            if getattr(self, name) is not None
        ]
        if self.has_body:
            parts.append(f"body={self.body!r}")
        return "Message(%s)" % ", ".join(parts)

    # ---------------------------------------------------------------- JSON form
    @classmethod
    def from_json(cls, obj: Any) -> "Message":
        if not isinstance(obj, dict):
            raise MessageFormatError("", f"a message is a JSON object, not {_json_kind(obj)}")
        unknown = set(obj) - {
            "header",
            "delivery_annotations",
            "message_annotations",
            "properties",
            "application_properties",
            "body",
        }
        if unknown:
            raise MessageFormatError(sorted(unknown)[0], "unknown section")
        m = cls()
        if obj.get("header") is not None:
            m.header = Header(**_fields_from_json(obj["header"], "header", HEADER_FIELDS))
        if obj.get("properties") is not None:
            m.properties = Properties(**_fields_from_json(obj["properties"], "properties", PROPERTIES_FIELDS))
        for section, key_type in (
            ("delivery_annotations", t.symbol),
            ("message_annotations", t.symbol),
            ("application_properties", str),
        ):
            if obj.get(section) is not None:
                value = _map_from_json(obj[section], section, key_type)
                if section == "application_properties":
                    _check_application_properties(value, section)
                setattr(m, section, value)
        if "body" in obj:
            m.body = value_from_json(obj["body"], "body")
        return m

    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        if self.header is not None:
            out["header"] = {
                f: _field_to_json(getattr(self.header, f), HEADER_FIELDS[f])
                for f in HEADER_FIELDS
                if getattr(self.header, f) is not None
            }
        if self.delivery_annotations is not None:
            out["delivery_annotations"] = _map_to_json(self.delivery_annotations, t.symbol)
        if self.message_annotations is not None:
            out["message_annotations"] = _map_to_json(self.message_annotations, t.symbol)
        if self.properties is not None:
            out["properties"] = {
                f: _field_to_json(getattr(self.properties, f), PROPERTIES_FIELDS[f])
                for f in PROPERTIES_FIELDS
                if getattr(self.properties, f) is not None
            }
        if self.application_properties is not None:
            out["application_properties"] = _map_to_json(self.application_properties, str)
        if self.has_body:
            out["body"] = value_to_json(self.body)
        return out


# -------------------------------------------------------------------- value conversion
def _json_kind(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number"
    )


def _is_typed(obj: Any) -> bool:
    return isinstance(obj, dict) and "type" in obj and isinstance(obj.get("type"), str) and (
        set(obj) <= {"type", "value", "element_type", "descriptor"}
    )


def value_from_json(obj: Any, path: str = "") -> Any:
    """A JSON value (plain or typed) as a typed Python value."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        if not -(2**63) <= obj < 2**63:
            raise MessageFormatError(path, f"{obj} does not fit a long; type it as ulong if it is unsigned")
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, list):
        return [value_from_json(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if _is_typed(obj):
            return _typed_from_json(obj, path)
        return {k: value_from_json(v, f"{path}.{k}") for k, v in obj.items()}
    raise MessageFormatError(path, f"not a JSON value: {type(obj).__name__}")


def _typed_from_json(obj: dict, path: str) -> Any:
    name = obj["type"]
    if name not in ("described",) and "value" not in obj:
        raise MessageFormatError(path, f'typed value {name!r} has no "value"')
    v = obj.get("value")
    try:
        if name == "null":
            if v is not None:
                raise ValueError("a null has value null")
            return None
        if name == "boolean":
            if not isinstance(v, bool):
                raise ValueError("a boolean is true or false")
            return v
        if name in ("binary",):
            if not isinstance(v, str):
                raise ValueError("binary is written as a hex string")
            return bytes.fromhex(v)
        if name == "uuid":
            if not isinstance(v, str):
                raise ValueError("a uuid is written as canonical text")
            return uuid.UUID(v)
        if name in ("float", "double"):
            if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
                v = float(v.replace("Infinity", "inf"))
            elif isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{name} needs a number")
            return t.float32(v) if name == "float" else float(v)
        if name in ("decimal32", "decimal64", "decimal128"):
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise ValueError(f"{name} needs a number or a numeric string")
            try:
                return t.TYPE_CONSTRUCTORS[name](v)
            except decimal.InvalidOperation:
                raise ValueError(f"{v!r} is not a decimal number") from None
        if name in ("string", "symbol", "char"):
            if not isinstance(v, str):
                raise ValueError(f"{name} needs a string")
            return t.TYPE_CONSTRUCTORS[name](v)
        if name in ("ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} needs an integer")
            return t.TYPE_CONSTRUCTORS[name](v)
        if name == "list":
            if not isinstance(v, list):
                raise ValueError("a list needs an array")
            return [value_from_json(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if name == "map":
            if isinstance(v, dict):
                return {k: value_from_json(x, f"{path}.{k}") for k, x in v.items()}
            if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
                raise ValueError("a typed map is a list of [key, value] pairs")
            out = {}
            for i, (k, x) in enumerate(v):
                key = value_from_json(k, f"{path}[{i}][0]")
                try:
                    hash(key)
                except TypeError:
                    raise ValueError(f"map key {k!r} cannot be a list or map") from None
                out[key] = value_from_json(x, f"{path}[{i}][1]")
            return out
        if name == "array":
            et = obj.get("element_type")
            if not isinstance(et, str) or et not in t.AMQP_TYPE_NAMES:
                raise ValueError("an array needs an element_type naming an AMQP type")
            if not isinstance(v, list):
                raise ValueError("an array's value is a JSON array")
            items = [value_from_json({"type": et, "value": x} if not _is_typed(x) else x, f"{path}[{i}]") for i, x in enumerate(v)]
            return t.Array(et, items)
        if name == "described":
            if "descriptor" not in obj:
                raise ValueError("a described value needs a descriptor")
            return t.Described(value_from_json(obj["descriptor"], f"{path}.descriptor"), value_from_json(v, f"{path}.value"))
    except MessageFormatError:
        raise
    except (ValueError, TypeError, OverflowError) as e:
        raise MessageFormatError(path, str(e)) from None
    raise MessageFormatError(path, f"unknown AMQP type {name!r}")


def value_to_json(v: Any) -> Any:
    """A typed Python value in the JSON form: plain where the plain form means the same type."""
    kind = t.amqp_type(v)
    if kind in ("null", "boolean", "string"):
        return v if type(v) in (str, bool, type(None)) else (str(v) if kind == "string" else v)
    if kind == "long":
        return int(v) if type(v) is int else {"type": "long", "value": int(v)}
    if kind == "double":
        if math.isfinite(v):
            return float(v)
        return {"type": "double", "value": _special_float(v)}
    if kind == "float":
        return {"type": "float", "value": float(v) if math.isfinite(v) else _special_float(v)}
    if kind in ("ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "timestamp"):
        return {"type": kind, "value": int(v)}
    if kind in ("decimal32", "decimal64", "decimal128"):
        return {"type": kind, "value": decimal.Decimal.__str__(v)}
    if kind in ("symbol", "char"):
        return {"type": kind, "value": str(v)}
    if kind == "uuid":
        return {"type": "uuid", "value": str(v)}
    if kind == "binary":
        return {"type": "binary", "value": bytes(v).hex()}
    if kind == "list":
        return [value_to_json(x) for x in v]
    if kind == "map":
        return _map_to_json(v, str)
    if kind == "array":
        return {"type": "array", "element_type": v.element_type, "value": [_array_item_json(x) for x in v]}
    if kind == "described":
        return {"type": "described", "descriptor": value_to_json(v.descriptor), "value": value_to_json(v.value)}
    raise TypeError(f"cannot write {kind} as JSON")  # pragma: no cover


def _array_item_json(x: Any) -> Any:
    j = value_to_json(x)
    return j["value"] if isinstance(j, dict) and _is_typed(j) and set(j) == {"type", "value"} else j


def _special_float(v: float) -> str:
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _map_from_json(obj: Any, path: str, key_type: type) -> dict:
    if isinstance(obj, dict) and not _is_typed(obj):
        out = {}
        for k, v in obj.items():
            out[key_type(k) if key_type is not str else k] = value_from_json(v, f"{path}.{k}")
        return out
    value = value_from_json(obj, path)
    if not isinstance(value, dict):
        raise MessageFormatError(path, "a section of this kind is a map")
    return value


def _map_to_json(m: dict, plain_key_type: type) -> Any:
    if all(type(k) is plain_key_type for k in m):
        return {str(k): value_to_json(v) for k, v in m.items()}
    return {"type": "map", "value": [[value_to_json(k), value_to_json(v)] for k, v in m.items()]}


def _check_application_properties(props: dict, path: str) -> None:
    for k, v in props.items():
        if type(k) is not str:
            raise MessageFormatError(path, f"application-properties keys are strings, not {t.amqp_type(k)}")
        if isinstance(v, (dict, list)):
            raise MessageFormatError(f"{path}.{k}", "application-properties values are simple types, not list/map")


def _fields_from_json(obj: Any, section: str, fields: dict[str, str | None]) -> dict:
    if not isinstance(obj, dict):
        raise MessageFormatError(section, f"a section is a JSON object, not {_json_kind(obj)}")
    out = {}
    for name, raw in obj.items():
        path = f"{section}.{name}"
        if name not in fields:
            raise MessageFormatError(path, "unknown field")
        if raw is None:
            continue
        want = fields[name]
        value = value_from_json(raw, path)
        if want is None:  # message-id / correlation-id
            if type(value) is int:
                if value < 0:
                    raise MessageFormatError(path, "a numeric message id is a ulong (not negative)")
                value = t.ulong(value)
            kind = t.amqp_type(value)
            if kind not in _MESSAGE_ID_TYPES:
                raise MessageFormatError(path, f"a message id is ulong, uuid, binary or string, not {kind}")
        elif want == "binary" and isinstance(value, str):
            value = value.encode("utf-8")
        else:
            kind = t.amqp_type(value)
            if kind != want:
                convertible = (kind in _INTEGER_TYPES and want in _INTEGER_TYPES) or (
                    kind in ("string", "symbol") and want in ("string", "symbol")
                )
                if not convertible:
                    raise MessageFormatError(path, f"needs a {want}, got {kind}")
                try:
                    value = t.TYPE_CONSTRUCTORS[want](value)
                except (TypeError, ValueError) as e:
                    raise MessageFormatError(path, f"needs a {want}: {e}") from None
        out[name] = value
    return out


def _field_to_json(v: Any, want: str | None) -> Any:
    if want is not None and t.amqp_type(v) == want and want not in ("binary",):
        # The field's type is fixed, so the plain form is unambiguous.
        if want == "timestamp" or want in ("ubyte", "uint"):
            return int(v)
        if want == "symbol":
            return str(v)
        return v
    return value_to_json(v)


def _same(a: Any, b: Any) -> bool:
    """Equality that also requires the same AMQP types, recursively (an explicit `long` and a plain
    int are both AMQP longs)."""
    if type(a) is not type(b):
        try:
            if t.amqp_type(a) != t.amqp_type(b):
                return False
        except TypeError:
            return False
        return a == b
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            any(_same(k, k2) and _same(v, b[k2]) for k2 in b if k2 == k) for k, v in a.items()
        )
    if isinstance(a, list):
        if isinstance(a, t.Array) and a.element_type != b.element_type:
            return False
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, t.Described):
        return _same(a.descriptor, b.descriptor) and _same(a.value, b.value)
    return a == b

