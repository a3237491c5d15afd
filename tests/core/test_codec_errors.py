"""Codec errors say what is wrong and where (the value's AMQP name and its byte offset), never a
Python exception's name; nesting is limited to `MAX_DEPTH` compound or described values."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_filter.amqp import types as t
from broker_filter.amqp import CodecError, decode, encode
from broker_filter.amqp.encoding import MAX_DEPTH
from strategies import amqp_values

PYTHON_NAMES = re.compile(r"[A-Z][a-z]+(Error|Exception)|Traceback|bytearray|index out of range")
SELECTOR = t.Described(t.symbol("apache.org:selector-filter:string"), "a = 1")


def refused(data: bytes) -> CodecError:
    with pytest.raises(CodecError) as info:
        decode(data)
    assert not PYTHON_NAMES.search(str(info.value)), str(info.value)
    return info.value


def nested_lists(depth: int) -> bytes:
    data = encode(1)
    for _ in range(depth):
        data = struct.pack(">BII", 0xD0, len(data) + 4, 1) + data
    return data


def not_filters(depth: int) -> bytes:
    """A filter-set holding `depth` not-filters around a selector (built as bytes: no recursion)."""
    data = encode(SELECTOR)
    descriptor = encode(t.symbol("apache.org:not-filter:list"))
    for _ in range(depth):
        data = b"\x00" + descriptor + struct.pack(">BII", 0xD0, len(data) + 4, 1) + data
    body = encode(t.symbol("deep")) + data
    return struct.pack(">BII", 0xD1, len(body) + 4, 2) + body


@pytest.mark.parametrize(
    "data,message",
    [
        (encode({t.symbol("k"): "value", "x": [1, 2]})[:12], "truncated map at byte 0"),
        (bytes([0xC0, 0x05, 0x01, 0xA1, 0x09]) + b"abc", "truncated string at byte 3"),
        (bytes([0xC0, 0x03, 0x01, 0x99, 0x00]), "unknown type code 0x99 in list at byte 0"),
        (bytes([0xC0, 0x04, 0x01, 0xA1, 0x02, 0xFF]) + b"\xfe", "string is not valid UTF-8 at byte 3"),
        (bytes([0xC1, 0x03, 0x01, 0xA1, 0x00]), "malformed map: odd number of items (1) at byte 0"),
        (bytes([0x56, 0x07]), "malformed boolean: byte 7 is neither 0 nor 1 at byte 0"),
        (bytes([0x71, 0x00, 0x01]), "truncated int at byte 0"),
        (b"", "truncated value at byte 0"),
    ],
)
def test_errors_name_the_value_and_its_offset(data, message):
    assert str(refused(data)) == message


def test_nesting_is_limited():
    assert decode(nested_lists(MAX_DEPTH))[0] is not None
    error = refused(nested_lists(MAX_DEPTH + 1))
    assert str(error) == f"values nested deeper than {MAX_DEPTH} at byte {9 * MAX_DEPTH}"  # each list32 header is 9 bytes
    refused(nested_lists(5000))  # far beyond: the same clean refusal


def test_filter_sets_within_the_filter_limit_decode_and_deeper_ones_are_refused():
    value, _ = decode(not_filters(32))  # the filter-set compiler's own limit is 32
    assert list(value) == [t.symbol("deep")]
    assert "nested deeper than" in str(refused(not_filters(2000)))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 79))
def test_corrupted_values_are_described_without_python_names(tail, cut):
    raw = encode({t.symbol("k"): [t.Described(t.symbol("d"), "text"), 1.5, t.uint(7)], "m": {"x": b"\x00"}})
    for data in (raw[:cut] + tail, raw[:cut], bytes([raw[0]]) + tail):
        try:
            decode(data)
        except CodecError as e:
            assert " at byte " in str(e) and not PYTHON_NAMES.search(str(e)), str(e)


def _outcome(fn, data: bytes):
    try:
        value, end = fn(data, 0)
    except CodecError as e:
        return "error", str(e)
    return "value", end, repr(value), [type(v) for v in value.values()] if isinstance(value, dict) else None


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.one_of(st.text(max_size=12), st.integers(-(2**63), 2**63 - 1)),
                    st.one_of(amqp_values(), st.text(min_size=200, max_size=300), st.lists(st.integers(0, 9), max_size=3)),
                    max_size=8),
    st.binary(max_size=40), st.integers(0, 400),
)
def test_the_section_map_decoder_gives_what_the_general_decoder_gives(props, tail, cut):
    """`decode_map` (the application-properties fast path) agrees with `decode` on every map,
    value types included, and on every corruption of one: the same value, or the same error."""
    from broker_filter.amqp.encoding import decode_map

    raw = encode(props)
    for data in (raw, raw[:cut], raw[:cut] + tail, raw + tail, bytes([raw[0]]) + tail):
        assert _outcome(decode_map, data) == _outcome(decode, data)
    for view in (bytearray(raw), memoryview(raw), memoryview(raw[:cut] + tail)):  # any buffer the same
        assert _outcome(decode_map, view) == _outcome(decode, view)


def _sections(*parts: tuple[int, bytes]) -> tuple[bytes, list[int]]:
    """A message of (section code, encoded value) parts, and the offsets where its sections end."""
    data, ends = b"", []
    for code, value in parts:
        data += b"\x00\x53" + bytes([code]) + value
        ends.append(len(data))
    return data, ends


@pytest.mark.parametrize("parts", [
    # as RabbitMQ 3.10 delivers a rhea producer's message: header list8, properties list0, data vbin8
    ((0x70, encode([False, t.ubyte(4)])), (0x73, b"\x45"), (0x74, encode({"half": 1, "i": 7})),
     (0x75, b"\xa0\x40" + b"x" * 64)),
    # map8 annotations and a null footer skipped, a vbin32 body
    ((0x72, encode({t.symbol("x-opt-a"): "b"})), (0x74, encode({"k": "v"})),
     (0x75, b"\xb0\x00\x00\x00\x03abc"), (0x78, b"\x40")),
])
def test_a_message_cut_inside_a_section_it_skips_is_refused(parts):
    """`decode_message` skips the sections a filter does not read without decoding them; a message
    cut anywhere inside one is still refused (a cut at a section's end is a shorter message)."""
    from broker_filter.amqp import decode_message

    data, ends = _sections(*parts)
    reads = frozenset({"application_properties"})
    props = decode_message(data, reads).application_properties
    assert props == decode(parts[[code for code, _ in parts].index(0x74)][1])[0]
    for cut in range(1, len(data)):
        if cut in ends:
            assert decode_message(data[:cut], reads) is not None
            continue
        with pytest.raises(CodecError) as info:
            decode_message(data[:cut], reads)
        assert " at byte " in str(info.value) and not PYTHON_NAMES.search(str(info.value)), (cut, str(info.value))
