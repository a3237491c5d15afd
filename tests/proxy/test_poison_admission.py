"""broker_filter/proxy/admission.py without a broker: its fast walk (every message) agrees with its careful
one on generated messages, and the refusal's wording.  What RabbitMQ itself does with each shape is
tests/proxy/test_poison_rules.py's."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_filter.amqp import types as t
from broker_filter.amqp.encoding import encode
from broker_filter.amqp.sections import MESSAGE_ANNOTATIONS, encode_section, set_message_annotation
from broker_filter.filters import ORIGIN_ANNOTATION
from broker_filter.proxy import admission
from broker_filter.proxy.embedded import EmbeddedUpstream
from broker_filter.proxy.traits import traits_of

R3, R4 = traits_of("RabbitMQ", "3.10.8"), traits_of("RabbitMQ", "4.0.5")
ORIGIN = encode_section(MESSAGE_ANNOTATIONS, {ORIGIN_ANNOTATION: "c1"})


def sec(code: int, value) -> bytes:
    return b"\x00\x53" + bytes((code,)) + encode(value)


_scalars = st.one_of(
    st.none(), st.booleans(), st.text(max_size=8), st.binary(max_size=8),
    st.integers(-2**31, 2**31 - 1).map(t.int32), st.integers(0, 2**64 - 1).map(t.ulong),
    st.integers(-2**63, 2**63 - 1).map(t.long), st.integers(0, 255).map(t.ubyte),
    st.integers(0, 2**40).map(t.timestamp), st.floats(width=32, allow_nan=False).map(t.float32),
    st.floats(allow_nan=False), st.uuids(), st.text(alphabet="abc-x", min_size=1, max_size=5).map(t.symbol),
)
_arrays = st.one_of(
    st.lists(st.integers(-2**31, 2**31 - 1).map(t.int32), max_size=3).map(lambda v: t.Array("int", v)),
    st.lists(st.floats(width=32, allow_nan=False).map(t.float32), max_size=3).map(lambda v: t.Array("float", v)),
    st.lists(st.text(max_size=4), max_size=3).map(lambda v: t.Array("string", v)),
    st.lists(st.uuids(), max_size=2).map(lambda v: t.Array("uuid", v)),
    st.lists(st.integers(0, 2**40).map(t.timestamp), max_size=2).map(lambda v: t.Array("timestamp", v)),
)
_values = st.recursive(
    st.one_of(_scalars, _arrays),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.builds(t.Described, st.one_of(st.text(alphabet="xyz:", min_size=1, max_size=4).map(t.symbol),
                                         st.integers(0, 2**32).map(t.ulong)), inner),
    ),
    max_leaves=6,
)
_sections = st.one_of(
    st.lists(_values, max_size=7).map(lambda v: sec(0x70, v)),
    st.dictionaries(st.text(alphabet="x-opt", min_size=1, max_size=6).map(t.symbol), _values, max_size=3)
    .map(lambda v: sec(0x72, v)),
    st.lists(_values, max_size=15).map(lambda v: sec(0x73, v)),
    st.dictionaries(st.text(max_size=6), _values, max_size=4).map(lambda v: sec(0x74, v)),
    st.binary(max_size=40).map(lambda v: sec(0x75, v)),
    st.lists(_values, max_size=3).map(lambda v: sec(0x76, v)),
    _values.map(lambda v: sec(0x77, v)),
    st.dictionaries(st.text(alphabet="x-f", min_size=1, max_size=4).map(t.symbol), _values, max_size=2)
    .map(lambda v: sec(0x78, v)),
)
# Mostly in the order RabbitMQ 3.x takes (so the fast walk gets past the order rule), sometimes not.
_ordered = st.lists(_sections, min_size=1, max_size=5).map(lambda ss: sorted(ss, key=lambda b: b[2]))
_messages = st.one_of(_ordered, _ordered, _sections.map(lambda s: [s]),
                      st.one_of(_arrays, _values).map(lambda v: [sec(0x77, v)]),  # top-level arrays, often
                      st.lists(_sections, min_size=1, max_size=5))


@settings(max_examples=500, deadline=None)
@given(_messages)
def test_the_fast_walk_agrees_with_the_careful_one(sections):
    raw = b"".join(sections)
    data = set_message_annotation(raw, ORIGIN_ANNOTATION, "c1", ORIGIN)  # as the publish path has it
    assert (admission._rabbitmq3(data) is None) == (admission._careful(data) is None)
    assert admission.refusal(R4, data) is None  # RabbitMQ 4 drops no connection for a message


def test_usual_messages_pass():
    props = sec(0x73, [uuid.uuid4(), None, "/queue/orders", None, None, None, t.symbol("application/json"), None,
                       t.timestamp(1_700_000_000_000)])
    apps = sec(0x74, {"n": t.int32(7), "price": 12.5, "tags": ["a", t.int32(0)], "ints": t.Array("int", [t.int32(0)])})
    for raw in (props + apps + sec(0x75, bytes(range(256)) * 4), sec(0x70, [True]) + sec(0x77, "text"),
                sec(0x77, {"content": "x", "k": t.int32(0)}), sec(0x75, b"a") + sec(0x75, b"b")):
        data = set_message_annotation(raw, ORIGIN_ANNOTATION, "c1", ORIGIN)
        assert admission.refusal(R3, data) is None


class _Upstream:
    traits, product, version, name = R3, "RabbitMQ", "3.10.8", "amqp://guest:***@127.0.0.1:5672"


def test_the_refusal_names_what_and_the_upstream():
    data = set_message_annotation(sec(0x77, t.Array("float", [t.float32(1.5)])), ORIGIN_ANNOTATION, "c1", ORIGIN)
    condition, description = admission.refused(_Upstream(), data)
    assert condition == "amqp:not-implemented"
    assert description == ("upstream amqp://guest:***@127.0.0.1:5672 (RabbitMQ 3.10.8) cannot take an array of "
                           "float elements: it would close the connection every client of this daemon shares; "
                           "the message was not forwarded")
    data = sec(0x73, ["id"]) + sec(0x74, {"k": "v"}) + sec(0x73, ["again"])
    assert admission.refused(_Upstream(), data)[1].startswith(
        "upstream amqp://guest:***@127.0.0.1:5672 (RabbitMQ 3.10.8) cannot take message sections out of order "
        "(properties after application-properties)")


def test_upstreams_without_the_trait_take_everything():
    data = sec(0x77, t.Array("float", [t.float32(1.5)]))
    assert admission.refusal(R4, data) is None
    assert admission.refused(EmbeddedUpstream(), data) is None  # the embedded broker: not the trait
