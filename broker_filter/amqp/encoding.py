"""AMQP 1.0 type system encoding (core spec part 1) in pure Python.

Theory of operation: `decode(buf, pos) -> (value, end)` reads one encoded value starting at `pos`
and `skip(buf, pos) -> end` steps over one without building it (sizes of compound and variable
types are in their headers, so skipping is O(1) for them).  Values come back as the typed values of
`broker_filter.amqp.types` (a ubyte stays a ubyte).  `encode(value) -> bytes` writes the smallest
encoding for a value's AMQP type.  Malformed input raises `CodecError`, never anything else, with
what is wrong, the AMQP name of the value it is in and the byte offset where that value starts
(`truncated map at byte 12`).  Compound and described values nest at most `MAX_DEPTH` deep.
"""

from __future__ import annotations

import struct
import uuid
from decimal import Decimal
from typing import Any, Callable

from . import types as t


class CodecError(ValueError):
    """Bytes that are not a valid AMQP encoding; `position` is the offset where decoding failed."""

    condition = "amqp:decode-error"

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message if position is None else f"{message} at byte {position}")
        self.position = position


_u8 = struct.Struct(">B").unpack_from
_i8 = struct.Struct(">b").unpack_from
_u16 = struct.Struct(">H").unpack_from
_i16 = struct.Struct(">h").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_i64 = struct.Struct(">q").unpack_from
_f32 = struct.Struct(">f").unpack_from
_f64 = struct.Struct(">d").unpack_from
_u8u8 = struct.Struct(">BB").unpack_from
_u32u32 = struct.Struct(">II").unpack_from

_new_int = int.__new__
_new_float = float.__new__
_new_str = str.__new__

# Fixed-width codes -> width (for skip); variable codes -> width of their size prefix.
_FIXED = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}
_VAR1 = frozenset({0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0})
_VAR4 = frozenset({0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0})


def skip(buf: bytes, pos: int) -> int:
    """Offset just past the value starting at pos."""
    try:
        code = buf[pos]
        if code == 0x00:
            pos = skip(buf, pos + 1)
            return skip(buf, pos)
        w = _FIXED.get(code)
        if w is not None:
            end = pos + 1 + w
        elif code in _VAR1:
            end = pos + 2 + buf[pos + 1]
        elif code in _VAR4:
            end = pos + 5 + _u32(buf, pos + 1)[0]
        else:
            raise CodecError(f"unknown type code 0x{code:02x}", pos)
    except (IndexError, struct.error):
        raise CodecError("truncated value", pos) from None
    if end > len(buf):
        raise CodecError("truncated value", pos)
    return end


# ---------------------------------------------------------------------------- decoding
MAX_DEPTH = 100  # compound and described values nested inside each other


def decode(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode the value at pos: (value, offset after it)."""
    try:
        code = buf[pos]
        return _DECODERS[code](buf, pos + 1)
    except CodecError:
        raise
    except (KeyError, IndexError, struct.error, UnicodeDecodeError, ValueError, TypeError, RecursionError) as e:
        raise _fault(e, pos) from None


def _fault(e: BaseException, pos: int) -> CodecError:
    """What went wrong, named by the innermost value being decoded when it did (found in the
    traceback: every decoder keeps `p`, the offset just past its type code, or the element offset
    for the elements of an array)."""
    name, at = "value", pos
    tb, in_array = e.__traceback__, False
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code in _VALUE_NAMES:
            name = _VALUE_NAMES[frame.f_code]
            at = frame.f_locals["p"] - (0 if in_array else 1)
        in_array = frame.f_code is _array.__code__
        tb = tb.tb_next
    if isinstance(e, KeyError):
        return CodecError(f"unknown type code 0x{e.args[0]:02x} in {name}", at)
    if isinstance(e, (IndexError, struct.error)):
        return CodecError(f"truncated {name}", at)
    if isinstance(e, UnicodeDecodeError):
        return CodecError(f"{name} is not valid {'ASCII' if name == 'symbol' else 'UTF-8'}", at)
    if isinstance(e, RecursionError):
        return CodecError(f"values nested too deeply in {name}", at)
    return CodecError(f"malformed {name}: {e}", at)


def _too_deep(p: int) -> CodecError:
    return CodecError(f"values nested deeper than {MAX_DEPTH}", p - 1)


def _check_end(buf: bytes, end: int) -> int:
    if end > len(buf):
        raise IndexError("value runs past the end of the buffer")
    return end


def _d_null(b, p, d=0):
    return None, p


def _d_true(b, p, d=0):
    return True, p


def _d_false(b, p, d=0):
    return False, p


def _d_uint0(b, p, d=0):
    return _new_int(t.uint, 0), p


def _d_ulong0(b, p, d=0):
    return _new_int(t.ulong, 0), p


def _d_list0(b, p, d=0):
    return [], p


def _d_ubyte(b, p, d=0):
    return _new_int(t.ubyte, b[p]), p + 1


def _d_byte(b, p, d=0):
    return _new_int(t.byte, _i8(b, p)[0]), p + 1


_SMALLUINT = tuple(_new_int(t.uint, i) for i in range(256))


def _d_smalluint(b, p, d=0):
    return _SMALLUINT[b[p]], p + 1


def _d_smallulong(b, p, d=0):
    return _new_int(t.ulong, b[p]), p + 1


_SMALLINT = tuple(_new_int(t.int32, i if i < 128 else i - 256) for i in range(256))  # by encoded byte


def _d_smallint(b, p, d=0):
    return _SMALLINT[b[p]], p + 1


def _d_smalllong(b, p, d=0):
    return _i8(b, p)[0], p + 1


def _d_boolean(b, p, d=0):
    v = b[p]
    if v > 1:
        raise ValueError(f"byte {v} is neither 0 nor 1")
    return v == 1, p + 1


def _d_ushort(b, p, d=0):
    return _new_int(t.ushort, _u16(b, p)[0]), p + 2


def _d_short(b, p, d=0):
    return _new_int(t.short, _i16(b, p)[0]), p + 2


def _d_uint(b, p, d=0):
    return _new_int(t.uint, _u32(b, p)[0]), p + 4


def _d_int(b, p, d=0):
    return _new_int(t.int32, _i32(b, p)[0]), p + 4


def _d_float(b, p, d=0):
    return _new_float(t.float32, _f32(b, p)[0]), p + 4


def _d_char(b, p, d=0):
    code = _u32(b, p)[0]
    if code > 0x10FFFF:
        raise CodecError(f"char {code:#x} is not a Unicode code point", p)
    return t.char(chr(code)), p + 4


def _d_ulong(b, p, d=0):
    return _new_int(t.ulong, _u64(b, p)[0]), p + 8


def _d_long(b, p, d=0):
    return _i64(b, p)[0], p + 8


def _d_double(b, p, d=0):
    return _f64(b, p)[0], p + 8


def _d_timestamp(b, p, d=0):
    return _new_int(t.timestamp, _i64(b, p)[0]), p + 8


def _bid(bits: int, width: int, exp_bits: int, bias: int) -> Decimal:
    """IEEE 754-2008 decimal in binary integer decimal (BID) encoding."""
    sign = bits >> (width - 1)
    if (bits >> (width - 5)) & 0xF == 0xF:  # 1111x: infinity or NaN
        if (bits >> (width - 6)) & 0x1F == 0x1F:
            return Decimal("NaN")
        return Decimal("-Infinity" if sign else "Infinity")
    if (bits >> (width - 3)) & 0x3 == 0x3:
        exp = (bits >> (width - 3 - exp_bits)) & ((1 << exp_bits) - 1)
        coeff = (0b100 << (width - 4 - exp_bits)) | (bits & ((1 << (width - 4 - exp_bits)) - 1))
    else:
        exp = (bits >> (width - 1 - exp_bits)) & ((1 << exp_bits) - 1)
        coeff = bits & ((1 << (width - 1 - exp_bits)) - 1)
    return Decimal((sign, tuple(int(c) for c in str(coeff)), exp - bias))


def _d_decimal32(b, p, d=0):
    return t.decimal32(_bid(_u32(b, p)[0], 32, 8, 101)), p + 4


def _d_decimal64(b, p, d=0):
    return t.decimal64(_bid(_u64(b, p)[0], 64, 10, 398)), p + 8


def _d_decimal128(b, p, d=0):
    return t.decimal128(_bid(int.from_bytes(b[p : p + 16], "big"), 128, 14, 6176)), p + 16


def _d_uuid(b, p, d=0):
    _check_end(b, p + 16)
    return uuid.UUID(bytes=bytes(b[p : p + 16])), p + 16


def _d_vbin8(b, p, d=0):
    end = _check_end(b, p + 1 + b[p])
    return bytes(b[p + 1 : end]), end


def _d_vbin32(b, p, d=0):
    end = _check_end(b, p + 4 + _u32(b, p)[0])
    return bytes(b[p + 4 : end]), end


def _d_str8(b, p, d=0):
    end = _check_end(b, p + 1 + b[p])
    return str(b[p + 1 : end], "utf-8"), end


def _d_str32(b, p, d=0):
    end = _check_end(b, p + 4 + _u32(b, p)[0])
    return str(b[p + 4 : end], "utf-8"), end


def _d_sym8(b, p, d=0):
    end = _check_end(b, p + 1 + b[p])
    return _new_str(t.symbol, str(b[p + 1 : end], "ascii")), end


def _d_sym32(b, p, d=0):
    end = _check_end(b, p + 4 + _u32(b, p)[0])
    return _new_str(t.symbol, str(b[p + 4 : end], "ascii")), end


def _items(b, p, end, count, d):
    out = []
    for _ in range(count):
        v, p = _DECODERS[b[p]](b, p + 1, d)
        out.append(v)
    if p != end:
        raise ValueError(f"compound size says {end}, items end at {p}")
    return out


def _d_list8(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    size, count = _u8u8(b, p)
    end = _check_end(b, p + 1 + size)
    return _items(b, p + 2, end, count, d + 1), end


def _d_list32(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    size, count = _u32u32(b, p)
    end = _check_end(b, p + 4 + size)
    return _items(b, p + 8, end, count, d + 1), end


def _pairs(items: list) -> dict:
    if len(items) % 2:
        raise ValueError(f"odd number of items ({len(items)})")
    it = iter(items)
    out = {}
    for k in it:
        try:
            out[k] = next(it)
        except TypeError:
            raise ValueError(f"unhashable map key of type {type(k).__name__}") from None
    return out


def _d_map8(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    size, count = _u8u8(b, p)
    end = _check_end(b, p + 1 + size)
    return _pairs(_items(b, p + 2, end, count, d + 1)), end


def _d_map32(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    size, count = _u32u32(b, p)
    end = _check_end(b, p + 4 + size)
    return _pairs(_items(b, p + 8, end, count, d + 1)), end


def decode_map(buf: bytes, pos: int) -> tuple[dict, int]:
    """`decode` for a map at pos (the common section case), in one loop: string keys and small
    scalars are read in place rather than through a decoder call each.  Anything unusual (and
    every fault) goes through `decode`, so values and errors are exactly the same."""
    try:
        code = buf[pos]
        if code == 0xC1:
            size, count = _u8u8(buf, pos + 1)
            p, end = pos + 3, pos + 2 + size
        elif code == 0xD1:
            size, count = _u32u32(buf, pos + 1)
            p, end = pos + 9, pos + 5 + size
        else:
            return decode(buf, pos)
        if count & 1 or end > len(buf):
            return decode(buf, pos)
        out = {}
        decoders = _DECODERS
        for _ in range(count >> 1):
            c = buf[p]
            if c == 0xA1:
                q = p + 2 + buf[p + 1]
                k = buf[p + 2 : q].decode()  # (a memoryview has no .decode: the fallback below takes it)
            else:
                k, q = decoders[c](buf, p + 1, 1)
            c = buf[q]
            if c == 0xA1:
                p = q + 2 + buf[q + 1]
                out[k] = buf[q + 2 : p].decode()
            elif c == 0x55:  # smalllong
                p = q + 2
                out[k] = _i8(buf, q + 1)[0]
            elif c == 0x54:  # smallint
                p = q + 2
                out[k] = _SMALLINT[buf[q + 1]]
            elif c == 0x52:  # smalluint
                p = q + 2
                out[k] = _SMALLUINT[buf[q + 1]]
            elif c == 0x70:  # uint
                p = q + 5
                out[k] = _new_int(t.uint, _u32(buf, q + 1)[0])
            elif c == 0x81:  # long
                p = q + 9
                out[k] = _i64(buf, q + 1)[0]
            elif c == 0x71:  # int
                p = q + 5
                out[k] = _new_int(t.int32, _i32(buf, q + 1)[0])
            else:
                out[k], p = decoders[c](buf, q + 1, 1)
        if p != end:
            return decode(buf, pos)
        return out, end
    except Exception:
        return decode(buf, pos)


def _array(b, p, end, count, d):
    code = b[p]
    p += 1
    descriptor = None
    if code == 0x00:
        descriptor, p = _DECODERS[b[p]](b, p + 1, d)
        code = b[p]
        p += 1
    name = _CODE_NAMES.get(code)
    if name is None:
        raise ValueError(f"array element code 0x{code:02x}")
    dec = _DECODERS[code]
    items = []
    for _ in range(count):
        v, p = dec(b, p, d)
        items.append(v if descriptor is None else t.Described(descriptor, v))
    if p != end:
        raise ValueError(f"array size says {end}, items end at {p}")
    return t.Array("described" if descriptor is not None else name, items), end


def _d_array8(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    size, count = _u8u8(b, p)
    end = _check_end(b, p + 1 + size)
    return _array(b, p + 2, end, count, d + 1)


def _d_array32(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    size, count = _u32u32(b, p)
    end = _check_end(b, p + 4 + size)
    return _array(b, p + 8, end, count, d + 1)


def _d_described(b, p, d=0):
    if d >= MAX_DEPTH:
        raise _too_deep(p)
    descriptor, q = _DECODERS[b[p]](b, p + 1, d + 1)
    value, q = _DECODERS[b[q]](b, q + 1, d + 1)
    return t.Described(descriptor, value), q


_DECODERS: dict[int, Callable[..., tuple[Any, int]]] = {
    0x00: _d_described,
    0x40: _d_null, 0x41: _d_true, 0x42: _d_false, 0x43: _d_uint0, 0x44: _d_ulong0, 0x45: _d_list0,
    0x50: _d_ubyte, 0x51: _d_byte, 0x52: _d_smalluint, 0x53: _d_smallulong, 0x54: _d_smallint,
    0x55: _d_smalllong, 0x56: _d_boolean,
    0x60: _d_ushort, 0x61: _d_short,
    0x70: _d_uint, 0x71: _d_int, 0x72: _d_float, 0x73: _d_char, 0x74: _d_decimal32,
    0x80: _d_ulong, 0x81: _d_long, 0x82: _d_double, 0x83: _d_timestamp, 0x84: _d_decimal64,
    0x94: _d_decimal128, 0x98: _d_uuid,
    0xA0: _d_vbin8, 0xA1: _d_str8, 0xA3: _d_sym8,
    0xB0: _d_vbin32, 0xB1: _d_str32, 0xB3: _d_sym32,
    0xC0: _d_list8, 0xC1: _d_map8, 0xD0: _d_list32, 0xD1: _d_map32,
    0xE0: _d_array8, 0xF0: _d_array32,
}

_CODE_NAMES = {
    0x40: "null", 0x41: "boolean", 0x42: "boolean", 0x43: "uint", 0x44: "ulong", 0x45: "list",
    0x50: "ubyte", 0x51: "byte", 0x52: "uint", 0x53: "ulong", 0x54: "int", 0x55: "long", 0x56: "boolean",
    0x60: "ushort", 0x61: "short", 0x70: "uint", 0x71: "int", 0x72: "float", 0x73: "char",
    0x74: "decimal32", 0x80: "ulong", 0x81: "long", 0x82: "double", 0x83: "timestamp",
    0x84: "decimal64", 0x94: "decimal128", 0x98: "uuid", 0xA0: "binary", 0xA1: "string",
    0xA3: "symbol", 0xB0: "binary", 0xB1: "string", 0xB3: "symbol", 0xC0: "list", 0xC1: "map",
    0xD0: "list", 0xD1: "map", 0xE0: "array", 0xF0: "array",
}

# Decoder code object -> the name of what it decodes (for error messages).
_VALUE_NAMES = {fn.__code__: _CODE_NAMES.get(code, "described value") for code, fn in _DECODERS.items()}


# ---------------------------------------------------------------------------- encoding
def _e_fixed(fmt: str, code: int) -> Callable[[Any], bytes]:
    s = struct.Struct(">B" + fmt)
    return lambda v: s.pack(code, v)


def _e_var(code8: int, code32: int, data: bytes) -> bytes:
    n = len(data)
    if n < 256:
        return bytes((code8, n)) + data
    return struct.pack(">BI", code32, n) + data


def _e_null(v):
    return b"\x40"


def _e_bool(v):
    return b"\x41" if v else b"\x42"


def _e_ubyte(v):
    return bytes((0x50, v))


def _e_byte(v):
    return struct.pack(">Bb", 0x51, v)


def _e_uint(v):
    if v == 0:
        return b"\x43"
    if v < 256:
        return bytes((0x52, v))
    return struct.pack(">BI", 0x70, v)


def _e_ulong(v):
    if v == 0:
        return b"\x44"
    if v < 256:
        return bytes((0x53, v))
    return struct.pack(">BQ", 0x80, v)


def _e_int(v):
    if -128 <= v <= 127:
        return struct.pack(">Bb", 0x54, v)
    return struct.pack(">Bi", 0x71, v)


def _e_long(v):
    if -128 <= v <= 127:
        return struct.pack(">Bb", 0x55, v)
    return struct.pack(">Bq", 0x81, v)


def _e_char(v):
    return struct.pack(">BI", 0x73, ord(v))


def _to_bid(d: Decimal, width: int, exp_bits: int, bias: int, digits: int) -> int:
    sign, dig, exp = d.as_tuple()
    if not d.is_finite():
        if d.is_nan():
            return 0x1F << (width - 6)
        return (sign << (width - 1)) | (0xF << (width - 5))
    coeff = int("".join(map(str, dig)) or "0")
    while coeff >= 10**digits:
        if coeff % 10:
            raise ValueError(f"{d} has more than {digits} significant digits")
        coeff //= 10
        exp += 1
    e = exp + bias
    if not 0 <= e < (1 << exp_bits):
        raise ValueError(f"{d} exponent out of range")
    small_bits = width - 1 - exp_bits
    if coeff < (1 << small_bits):
        return (sign << (width - 1)) | (e << small_bits) | coeff
    return (sign << (width - 1)) | (0b11 << (width - 3)) | (e << (width - 3 - exp_bits)) | (coeff & ((1 << (width - 4 - exp_bits)) - 1))


def _e_dec32(v):
    return struct.pack(">BI", 0x74, _to_bid(v, 32, 8, 101, 7))


def _e_dec64(v):
    return struct.pack(">BQ", 0x84, _to_bid(v, 64, 10, 398, 16))


def _e_dec128(v):
    return b"\x94" + _to_bid(v, 128, 14, 6176, 34).to_bytes(16, "big")


def _e_uuid(v):
    return b"\x98" + v.bytes


def _e_binary(v):
    return _e_var(0xA0, 0xB0, bytes(v))


def _e_string(v):
    return _e_var(0xA1, 0xB1, v.encode("utf-8"))


def _e_symbol(v):
    return _e_var(0xA3, 0xB3, v.encode("ascii"))


def _compound(code8: int, code32: int, count: int, body: bytes) -> bytes:
    if len(body) + 1 < 256 and count < 256:
        return bytes((code8, len(body) + 1, count)) + body
    return struct.pack(">BII", code32, len(body) + 4, count) + body


def _e_list(v):
    if not v:
        return b"\x45"
    return _compound(0xC0, 0xD0, len(v), b"".join(encode(x) for x in v))


def _e_map(v):
    return _compound(0xC1, 0xD1, 2 * len(v), b"".join(encode(k) + encode(x) for k, x in v.items()))


def _e_array(v):
    et = v.element_type
    if et == "described":
        raise ValueError("arrays of described values are not encoded")
    code, enc = _ARRAY_ELEMENT[et]
    body = b"".join(enc(t.TYPE_CONSTRUCTORS[et](x) if et in t.TYPE_CONSTRUCTORS and not isinstance(x, (dict, list)) else x)[1:] for x in v)
    body = bytes((code,)) + body
    if len(body) + 1 < 256 and len(v) < 256:
        return bytes((0xE0, len(body) + 1, len(v))) + body
    return struct.pack(">BII", 0xF0, len(body) + 4, len(v)) + body


def _e_described(v):
    return b"\x00" + encode(v.descriptor) + encode(v.value)


def _wide(code: int, fmt: str) -> Callable[[Any], bytes]:
    s = struct.Struct(">B" + fmt)
    return lambda v: s.pack(code, v)


# Array elements all use one constructor, so they use the wide form of their type.
_ARRAY_ELEMENT: dict[str, tuple[int, Callable[[Any], bytes]]] = {
    "null": (0x40, _e_null),
    "boolean": (0x56, lambda v: bytes((0x56, 1 if v else 0))),
    "ubyte": (0x50, _e_ubyte),
    "byte": (0x51, _e_byte),
    "ushort": (0x60, _wide(0x60, "H")),
    "short": (0x61, _wide(0x61, "h")),
    "uint": (0x70, _wide(0x70, "I")),
    "int": (0x71, _wide(0x71, "i")),
    "ulong": (0x80, _wide(0x80, "Q")),
    "long": (0x81, _wide(0x81, "q")),
    "float": (0x72, _wide(0x72, "f")),
    "double": (0x82, _wide(0x82, "d")),
    "timestamp": (0x83, _wide(0x83, "q")),
    "char": (0x73, _e_char),
    "uuid": (0x98, _e_uuid),
    "decimal32": (0x74, _e_dec32),
    "decimal64": (0x84, _e_dec64),
    "decimal128": (0x94, _e_dec128),
    "binary": (0xB0, lambda v: struct.pack(">BI", 0xB0, len(v)) + bytes(v)),
    "string": (0xB1, lambda v: (lambda d: struct.pack(">BI", 0xB1, len(d)) + d)(v.encode("utf-8"))),
    "symbol": (0xB3, lambda v: (lambda d: struct.pack(">BI", 0xB3, len(d)) + d)(v.encode("ascii"))),
    "list": (0xD0, lambda v: struct.pack(">BII", 0xD0, *(lambda body: (len(body) + 4, len(v)))(b"".join(encode(x) for x in v))) + b"".join(encode(x) for x in v)),
    "map": (0xD1, lambda v: (lambda body: struct.pack(">BII", 0xD1, len(body) + 4, 2 * len(v)) + body)(b"".join(encode(k) + encode(x) for k, x in v.items()))),
}

_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "null": _e_null,
    "boolean": _e_bool,
    "ubyte": _e_ubyte,
    "byte": _e_byte,
    "ushort": _wide(0x60, "H"),
    "short": _wide(0x61, "h"),
    "uint": _e_uint,
    "int": _e_int,
    "ulong": _e_ulong,
    "long": _e_long,
    "float": _wide(0x72, "f"),
    "double": _wide(0x82, "d"),
    "timestamp": _wide(0x83, "q"),
    "decimal32": _e_dec32,
    "decimal64": _e_dec64,
    "decimal128": _e_dec128,
    "char": _e_char,
    "uuid": _e_uuid,
    "binary": _e_binary,
    "string": _e_string,
    "symbol": _e_symbol,
    "list": _e_list,
    "map": _e_map,
    "array": _e_array,
    "described": _e_described,
}


def encode(value: Any) -> bytes:
    """The AMQP encoding of a typed value (see `broker_filter.amqp.types`)."""
    try:
        return _ENCODERS[t.amqp_type(value)](value)
    except (struct.error, OverflowError) as e:
        raise ValueError(f"cannot encode {value!r}: {e}") from None
