"""AMQP 1.0 typed values in plain Python (no proton).

Theory of operation: an AMQP value keeps its wire type because JMS selector semantics depend on it
(a ubyte is a JMS short, a uint a long, a float32 a float, a symbol a String...).  Python's own types
stand for the most common AMQP type of their kind, and thin subclasses tag the others:

    None -> null         bool -> boolean       int -> long           float -> double
    str -> string        bytes -> binary       uuid.UUID -> uuid      dict -> map    list -> list

    ubyte ushort uint ulong byte short int32 timestamp   (int subclasses)
    float32                                            (float subclass)
    symbol char                                        (str subclasses)
    decimal32 decimal64 decimal128                     (decimal.Decimal subclasses)
    Array (list subclass with an element type), Described (descriptor + value)

Subclassing keeps arithmetic, hashing and comparison native (a ubyte(5) == 5) while `amqp_type`
recovers the wire type in one dict lookup.  Constructors range-check, so a value that exists is valid.
"""

from __future__ import annotations

import decimal
import uuid
from typing import Any


class _RangedInt(int):
    __slots__ = ()
    _lo = 0
    _hi = 0

    def __new__(cls, value: Any = 0):
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str):
                value = int(value, 0)
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise TypeError(f"{cls.__name__} needs an integer, got {type(value).__name__}")
        if not cls._lo <= value <= cls._hi:
            raise ValueError(f"{value} is out of range for {cls.__name__} [{cls._lo}, {cls._hi}]")
        return int.__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class ubyte(_RangedInt):
    __slots__ = ()
    _lo, _hi = 0, 2**8 - 1


class ushort(_RangedInt):
    __slots__ = ()
    _lo, _hi = 0, 2**16 - 1


class uint(_RangedInt):
    __slots__ = ()
    _lo, _hi = 0, 2**32 - 1


class ulong(_RangedInt):
    __slots__ = ()
    _lo, _hi = 0, 2**64 - 1


class byte(_RangedInt):
    __slots__ = ()
    _lo, _hi = -(2**7), 2**7 - 1


class short(_RangedInt):
    __slots__ = ()
    _lo, _hi = -(2**15), 2**15 - 1


class int32(_RangedInt):
    """AMQP `int` (32-bit signed); a plain Python int is an AMQP `long`."""

    __slots__ = ()
    _lo, _hi = -(2**31), 2**31 - 1


class long(_RangedInt):
    """Explicit AMQP `long`; plain ints are longs too, this only range-checks."""

    __slots__ = ()
    _lo, _hi = -(2**63), 2**63 - 1


class timestamp(_RangedInt):
    """Milliseconds since the Unix epoch (AMQP `timestamp`)."""

    __slots__ = ()
    _lo, _hi = -(2**63), 2**63 - 1


class float32(float):
    __slots__ = ()

    def __new__(cls, value: Any = 0.0):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"float32 needs a number, got {type(value).__name__}")
        import struct

        f = float(value)
        # Round to single precision so the value is exactly what the wire carries.
        try:
            f = struct.unpack("<f", struct.pack("<f", f))[0]
        except OverflowError:
            raise ValueError(f"{value} is out of range for float32") from None
        return float.__new__(cls, f)

    def __repr__(self) -> str:
        return f"float32({float(self)!r})"


class symbol(str):
    __slots__ = ()

    def __new__(cls, value: Any = ""):
        if not isinstance(value, str):
            raise TypeError(f"symbol needs a string, got {type(value).__name__}")
        if not value.isascii():
            raise ValueError("symbol values are ASCII")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"symbol({str(self)!r})"


class char(str):
    __slots__ = ()

    def __new__(cls, value: Any = "\0"):
        if not isinstance(value, str) or len(value) != 1:
            raise ValueError("char needs a one-character string")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"char({str(self)!r})"


class _Decimal(decimal.Decimal):
    __slots__ = ()

    def __new__(cls, value: Any = "0"):
        if isinstance(value, bool) or not isinstance(value, (int, str, decimal.Decimal, float)):
            raise TypeError(f"{cls.__name__} needs a number or numeric string")
        d = decimal.Decimal(str(value)) if isinstance(value, float) else decimal.Decimal(value)
        if not d.is_finite() and not d.is_nan() and not d.is_infinite():  # pragma: no cover
            raise ValueError(f"bad {cls.__name__}")
        return decimal.Decimal.__new__(cls, d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{decimal.Decimal.__str__(self)}')"


class decimal32(_Decimal):
    __slots__ = ()


class decimal64(_Decimal):
    __slots__ = ()


class decimal128(_Decimal):
    __slots__ = ()


class Array(list):
    """An AMQP array: a list whose elements share one AMQP type (`element_type`)."""

    __slots__ = ("element_type",)

    def __init__(self, element_type: str, items=()):
        super().__init__(items)
        self.element_type = element_type

    def __repr__(self) -> str:
        return f"Array({self.element_type!r}, {list(self)!r})"

    def __eq__(self, other):
        if isinstance(other, Array):
            return self.element_type == other.element_type and list.__eq__(self, other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class Described:
    """A described value: descriptor (symbol or ulong) plus value."""

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any):
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Described)
            and self.descriptor == other.descriptor
            and type(self.descriptor) is type(other.descriptor)
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((self.descriptor, _hashable(self.value)))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


def _hashable(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((repr(k), repr(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


# Exact Python class -> AMQP type name.  Subclasses of these tagged classes are not expected.
_TYPE_NAMES: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    ubyte: "ubyte",
    ushort: "ushort",
    uint: "uint",
    ulong: "ulong",
    byte: "byte",
    short: "short",
    int32: "int",
    int: "long",
    long: "long",
    float32: "float",
    float: "double",
    decimal32: "decimal32",
    decimal64: "decimal64",
    decimal128: "decimal128",
    char: "char",
    timestamp: "timestamp",
    uuid.UUID: "uuid",
    bytes: "binary",
    bytearray: "binary",
    memoryview: "binary",
    str: "string",
    symbol: "symbol",
    list: "list",
    dict: "map",
    Array: "array",
    Described: "described",
}

# AMQP type name -> constructor from a Python value of the natural kind.
TYPE_CONSTRUCTORS: dict[str, Any] = {
    "ubyte": ubyte,
    "ushort": ushort,
    "uint": uint,
    "ulong": ulong,
    "byte": byte,
    "short": short,
    "int": int32,
    "long": lambda v: int(long(v)),  # range-checked, then the canonical plain int
    "timestamp": timestamp,
    "float": float32,
    "double": float,
    "decimal32": decimal32,
    "decimal64": decimal64,
    "decimal128": decimal128,
    "char": char,
    "symbol": symbol,
    "string": str,
    "boolean": bool,
}

AMQP_TYPE_NAMES = frozenset(_TYPE_NAMES.values())


def amqp_type(value: Any) -> str:
    """The AMQP type name of a value; raises TypeError for a value with no AMQP type."""
    try:
        return _TYPE_NAMES[type(value)]
    except KeyError:
        for cls in type(value).__mro__[1:]:
            if cls in _TYPE_NAMES:
                return _TYPE_NAMES[cls]
        raise TypeError(f"no AMQP type for a Python {type(value).__name__}") from None
