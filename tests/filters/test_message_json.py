"""The JSON message form: every AMQP type round-trips with its type; errors name the path."""

import json
import math
import re
import uuid
from pathlib import Path

import pytest

from broker_filter.amqp import types as t
from broker_filter.amqp.message import Header, Message, MessageFormatError, Properties

TYPED = [
    ({"type": "ubyte", "value": 255}, t.ubyte),
    ({"type": "ushort", "value": 65535}, t.ushort),
    ({"type": "uint", "value": 4294967295}, t.uint),
    ({"type": "ulong", "value": 18446744073709551615}, t.ulong),
    ({"type": "byte", "value": -128}, t.byte),
    ({"type": "short", "value": -32768}, t.short),
    ({"type": "int", "value": -2147483648}, t.int32),
    ({"type": "float", "value": 1.5}, t.float32),
    ({"type": "decimal32", "value": "1.25"}, t.decimal32),
    ({"type": "decimal64", "value": "-7.5E+3"}, t.decimal64),
    ({"type": "decimal128", "value": "0.1"}, t.decimal128),
    ({"type": "char", "value": "é"}, t.char),
    ({"type": "timestamp", "value": 1700000000000}, t.timestamp),
    ({"type": "symbol", "value": "sym"}, t.symbol),
    ({"type": "uuid", "value": "0a5b43c7-2b59-4bdf-9b8e-2f7f1f1e8b1d"}, uuid.UUID),
    ({"type": "binary", "value": "cafe01"}, bytes),
    ({"type": "long", "value": 5}, int),
    ({"type": "double", "value": "NaN"}, float),
    ({"type": "array", "element_type": "int", "value": [1, 2]}, t.Array),
    ({"type": "described", "descriptor": {"type": "ulong", "value": 7}, "value": "x"}, t.Described),
    ({"type": "map", "value": [[{"type": "ulong", "value": 1}, "one"]]}, dict),
]


@pytest.mark.parametrize("typed,cls", TYPED, ids=[x[0]["type"] for x in TYPED])
def test_typed_values_keep_their_amqp_type_through_a_round_trip(typed, cls):
    m = Message.from_json({"application_properties": {"v": typed}} if typed["type"] not in ("array", "described", "map")
                          else {"body": typed})
    value = m.application_properties["v"] if m.application_properties else m.body
    assert type(value) is cls
    again = Message.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m
    v2 = again.application_properties["v"] if again.application_properties else again.body
    assert type(v2) is cls


def test_plain_json_maps_naturally():
    m = Message.from_json({"application_properties": {"s": "x", "i": 3, "f": 2.5, "b": True, "n": None}})
    ap = m.application_properties
    assert [type(ap[k]) for k in "sifb"] == [str, int, float, bool] and ap["n"] is None
    assert t.amqp_type(ap["i"]) == "long" and t.amqp_type(ap["f"]) == "double"


def test_fixed_type_fields_are_converted_and_written_plainly():
    m = Message.from_json({"header": {"priority": 7, "durable": True},
                           "properties": {"content_type": "text/plain", "creation_time": 5, "message_id": 42}})
    assert type(m.header.priority) is t.ubyte and type(m.properties.content_type) is t.symbol
    assert type(m.properties.creation_time) is t.timestamp and type(m.properties.message_id) is t.ulong
    out = m.to_json()
    assert out["header"]["priority"] == 7 and out["properties"]["content_type"] == "text/plain"
    assert Message.from_json(out) == m


def test_annotation_keys_are_symbols():
    m = Message.from_json({"message_annotations": {"x-opt-a": 1}})
    (key,) = m.message_annotations
    assert type(key) is t.symbol


def test_equality_is_type_sensitive():
    a = Message(application_properties={"v": 5})
    b = Message(application_properties={"v": t.int32(5)})
    assert a != b


def test_special_floats_round_trip():
    m = Message.from_json({"application_properties": {"x": {"type": "double", "value": "-Infinity"},
                                                      "y": {"type": "float", "value": "NaN"}}})
    assert m.application_properties["x"] == -math.inf and math.isnan(m.application_properties["y"])
    assert Message.from_json(json.loads(json.dumps(m.to_json()))) == m


@pytest.mark.parametrize(
    "obj,path,words",
    [
        ({"header": {"priority": "x"}}, "header.priority", "needs a ubyte, got string"),
        ({"header": {"priority": 300}}, "header.priority", "out of range"),
        ({"properties": {"bogus": 1}}, "properties.bogus", "unknown field"),
        ({"application_properties": {"a": [1]}}, "application_properties.a", "simple types"),
        ({"application_properties": {"a": {"type": "ubyte", "value": -1}}}, "application_properties.a", "out of range"),
        ({"application_properties": {"a": {"type": "nope", "value": 1}}}, "application_properties.a", "unknown AMQP type"),
        ({"application_properties": {"a": {"type": "binary", "value": "zz"}}}, "application_properties.a", ""),
        ({"properties": {"message_id": -1}}, "properties.message_id", "ulong"),
        ({"body": 2**64}, "body", "does not fit a long"),
        ({"sections": {}}, "sections", "unknown section"),
    ],
)
def test_bad_values_name_their_path(obj, path, words):
    with pytest.raises(MessageFormatError) as info:
        Message.from_json(obj)
    assert info.value.path == path and words in str(info.value)


def test_not_an_object():
    with pytest.raises(MessageFormatError, match="JSON object"):
        Message.from_json([1, 2])


def test_the_documented_example_parses_and_round_trips():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "message-json.md").read_text()
    example = json.loads(re.search(r"```json\n(.*?)```", doc, re.S).group(1))
    m = Message.from_json(example)
    assert m.properties.user_id == b"alice" and type(m.application_properties["count"]) is t.int32
    assert Message.from_json(m.to_json()) == m


def test_constructed_messages_equal_parsed_ones():
    built = Message(header=Header(priority=t.ubyte(4)), properties=Properties(subject="a.b"),
                    application_properties={"k": "v"}, body=b"\x01")
    parsed = Message.from_json({"header": {"priority": 4}, "properties": {"subject": "a.b"},
                                "application_properties": {"k": "v"}, "body": {"type": "binary", "value": "01"}})
    assert built == parsed
