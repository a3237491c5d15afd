"""broker_filter.amqp against proton's own encoder/decoder: values round-trip with their AMQP types,
only the requested sections are decoded, the annotation splice leaves the body bytes alone, and any
input is either decoded or refused with CodecError."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import UNDESCRIBED, Array, Data, Described, Message, char, float32, int32, short, symbol, timestamp, ubyte, uint, ulong

from broker_filter.amqp import types as t
from broker_filter.amqp import CodecError, decode, decode_message, encode, encode_message, set_message_annotation

VALUES = [
    None, True, False, 0, 1, -1, 127, -129, 2**40, -(2**62), ubyte(7), short(-3), int32(-70000), uint(0), uint(300),
    ulong(0), ulong(5), ulong(2**63), float32(1.5), 2.25, char("é"), timestamp(1700000000123), uuid.uuid4(),
    b"", b"\x00" * 300, "", "x" * 300, "ünïcode", symbol("sym"), symbol("s" * 300), [], [1, "a", [None]],
    {"k": 1, symbol("s"): [2]}, {i: str(i) for i in range(100)}, Described(symbol("d"), [1, 2]),
    Described(ulong(0x468C00000004), "a = 1"), Array(UNDESCRIBED, Data.INT, 1, 2, 3), Array(UNDESCRIBED, Data.STRING, "a", "b"),
]


def proton_bytes(value) -> bytes:
    d = Data()
    d.put_object(value)
    return d.encode()


def proton_value(raw: bytes):
    d = Data()
    d.decode(raw)
    d.rewind()
    d.next()
    obj = d.get_object()
    return bytes(obj) if isinstance(obj, memoryview) else obj  # the view dies with `d`


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_values_round_trip_with_proton(value):
    raw = proton_bytes(value)
    ours, end = decode(raw, 0)
    assert end == len(raw)
    back = proton_value(encode(ours))
    if isinstance(value, Array):
        assert (back.type, back.elements) == (value.type, value.elements)
    elif isinstance(value, Described):
        assert (back.descriptor, back.value) == (value.descriptor, value.value)
    elif isinstance(value, bytes):
        assert bytes(back) == value  # proton hands binary back as a memoryview
    else:
        assert back == value
        assert type(back) is type(value) or isinstance(value, (bool, type(None)))


def test_typed_values_keep_their_amqp_types():
    raw = proton_bytes({"a": ubyte(1), "b": uint(2), "c": symbol("s"), "d": timestamp(3), "e": float32(0.5)})
    m, _ = decode(raw, 0)
    assert [t.amqp_type(m[k]) for k in "abcde"] == ["ubyte", "uint", "symbol", "timestamp", "float"]


def full_message() -> Message:
    return Message(
        id="id-1", subject="s", address="q", reply_to="r", correlation_id=ulong(9), content_type="text/plain",
        durable=True, priority=7, ttl=1000, delivery_count=2, creation_time=1700000000.5,
        annotations={symbol("x-opt-a"): 1}, instructions={symbol("x-opt-i"): "i"},
        properties={"color": "red", "n": 5, "u": ubyte(3)}, body={"nested": ["body", 1]},
    )


def test_decode_only_requested_sections():
    raw = full_message().encode()
    m = decode_message(raw, {"application_properties"})
    assert m.application_properties == {"color": "red", "n": 5, "u": 3}
    assert m.header is None and m.properties is None and m.message_annotations is None and not m.has_body
    full = decode_message(raw)
    assert full.properties.subject == "s" and full.properties.to == "q" and full.properties.correlation_id == 9
    assert full.header.priority == 7 and t.amqp_type(full.header.priority) == "ubyte"
    assert full.header.durable is True and full.header.delivery_count == 2
    assert full.properties.creation_time == 1700000000500
    assert full.message_annotations == {symbol("x-opt-a"): 1}
    assert full.delivery_annotations == {symbol("x-opt-i"): "i"}
    assert full.body == {"nested": ["body", 1]}
    assert full.encoded_size == len(raw)


@pytest.mark.parametrize("body", ["text", b"binary", None, [1, 2]])
def test_splice_keeps_every_other_byte(body):
    msg = full_message()
    msg.body = body
    raw = msg.encode()
    out = set_message_annotation(raw, symbol("x-opt-broker-filter-origin"), "inst/7")
    back = Message()
    back.decode(out)
    assert back.annotations == {symbol("x-opt-a"): 1, symbol("x-opt-broker-filter-origin"): "inst/7"}
    assert back.body == msg.body or (isinstance(body, bytes) and bytes(back.body) == body)
    assert back.properties == msg.properties and back.subject == "s"
    # the sections after message-annotations are byte-identical
    assert raw.endswith(out[-(len(raw) - raw.index(b"\x00\x53\x73")):])


def test_splice_into_a_message_without_annotations():
    raw = Message(body="b", durable=True).encode()
    out = set_message_annotation(raw, symbol("k"), "v")
    back = Message()
    back.decode(out)
    assert back.annotations == {symbol("k"): "v"} and back.body == "b" and back.durable


def test_encode_message_round_trips_through_proton():
    m = decode_message(full_message().encode())
    back = Message()
    back.decode(encode_message(m))
    assert back.subject == "s" and back.properties["u"] == 3 and back.body == {"nested": ["body", 1]}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_codec_error(data):
    for reads in (None, {"application_properties"}):
        try:
            decode_message(data, reads)
        except CodecError:
            pass
    try:
        set_message_annotation(data, symbol("k"), 1)
    except CodecError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=60))
def test_truncated_and_corrupted_messages(data):
    raw = full_message().encode()
    cut = raw[: len(data) % len(raw)] + data
    try:
        decode_message(cut)
    except CodecError:
        pass


def test_char_beyond_unicode_is_a_codec_error():
    # A header whose first field is an AMQP char 0x80000000 (found by the fuzz test above): a clear
    # CodecError, not an OverflowError that would escape the proxy's decode error handling.
    with pytest.raises(CodecError):
        decode_message(b"\x00Sp\xc0\x0c\x05AP\x07\x00\x00\x00\x00s\x80\x00\x00\x00")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 120), st.binary(max_size=30))
def test_the_origin_annotation_is_spliced_into_every_readable_message_and_only_those(cut, tail):
    """A published message gets the annotation when all its sections can be read (what `scan`
    accepts); a message that cannot be read is refused with a CodecError, never another error."""
    from broker_filter.amqp import scan

    raw = Message(body=b"x" * 20, durable=True, properties={"n": 1}, subject="s").encode()
    for data in (raw, raw[:cut], raw[:cut] + tail, raw + tail):
        try:
            scan(data)
            readable = True
        except CodecError:
            readable = False
        try:
            out = set_message_annotation(data, symbol("k"), "v")
        except CodecError:
            assert not readable
            continue
        assert readable or b"\x00\x53\x72" in data  # (an annotations section the bytes happen to hold is replaced)
        if readable:
            assert decode_message(out, {"message_annotations"}).message_annotations[symbol("k")] == "v"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["x-opt-a", "x-opt-b", "x-opt-broker-filter-offered"]),
                       st.one_of(st.integers(-5, 5), st.text(max_size=5)), max_size=3),
       st.booleans())
def test_a_cached_merge_of_annotations_is_the_merge_itself(annotations, header):
    """`set_message_annotation` with a caller's cache of merged sections gives the same bytes as
    without one, the first time and from the cache; `annotations_section` is the bytes of the
    annotations it merged with."""
    from broker_filter.amqp.sections import MESSAGE_ANNOTATIONS, annotations_section, encode_section

    raw = Message(body=b"x" * 10, durable=header, properties={"n": 1},
                  annotations={symbol(k): v for k, v in annotations.items()} or None).encode()
    key, value = symbol("x-opt-broker-filter-offered"), {"f": ["d1#0", 1000]}
    encoded = encode_section(MESSAGE_ANNOTATIONS, {key: value})
    merged: dict = {}
    plain = set_message_annotation(raw, key, value)
    assert set_message_annotation(raw, key, value, encoded, merged) == plain
    assert set_message_annotation(raw, key, value, encoded, merged) == plain  # from the cache
    section = annotations_section(raw)
    if annotations:
        assert decode(section)[0] == {symbol(k): v for k, v in annotations.items()}
    else:
        assert section is None and merged == {}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 80), st.binary(max_size=20))
def test_annotations_section_reads_what_scan_reads(cut, tail):
    from broker_filter.amqp import scan
    from broker_filter.amqp.sections import annotations_section

    raw = Message(body=b"y" * 8, annotations={symbol("x-opt-a"): 1}).encode()
    for data in (raw[:cut], raw[:cut] + tail, raw + tail):
        try:
            scan(data)
        except CodecError:
            with pytest.raises(CodecError):
                annotations_section(data)
            continue
        annotations_section(data)
