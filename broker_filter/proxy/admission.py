"""Messages the daemon does not forward because its upstream would break the shared connection on them.

Theory of operation: every client's publishes travel on the one upstream connection.  RabbitMQ 3.x's
AMQP 1.0 plugin parses each message it receives; a message its parser or its section rules cannot
take crashes the connection's process, and the broker drops the TCP connection without a close frame
(measured on 3.10.8; proton reports `amqp:connection:framing-error`, "connection aborted").  Directly,
only the sender is hurt; through the daemon, every client's links on that connection are.  So the daemon
refuses such a message itself, with a `rejected` outcome naming what the upstream cannot take
(`amqp:not-implemented`), and the sender's link stays usable.  RabbitMQ 4 parses messages in the
sender's session: what it cannot take ends that session (`amqp:internal-error`), which, a session being
the link's own upstream, detaches only the sender's link; nothing is refused in front of it.

Which rules apply is an upstream trait (`Traits.closes_on_unparsable`, from the open frame).  The rules
for RabbitMQ 3.x, read from its source (`amqp10_binary_parser`, `amqp10_framing:decode`,
`rabbit_amqp1_0_message:assemble`) and checked against 3.10 by tests/proxy/test_poison_rules.py:

1. Sections in the order header, message-annotations, properties, application-properties, any number
   and mix of body sections (data, amqp-sequence, amqp-value), footer last, each of the others at most
   once; never delivery-annotations (`assemble` has no place for them).
2. Arrays, anywhere outside data sections: their element type one of symbol, string, ubyte, byte,
   ushort, short, uint, int, ulong, long, boolean or array (`parse_constructor`; float, double, binary,
   uuid, timestamp, char, decimal, list, map and the compact encodings are not), optionally behind a
   descriptor; an array of nulls only empty (`parse_array_primitive` reads a byte per null).
3. No described value where `amqp10_framing:decode` looks: the fields of the header and properties, the
   keys and values of message-annotations, application-properties and footer, the elements of an
   amqp-sequence, the element of an amqp-value list, an amqp-value map's `content` entry.  decode
   takes a descriptor there for one of the protocol's own types and fails on any other; all are
   refused (no client has reason to put the protocol's own types there).
4. An amqp-value list has at most one element (`fill_from_list` writes the elements into the
   one-field amqp-value record); a header has at most 5 fields, properties at most 13, and neither is a
   scalar.

Cost (`bench/admission_bench.py`): the usual message is cleared by a walk over its section headers
and three C-speed looks at the bytes up to the end of its last section that is not data (no 0xE0 or
0xF0 byte, which may start an array; no zero byte but the sections' own descriptors, so no described
value); zero bytes in numbers, timestamps or uuids add a walk over the items of the sections holding
them; the careful walk (`_careful`, which names what is refused) runs only where a value may break a
rule.  Upstreams without the trait cost one attribute test.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from ..amqp.encoding import _FIXED, CodecError, skip
from ..amqp.sections import (AMQP_SEQUENCE, AMQP_VALUE, APPLICATION_PROPERTIES, DATA, DELIVERY_ANNOTATIONS,
                             FOOTER, HEADER, MESSAGE_ANNOTATIONS, PROPERTIES, _descriptor)

NOT_IMPLEMENTED = "amqp:not-implemented"
DECODE_ERROR = "amqp:decode-error"

# Section code -> its place in the order RabbitMQ 3.x takes (rule 1); body sections share one.
_PLACE = {HEADER: 0, MESSAGE_ANNOTATIONS: 1, PROPERTIES: 2, APPLICATION_PROPERTIES: 3, DATA: 4,
          AMQP_SEQUENCE: 4, AMQP_VALUE: 4, FOOTER: 5}
_BODY = 4
_NAMES = {HEADER: "header", DELIVERY_ANNOTATIONS: "delivery-annotations",
          MESSAGE_ANNOTATIONS: "message-annotations", PROPERTIES: "properties",
          APPLICATION_PROPERTIES: "application-properties", DATA: "data", AMQP_SEQUENCE: "amqp-sequence",
          AMQP_VALUE: "amqp-value", FOOTER: "footer"}
_FIELDS = {HEADER: 5, PROPERTIES: 13}  # rule 4
_MAPS = frozenset({MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES, FOOTER})

# Rule 2: the array element types RabbitMQ 3.x parses (by type code), and the names of the others.
_ARRAY_OK = frozenset({0xA3, 0xB3, 0xA1, 0xB1, 0x50, 0x51, 0x60, 0x61, 0x70, 0x71, 0x80, 0x81, 0x56, 0xF0})
_TYPE_NAMES = {0x40: "null", 0x41: "boolean", 0x42: "boolean", 0x43: "uint", 0x44: "ulong", 0x45: "list",
               0x52: "uint", 0x53: "ulong", 0x54: "int", 0x55: "long", 0x72: "float", 0x73: "char",
               0x74: "decimal32", 0x82: "double", 0x83: "timestamp", 0x84: "decimal64", 0x94: "decimal128",
               0x98: "uuid", 0xA0: "binary", 0xB0: "binary", 0xC0: "list", 0xD0: "list", 0xC1: "map",
               0xD1: "map", 0xE0: "array"}
_u32 = struct.Struct(">I").unpack_from


class _Refused(Exception):
    """What the upstream cannot take (its description), raised from inside the walk."""


def refusal(traits: Any, data: bytes, upstream: str = "the upstream") -> tuple[str, str] | None:
    """(condition, description) when `data`, a message's bytes as they go upstream, is one the upstream
    with `traits` would drop its connection on; None when it may go.  `upstream` names it in the
    description (its product, version and address)."""
    if not traits.closes_on_unparsable:
        return None
    try:
        what = _rabbitmq3(data)
    except (CodecError, IndexError, struct.error) as e:
        return DECODE_ERROR, f"message not decodable: {e}"
    if what is None:
        return None
    return NOT_IMPLEMENTED, (f"{upstream} cannot take {what}: it would close the connection every client "
                             "of this daemon shares; the message was not forwarded")


def refused(upstream: Any, data: bytes) -> tuple[str, str] | None:
    """`refusal` for the message `data` going to `upstream` (an `upstream.UpstreamBase`; those without
    the trait, as the embedded broker, take every message)."""
    traits = upstream.traits
    if not traits.closes_on_unparsable:
        return None
    try:
        if _rabbitmq3(data) is None:  # (the usual case: no description to make)
            return None
    except (CodecError, IndexError, struct.error):
        pass
    product = " ".join(str(p) for p in (upstream.product, upstream.version) if p)
    return refusal(traits, data, f"upstream {upstream.name} ({product or 'RabbitMQ 3'})")


_SIZE8 = frozenset({0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0})  # constructors with a one-byte size
_SIZE32 = frozenset({0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0})
_COMPOUND = frozenset({0xC0, 0xC1, 0xD0, 0xD1})
_STRUCTURED = _COMPOUND | {0xE0, 0xF0}  # an amqp-value body of another type holds nothing 3.x fails on
_SIZE8_ITEM = _SIZE8 - {0xE0}  # (an array is looked at with care)
_SIZE32_ITEM = _SIZE32 - {0xF0}
# By type code: the width of a fixed-width value, -1 / -4 for a one- / four-byte size, -9 unknown.
_WIDTH = [-9] * 256
for _c, _w in _FIXED.items():
    _WIDTH[_c] = _w
for _c in _SIZE8:
    _WIDTH[_c] = -1
for _c in _SIZE32:
    _WIDTH[_c] = -4
_STEP = [1 + _w if _w >= 0 else 0 for _w in _WIDTH]
# A run of values none of which is described or an array: fixed-width values, and values with a size
# below 256 (a list or map among them skipped whole: `_ITEMS` is tried only where no byte may start an
# array).  Every value's encoding is told by its first byte (and size), so the match is the walk.
_SIZED = b"(?:" + b"|".join(re.escape(bytes([k])) + b".{%d}" % k for k in range(256)) + b")"
_ITEMS = re.compile(
    b"(?:" + b"|".join(
        [b"[" + b"".join(re.escape(bytes([c])) for c in sorted(_c for _c, _w in _FIXED.items() if _w == w))
         + b"]" + (b".{%d}" % w if w else b"") for w in sorted(set(_FIXED.values()))]
        + [b"[\xa0\xa1\xa3\xc0\xc1]" + _SIZED, b"[\xb0\xb1\xb3\xd0\xd1]\x00\x00\x00" + _SIZED]) + b")*",
    re.DOTALL)  # by type code: a fixed-width value's whole size


def _rabbitmq3(data: bytes) -> str | None:
    """What in `data` RabbitMQ 3.x cannot take (rules 1-4 of the module docstring), or None.

    It runs for every message, so the usual message is cleared by a lean walk over its section headers
    (small descriptors, values with a size) and C-speed looks at the bytes up to the end of the last
    section that is not data: no byte that may start an array, and no zero byte but the sections' own
    descriptors (each starts with one), so no described value; where numbers put zero bytes in a
    section, its items are matched by `_ITEMS`, a walk at C speed.  Anything else is walked with care
    (`_careful`)."""
    n = len(data)
    pos = 0
    place = -1
    starts = span = spanned = 0
    shaped = False  # a section's shape asks for a look (a list's count, a section that is not a map)
    while pos < n:
        if data[pos] or data[pos + 1] != 0x53:
            return _careful(data)  # a symbolic descriptor
        code = data[pos + 2]
        c = data[pos + 3]
        w = _WIDTH[c]
        if w >= 0:
            end = pos + 4 + w  # list0, null, a number
        elif w == -1:
            end = pos + 5 + data[pos + 4]
        elif w == -4:
            end = pos + 8 + _u32(data, pos + 4)[0]
        else:
            return _careful(data)  # described, or not a type code
        at = _PLACE.get(code, 9)
        if at < place or (at == place and at != _BODY) or place == 5 or at == 9:
            return _careful(data)  # out of order, or a section 3.x has no place for
        place = at
        starts += 1
        if code == AMQP_VALUE and c not in _STRUCTURED:
            pass  # a scalar body (binary, a string, a number): nothing in it 3.x could fail on
        elif code != DATA:
            span, spanned = end, starts
            if code == PROPERTIES or code == HEADER:
                if c == 0xC0:
                    shaped = shaped or data[pos + 5] > _FIELDS[code]
                elif c == 0xD0:
                    shaped = shaped or _u32(data, pos + 8)[0] > _FIELDS[code]
                elif c != 0x45:
                    shaped = True
            elif code == AMQP_VALUE:
                if c == 0xC0 or c == 0xD0:
                    shaped = True
            elif c != 0xC1 and c != 0xD1:
                shaped = True  # annotations, application-properties or footer not a map; an amqp-sequence
        pos = end
    if pos != n:
        raise CodecError("truncated section", pos)
    if not span:
        return None
    if shaped:
        return _careful(data)
    find = data.find
    arrays_in = find(b"\xe0", 0, span) >= 0 or find(b"\xf0", 0, span) >= 0
    if not arrays_in and data.count(b"\x00", 0, span) == spanned:
        return None
    # Zero bytes or 0xE0 / 0xF0 in values (numbers, timestamps, uuids, sizes): the sections' items are
    # walked for a described value or an array, every section being a list or a map with a size here
    # (but an amqp-value's); a value that is itself a list or map is looked into for arrays only.
    pos = 0
    width = _WIDTH
    step = _STEP
    while pos < span:
        code, c = data[pos + 2], data[pos + 3]
        if c in _SIZE8:
            end, p = pos + 5 + data[pos + 4], pos + 6
        elif c in _SIZE32:
            end, p = pos + 8 + _u32(data, pos + 4)[0], pos + 12
        else:
            pos += 4 + width[c]  # list0, null, a number: no items, no array
            continue
        if code == DATA or (code == AMQP_VALUE and c not in _STRUCTURED):
            pos = end  # (a scalar amqp-value with a size: a string or binary)
            continue
        arrays = arrays_in and (find(b"\xe0", pos + 3, end) >= 0 or find(b"\xf0", pos + 3, end) >= 0)
        if code == AMQP_VALUE:
            if arrays or ((c == 0xC1 or c == 0xD1) and find(b"\x00", p, end) >= 0 and find(b"content", p, end) >= 0):
                return _careful(data)  # an array in it; or a map: its `content` entry
            pos = end
            continue
        if arrays:
            stop = end
        elif find(b"\x00", p, end) < 0 or _ITEMS.fullmatch(data, p, end) is not None:
            pos = end  # no described item (the usual case, read at C speed)
            continue
        else:  # past the last zero byte, no value can be described
            stop = data.rfind(b"\x00", p, end) + 1
        while p < stop:
            c = data[p]
            w = step[c]
            if w:
                p += w
                continue
            if c in _SIZE8_ITEM:
                q = p + 2 + data[p + 1]
            elif c in _SIZE32_ITEM:
                q = p + 5 + _u32(data, p + 1)[0]
            else:
                return _careful(data)  # described, an array, or not a type code
            if arrays and c in _COMPOUND and (find(b"\xe0", p, q) >= 0 or find(b"\xf0", p, q) >= 0):
                return _careful(data)
            p = q
        pos = end
    return None


def _careful(data: bytes) -> str | None:
    """`_rabbitmq3`, every section looked into."""
    place = -1
    pos = 0
    n = len(data)
    last = 0
    while pos < n:
        if data[pos] == 0x00 and data[pos + 1] == 0x53:
            code, vpos = data[pos + 2], pos + 3
        else:
            code, vpos = _descriptor(data, pos)
        end = skip(data, vpos)
        at = _PLACE.get(code)
        if at is None:
            return f"a {_NAMES.get(code, 'unknown')} section"
        if at < place or (at == place and at != _BODY):
            return f"message sections out of order ({_NAMES[code]} after {_NAMES[last]})"
        if place == 5:
            return "a section after the footer"
        place, last = at, code
        if code != DATA:
            what = _section(data, code, vpos, end)
            if what is not None:
                return what
        pos = end
    return None


def _section(data: bytes, code: int, vpos: int, end: int) -> str | None:
    """Rules 2-4 for the section `code` (not data) whose value is from vpos to end."""
    find = data.find
    try:
        if find(b"\xe0", vpos, end) >= 0 or find(b"\xf0", vpos, end) >= 0:
            _arrays(data, vpos, end)
        if code == AMQP_VALUE:
            _value(data, vpos, end)
        else:
            _items(data, vpos, code, find(b"\x00", vpos, end) >= 0)
    except _Refused as e:
        return str(e)
    return None


def _compound(data: bytes, pos: int) -> tuple[int, int] | None:
    """(element count, offset of the first element) of the list or map at pos; None if it is neither."""
    c = data[pos]
    if c == 0x45:
        return 0, pos + 1
    if c == 0xC0 or c == 0xC1:
        return data[pos + 2], pos + 3
    if c == 0xD0 or c == 0xD1:
        return _u32(data, pos + 5)[0], pos + 9
    return None


def _items(data: bytes, vpos: int, code: int, described: bool) -> None:
    """Rules 3 and 4 for the section `code` (not data, not amqp-value) whose value is at vpos;
    `described`: a 0x00 byte is in it, so its items are looked at."""
    name = _NAMES[code]
    c = data[vpos]
    is_map = c == 0xC1 or c == 0xD1
    if code in _MAPS:
        if not is_map:
            raise _Refused(f"a {name} section that is not a map")
    elif code in _FIELDS:
        if is_map:
            return  # a header or properties as a map: decoded by its field names, whatever else it holds
        if _compound(data, vpos) is None:
            raise _Refused(f"a {name} section that is not a list")
    elif is_map or _compound(data, vpos) is None:
        raise _Refused(f"a {name} section that is not a list")
    count, p = _compound(data, vpos)
    limit = _FIELDS.get(code)
    if limit is not None and count > limit:
        raise _Refused(f"a {name} section of {count} fields (at most {limit})")
    if not described:
        return
    width = _WIDTH
    end = skip(data, vpos)
    for _ in range(count):
        if p >= end:
            break  # (fewer items than counted: RabbitMQ 3.x takes the ones there are)
        c = data[p]
        if c == 0x00:
            raise _Refused(f"a described value in {name}")
        w = width[c]
        if w >= 0:
            p += 1 + w
        elif w == -1:
            p += 2 + data[p + 1]
        elif w == -4:
            p += 5 + _u32(data, p + 1)[0]
        else:
            p = skip(data, p)


def _value(data: bytes, vpos: int, end: int) -> None:
    """Rules 3 and 4 for an amqp-value section's value at vpos."""
    c = data[vpos]
    if c in (0xC0, 0xD0, 0x45):
        count, p = _compound(data, vpos)
        if count > 1:
            raise _Refused(f"an amqp-value body holding a list of {count} values (at most 1)")
        if count == 1 and data[p] == 0x00:
            raise _Refused("an amqp-value body holding a list of a described value")
    elif (c == 0xC1 or c == 0xD1) and data.find(b"content", vpos, end) >= 0:
        count, p = _compound(data, vpos)
        for _ in range(count // 2):
            key, p = p, skip(data, p)
            if data[key] == 0xA3 and data[key + 1:p] == b"\x07content" and data[p] == 0x00:
                raise _Refused("an amqp-value body holding a map whose symbol key 'content' has a described value")
            p = skip(data, p)


def _arrays(data: bytes, pos: int, end: int) -> None:
    """Rule 2 for every value from pos to end."""
    while pos < end:
        c = data[pos]
        if c == 0xE0 or c == 0xF0:
            _array(data, pos)
            pos = skip(data, pos)
        elif c == 0x00:
            p = skip(data, pos + 1)  # the descriptor
            _arrays(data, pos + 1, p)
            nxt = skip(data, p)
            _arrays(data, p, nxt)
            pos = nxt
        else:
            shape = _compound(data, pos)
            nxt = skip(data, pos)
            if shape is not None and shape[0]:
                _arrays(data, shape[1], nxt)
            pos = nxt


def _array(data: bytes, pos: int) -> None:
    """Rule 2 for the array at pos (and the arrays in it)."""
    if data[pos] == 0xE0:
        _elements(data, data[pos + 2], pos + 3, "an array")
    else:
        _elements(data, _u32(data, pos + 5)[0], pos + 9, "an array")


def _elements(data: bytes, count: int, p: int, what: str) -> None:
    """Rule 2 for an array of `count` elements whose element constructor is at p."""
    if data[p] == 0x00:  # described elements: the element type follows the descriptor
        p = skip(data, p + 1)
        what = f"{what} of described values"
    ctor = data[p]
    if ctor == 0x40 and count == 0:
        return
    if ctor not in _ARRAY_OK:
        raise _Refused(f"{what} of {_TYPE_NAMES.get(ctor, f'type 0x{ctor:02x}')} elements")
    if ctor == 0xF0:  # arrays of arrays: each element is an array32 without its constructor
        r = p + 1
        for _ in range(count):
            _elements(data, _u32(data, r + 4)[0], r + 8, f"{what} of arrays")
            r += 4 + _u32(data, r)[0]
