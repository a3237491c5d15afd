"""How selector identifiers read a message: the JMS / Artemis / RocketMQ header table and the
AMQP -> JMS value mapping.  One table, used by the compiled evaluator and the reference interpreter;
the Spark backend implements the same rows as column expressions.

AMQP -> JMS types (spec table): ubyte->short, ushort->int, uint->long, ulong->long (values above 2**63 - 1 read as Java does: negative), byte, short, int,
long as themselves, float->float, double->double, decimal32/64/128->double, char->char,
timestamp->long, uuid->byte[16], binary->byte[], string->String, symbol->String, boolean->boolean.
`jms_value` returns the JMS value as a plain Python value: bool, int, float, str; anything else
(char, byte[], uuid, list, map, described) comes back as an `Opaque`, which only IS [NOT] NULL can
test; every comparison with it is a type mismatch.  `jms_width` tells Java's arithmetic width.
"""

from __future__ import annotations

import decimal
import uuid
from typing import Any, Callable

from ..amqp import types as t

INT32_TYPES = (t.ubyte, t.ushort, t.byte, t.short, t.int32)  # JMS byte/short/int: 32-bit arithmetic


class Opaque:
    """A JMS value with no selector operations (char, byte[], uuid, list, map...)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and type(other.value) is type(self.value) and other.value == self.value

    def __hash__(self) -> int:
        return hash(type(self.value))

    def __repr__(self) -> str:
        return f"Opaque({self.value!r})"


def jms_value(v: Any) -> Any:
    """The JMS selector value of an AMQP value (None stays None)."""
    tv = type(v)
    if tv is str or tv is int or tv is float or tv is bool or v is None:
        return v
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        if tv is t.ulong and v >= 2**63:
            return int(v) - 2**64  # ulong -> JMS long, as Java reads the 64 bits
        return v  # keeps the tag class: width matters for arithmetic
    if isinstance(v, float):
        return v
    if isinstance(v, decimal.Decimal):
        try:
            return float(v)
        except (OverflowError, ValueError):  # pragma: no cover - Decimal->float saturates
            return Opaque(v)
    if isinstance(v, str):
        return Opaque(v) if tv is t.char else str(v)
    return Opaque(v)


def _message_id(v: Any) -> Any:
    """Qpid JMS's string form of a message / correlation id."""
    if v is None:
        return None
    if isinstance(v, str):
        return str(v)
    if isinstance(v, uuid.UUID):
        return f"ID:AMQP_UUID:{v}"
    if isinstance(v, int):
        return f"ID:AMQP_ULONG:{int(v)}"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"ID:AMQP_BINARY:{bytes(v).hex().upper()}"
    return None


def _prop(name: str) -> Callable[[Any], Any]:
    def get(m: Any) -> Any:
        p = m.properties
        return None if p is None else getattr(p, name)

    return get


def _string_prop(name: str) -> Callable[[Any], Any]:
    def get(m: Any) -> Any:
        p = m.properties
        v = None if p is None else getattr(p, name)
        return None if v is None else str(v)

    return get


def _long_prop(name: str, default: Any = None) -> Callable[[Any], Any]:
    def get(m: Any) -> Any:
        p = m.properties
        v = None if p is None else getattr(p, name)
        return default if v is None else int(v)

    return get


def _jms_type(m: Any) -> Any:
    p = m.properties
    if p is not None and p.subject is not None:
        return str(p.subject)
    ma = m.message_annotations
    if ma:
        v = ma.get("x-opt-jms-type", ma.get("jms-type"))
        if isinstance(v, str):
            return str(v)
    return None


def _priority(m: Any) -> int:
    h = m.header
    return 4 if h is None or h.priority is None else int(h.priority)


def _durable(m: Any) -> bool:
    h = m.header
    return bool(h is not None and h.durable)


def _redelivered(m: Any) -> bool:
    h = m.header
    return bool(h is not None and h.delivery_count)


def _delivery_count(m: Any) -> int:
    h = m.header
    return 1 + (0 if h is None or h.delivery_count is None else int(h.delivery_count))


def _user_id(m: Any) -> Any:
    p = m.properties
    v = None if p is None else p.user_id
    if v is None:
        return None
    try:
        return bytes(v).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _message_id_of(m: Any) -> Any:
    p = m.properties
    return None if p is None else _message_id(p.message_id)


def _correlation_id_of(m: Any) -> Any:
    p = m.properties
    return None if p is None else _message_id(p.correlation_id)


def _size(m: Any) -> Any:
    return getattr(m, "encoded_size", None)


# name -> (sections read, getter returning the JMS value).  Getters never raise.
HEADERS: dict[str, tuple[frozenset[str], Callable[[Any], Any]]] = {
    # JMS 2.0 headers, per WIRE-CONTRACT section 3
    "JMSType": (frozenset({"properties", "message_annotations"}), _jms_type),
    "JMSMessageID": (frozenset({"properties"}), _message_id_of),
    "JMSCorrelationID": (frozenset({"properties"}), _correlation_id_of),
    "JMSDeliveryMode": (frozenset({"header"}), lambda m: "PERSISTENT" if _durable(m) else "NON_PERSISTENT"),
    "JMSPriority": (frozenset({"header"}), _priority),
    "JMSTimestamp": (frozenset({"properties"}), _long_prop("creation_time")),
    "JMSExpiration": (frozenset({"properties"}), _long_prop("absolute_expiry_time", 0)),
    "JMSRedelivered": (frozenset({"header"}), _redelivered),
    "JMSReplyTo": (frozenset({"properties"}), _string_prop("reply_to")),
    "JMSDestination": (frozenset({"properties"}), _string_prop("to")),
    # JMS-defined properties (JMSX*)
    "JMSXUserID": (frozenset({"properties"}), _user_id),
    "JMSXGroupID": (frozenset({"properties"}), _string_prop("group_id")),
    "JMSXGroupSeq": (frozenset({"properties"}), _long_prop("group_sequence")),
    "JMSXDeliveryCount": (frozenset({"header"}), _delivery_count),
    # Artemis core-filter identifiers
    "AMQPriority": (frozenset({"header"}), _priority),
    "AMQExpiration": (frozenset({"properties"}), _long_prop("absolute_expiry_time", 0)),
    "AMQDurable": (frozenset({"header"}), lambda m: "DURABLE" if _durable(m) else "NON_DURABLE"),
    "AMQTimestamp": (frozenset({"properties"}), _long_prop("creation_time")),
    "AMQSize": (frozenset(), _size),
    "AMQUserID": (frozenset({"properties"}), _message_id_of),
    "AMQAddress": (frozenset({"properties"}), _string_prop("to")),
    "AMQGroupID": (frozenset({"properties"}), _string_prop("group_id")),
    # RocketMQ
    "TAGS": (frozenset({"properties"}), _string_prop("subject")),
}

JMS_HEADERS = frozenset(n for n in HEADERS if n.startswith("JMS"))
ARTEMIS_HEADERS = frozenset(n for n in HEADERS if n.startswith("AMQ"))
