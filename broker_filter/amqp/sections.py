"""AMQP 1.0 message sections: raw transfer bytes <-> `broker_filter.amqp.message.Message`.

Theory of operation: a message on the wire is a sequence of described sections (header,
delivery-annotations, message-annotations, properties, application-properties, a body of data /
amqp-sequence / amqp-value sections, footer), each tagged by a ulong or symbolic descriptor.
`scan` finds where each section starts and ends by skipping (sizes are in the headers), so the
proxy can decode only the sections a filter reads (`decode_message(data, reads)`) and forward the
bytes untouched.  `set_message_annotation` splices one new message-annotations section into the
bytes; every other section, the body included, keeps its exact bytes.
"""

from __future__ import annotations

from typing import Any, Iterable

from . import types as t
from .message import HEADER_FIELDS, PROPERTIES_FIELDS, Header, Message, Properties
from .encoding import CodecError, decode, decode_map, encode, skip

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78

_SYMBOLIC = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}

# Message section name (as in Filter.reads) -> descriptor codes holding it.
_SECTION_CODES = {
    "header": (HEADER,),
    "delivery_annotations": (DELIVERY_ANNOTATIONS,),
    "message_annotations": (MESSAGE_ANNOTATIONS,),
    "properties": (PROPERTIES,),
    "application_properties": (APPLICATION_PROPERTIES,),
    "body": (DATA, AMQP_SEQUENCE, AMQP_VALUE),
}
ALL_SECTIONS = frozenset(_SECTION_CODES)

_HEADER_NAMES = tuple(HEADER_FIELDS)
_PROPERTIES_NAMES = tuple(PROPERTIES_FIELDS)


def _descriptor(buf: bytes, pos: int) -> tuple[int, int]:
    """(section code, offset of the section's value) for the section starting at pos."""
    if buf[pos] != 0x00:
        raise CodecError("a message section is a described value", pos)
    code = buf[pos + 1]
    if code == 0x53:
        return buf[pos + 2], pos + 3
    d, end = decode(buf, pos + 1)
    if isinstance(d, t.symbol):
        c = _SYMBOLIC.get(str(d))
        if c is None:
            raise CodecError(f"unknown message section {d!r}", pos)
        return c, end
    if isinstance(d, int) and not isinstance(d, bool) and 0x70 <= d <= 0x78:
        return int(d), end
    raise CodecError(f"unknown message section descriptor {d!r}", pos)


def _sections(data: bytes, pos: int = 0):
    """(section code, start, value start, end) for every section from pos on, in order; raises
    CodecError where one cannot be read."""
    n = len(data)
    while pos < n:
        try:
            code, vpos = _descriptor(data, pos)
        except IndexError:
            raise CodecError("truncated section", pos) from None
        end = skip(data, vpos)
        yield code, pos, vpos, end
        pos = end


def scan(data: bytes) -> list[tuple[int, int, int, int]]:
    """[(section code, start, value start, end)] for every section, in order."""
    return list(_sections(data))


_CODES: dict = {}  # reads -> the descriptor codes holding those sections


def _codes(reads: Iterable[str] | None) -> frozenset:
    want = ALL_SECTIONS if reads is None else frozenset(reads)
    codes = frozenset(c for name in want for c in _SECTION_CODES.get(name, ()))
    if len(_CODES) < 256 and isinstance(reads, (frozenset, tuple, type(None))):
        _CODES[reads] = codes
    return codes


def decode_message(data: bytes, reads: Iterable[str] | None = None) -> Message:
    """The Message in `data`, decoding only the sections named in `reads` (all when None).

    Sections not read stay None.  Raises CodecError for malformed bytes.
    """
    try:
        codes = _CODES[reads]
    except (KeyError, TypeError):  # a list or set of names is no key: computed each time
        codes = _codes(reads)
    m = Message()
    m.encoded_size = len(data)
    if not codes:
        return m
    body_parts: list | None = None
    body_kind = None
    pos = 0
    n = len(data)
    try:
        while pos < n:
            if data[pos] == 0x00 and data[pos + 1] == 0x53:  # the usual small-ulong descriptor
                code, vpos = data[pos + 2], pos + 3
            else:
                code, vpos = _descriptor(data, pos)
            if code not in codes:
                c = data[vpos] if vpos + 1 < n else None
                if c == 0xC0 or c == 0xA0 or c == 0xC1:  # list8, vbin8, map8: skipped here (as `skip`)
                    pos = vpos + 2 + data[vpos + 1]
                    if pos > n:
                        raise CodecError("truncated value", vpos)
                elif c == 0x45 or c == 0x40:  # list0, null
                    pos = vpos + 1
                else:
                    pos = skip(data, vpos)
                continue
            if code == APPLICATION_PROPERTIES:
                value, pos = decode_map(data, vpos)
                m.application_properties = _map(value, "application-properties")
                continue
            value, pos = decode(data, vpos)
            if code == PROPERTIES:
                m.properties = _properties(value)
            elif code == MESSAGE_ANNOTATIONS:
                m.message_annotations = _map(value, "message-annotations")
            elif code == HEADER:
                m.header = _header(value)
            elif code == DELIVERY_ANNOTATIONS:
                m.delivery_annotations = _map(value, "delivery-annotations")
            elif code == AMQP_VALUE:
                m.body = value
            elif code in (DATA, AMQP_SEQUENCE):
                if body_parts is None:
                    body_parts, body_kind = [], code
                elif body_kind != code:
                    raise CodecError("a body mixes data and amqp-sequence sections", vpos)
                body_parts.append(value)
    except IndexError:
        raise CodecError("truncated section", pos) from None
    if body_parts is not None:
        if body_kind == DATA:
            m.body = body_parts[0] if len(body_parts) == 1 else b"".join(body_parts)
        else:
            m.body = body_parts[0] if len(body_parts) == 1 else [x for part in body_parts for x in part]
    return m


def _map(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CodecError(f"{what} is not a map")
    return value


def _header(value: Any) -> Header:
    if value is None:
        value = []
    if not isinstance(value, list):
        raise CodecError("header is not a list")
    return Header(**dict(zip(_HEADER_NAMES, value)))


def _properties(value: Any) -> Properties:
    if value is None:
        value = []
    if not isinstance(value, list):
        raise CodecError("properties is not a list")
    fields = dict(zip(_PROPERTIES_NAMES, value))
    for k in ("to", "reply_to"):  # some clients send addresses as symbols; the model holds strings
        v = fields.get(k)
        if isinstance(v, t.symbol):
            fields[k] = str(v)
    return Properties(**fields)


def encode_section(code: int, value: Any) -> bytes:
    return b"\x00\x53" + bytes((code,)) + encode(value)


def encode_message(message: Message) -> bytes:
    """Bytes for a whole Message (used for messages the proxy creates and in tests)."""
    parts = []
    if message.header is not None:
        fields = [getattr(message.header, f) for f in _HEADER_NAMES]
        parts.append(encode_section(HEADER, _trim(fields)))
    if message.delivery_annotations is not None:
        parts.append(encode_section(DELIVERY_ANNOTATIONS, message.delivery_annotations))
    if message.message_annotations is not None:
        parts.append(encode_section(MESSAGE_ANNOTATIONS, message.message_annotations))
    if message.properties is not None:
        fields = [getattr(message.properties, f) for f in _PROPERTIES_NAMES]
        parts.append(encode_section(PROPERTIES, _trim(fields)))
    if message.application_properties is not None:
        parts.append(encode_section(APPLICATION_PROPERTIES, message.application_properties))
    if message.has_body:
        body = message.body
        if isinstance(body, (bytes, bytearray, memoryview)):
            parts.append(encode_section(DATA, bytes(body)))
        else:
            parts.append(encode_section(AMQP_VALUE, body))
    return b"".join(parts)


def _trim(fields: list) -> list:
    while fields and fields[-1] is None:
        fields.pop()
    return fields


_BEFORE_MA = (HEADER, DELIVERY_ANNOTATIONS)


def annotations_section(data: bytes, whole: bool = True) -> bytes | None:
    """The bytes of the message-annotations value in `data` (None when it has none): the key under
    which a reader of one annotation can cache what it decoded, as most messages in a run carry the
    same annotations.  `whole`: every section is checked to be readable (CodecError where one is
    not); else the walk ends where the annotations are, or would be."""
    found = None
    for code, _, vpos, end in _sections(data):
        if code == MESSAGE_ANNOTATIONS and found is None:
            found = bytes(data[vpos:end])
        if not whole and code >= MESSAGE_ANNOTATIONS:
            break
    return found


_MERGED_MAX = 256


def set_message_annotation(data: bytes, key: Any, value: Any, encoded: bytes | None = None,
                           merged: dict | None = None) -> bytes:
    """`data` with message annotation key = value (replacing any), every other section unchanged.
    `encoded`: the bytes of a message-annotations section holding just key = value, spliced in as
    they are when `data` has no message annotations yet (a caller's cache).  `merged` (with
    `encoded`): a caller's cache of the sections made from message annotations already there, keyed
    by their bytes, so a run of messages carrying the same ones decodes and encodes them once."""
    insert_at = start = 0
    n = len(data)
    try:
        while start < n:
            code, vpos = _descriptor(data, start)
            if code == MESSAGE_ANNOTATIONS:
                end = skip(data, vpos)
                cache_key = (bytes(data[start:end]), encoded) if merged is not None and encoded is not None else None
                section = merged.get(cache_key) if cache_key is not None else None
                if section is None:
                    current, end = decode(data, vpos)
                    annotations = dict(_map(current, "message-annotations"))
                    annotations[key] = value
                    section = encode_section(MESSAGE_ANNOTATIONS, annotations)
                    if cache_key is not None:
                        if len(merged) >= _MERGED_MAX:
                            merged.clear()
                        merged[cache_key] = section
                return data[:start] + section + data[end:]
            if code not in _BEFORE_MA:
                break
            start = insert_at = skip(data, vpos)
        for _ in _sections(data, start):  # the rest stays as it is, and must be readable too
            pass
    except IndexError:
        raise CodecError("truncated section", start) from None
    section = encoded if encoded is not None else encode_section(MESSAGE_ANNOTATIONS, {key: value})
    return data[:insert_at] + section + data[insert_at:]


def redelivery_bytes(data: bytes, delivery_count: int | None = None, *, failed: int = 0) -> bytes:
    """`data` with its header saying first-acquirer = false and delivery-count = `delivery_count`
    (None: the count the header already has, plus `failed`); a header is added if there is none and
    every other section keeps its bytes.  What a broker sends when it delivers a message again; the
    stored message is not changed.  Bytes that cannot be parsed are returned unchanged."""
    try:
        sections = scan(data)
        fields: list = []
        start = end = 0
        if sections and sections[0][0] == HEADER:
            _, start, vpos, end = sections[0]
            value, _ = decode(data, vpos)
            if not isinstance(value, list):
                return data
            fields = list(value)
    except (CodecError, IndexError, ValueError):
        return data
    fields += [None] * (5 - len(fields))
    if delivery_count is None:
        delivery_count = (fields[4] if isinstance(fields[4], int) else 0) + failed
    fields[3] = False
    fields[4] = t.uint(min(delivery_count, 0xFFFFFFFF))
    return data[:start] + encode_section(HEADER, fields) + data[end:]
