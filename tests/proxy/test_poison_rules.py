"""The rule of broker_filter/proxy/admission.py, shape by shape, against the brokers themselves: each
message is sent straight to RabbitMQ 3.10 and 4.0 (no daemon).  On 3.10 the daemon refuses exactly the
shapes on which RabbitMQ drops the connection; 4.0 drops it on none (it ends only the sender's session
on some, and the daemon's session per link keeps that to the sender's link), so nothing is refused in
front of it."""

from __future__ import annotations

import uuid

import pytest
from proton.handlers import MessagingHandler
from proton.reactor import Container

from broker_filter.amqp import types as t
from broker_filter.amqp.encoding import encode
from broker_filter.proxy.admission import refusal
from broker_filter.proxy.traits import traits_of

pytestmark = pytest.mark.rabbitmq
S = t.symbol


def sec(code: int, value, raw: bytes | None = None) -> bytes:
    return b"\x00\x53" + bytes((code,)) + (raw if raw is not None else encode(value))


def body(value) -> bytes:
    return sec(0x77, value)


def arr(ctor: int, count: int, payload: bytes, descriptor: bytes = b"") -> bytes:
    """An amqp-value body holding an array8 of `count` elements of type `ctor`, written byte by byte."""
    inner = bytes([count]) + descriptor + bytes([ctor]) + payload
    return sec(0x77, None, bytes([0xE0, len(inner)]) + inner)


def array32_in_array(inner: bytes) -> bytes:
    """An amqp-value body holding an array of one array (`inner`: its count and elements)."""
    return sec(0x77, None, bytes([0xE0, 2 + 4 + len(inner), 1, 0xF0]) + len(inner).to_bytes(4, "big") + inner)


X = sec(0x75, b"x")
H, P = sec(0x70, [True]), sec(0x73, ["id"])
A, M = sec(0x74, {"k": "v"}), sec(0x72, {S("x-a"): "v"})
UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")
CASES = {
 "value_string": body("hello"),
 "value_int": body(t.int32(7)),
 "value_list0": body([]),
 "value_list1": body(["a"]),
 "value_list2": body([t.int32(1), t.int32(2)]),
 "value_list3_str": body(["a", "b", "c"]),
 "value_nested_list1": body([[t.int32(1), t.int32(2)]]),
 "value_map": body({"a": t.int32(1), "b": "x"}),
 "value_map_symkey": body({S("content"): "x"}),
 "value_array_float": body(t.Array("float", [t.float32(1.5), t.float32(2.5)])),
 "value_array_double": body(t.Array("double", [1.5, 2.5])),
 "value_array_int": body(t.Array("int", [t.int32(1), t.int32(2)])),
 "value_array_long": body(t.Array("long", [t.long(1), t.long(2)])),
 "value_array_string": body(t.Array("string", ["a", "b"])),
 "value_array_symbol": body(t.Array("symbol", [S("a"), S("b")])),
 "value_array_binary": body(t.Array("binary", [b"a", b"b"])),
 "value_array_bool": body(t.Array("boolean", [True, False])),
 "value_array_ubyte": body(t.Array("ubyte", [t.ubyte(1)])),
 "value_array_uuid": body(t.Array("uuid", [UUID])),
 "value_array_timestamp": body(t.Array("timestamp", [t.timestamp(1)])),
 "value_array_char": body(t.Array("char", [t.char("a")])),
 "value_array_int_empty": body(t.Array("int", [])),
 "value_array_float_empty": body(t.Array("float", [])),
 "value_array_list": body(t.Array("list", [[t.int32(1)], [t.int32(2)]])),
 "value_array_map": body(t.Array("map", [{"a": t.int32(1)}])),
 "value_array_described": sec(0x77, None, bytes([0xe0, 10, 1, 0x00, 0xa3, 1, 0x78, 0x71, 0, 0, 0, 1])),
 "value_described_sym_str": body(t.Described(S("x:y"), "v")),
 "value_described_ulong_list": body(t.Described(t.ulong(0x1234), [t.int32(1), t.int32(2)])),
 "value_described_ulong_map": body(t.Described(t.ulong(0x1234), {"a": t.int32(1)})),
 "value_described_known_list": body(t.Described(t.ulong(0x70), [True])),
 "value_list1_described": body([t.Described(S("x"), t.int32(1))]),
 "value_list1_array_float": body([t.Array("float", [t.float32(1.0)])]),
 "value_decimal": body(t.decimal64("1.5")),
 "value_uuid": body(UUID),
 "value_char": body(t.char("a")),
 "value_binary": body(b"xyz"),
 "value_null": body(None),
 "sequence_ints": sec(0x76, [t.int32(1), t.int32(2)]),
 "sequence_described": sec(0x76, [t.Described(S("x"), t.int32(1))]),
 "sequence_array_float": sec(0x76, [t.Array("float", [t.float32(1.0)])]),
 "sequence_two_sections": sec(0x76, ["a"]) + sec(0x76, ["b"]),
 "data_two_sections": sec(0x75, b"a") + sec(0x75, b"b"),
 "data_then_value": sec(0x75, b"a") + body("x"),
 "appprops_list": sec(0x74, {"k": [t.int32(1), t.int32(2)]}) + sec(0x75, b"x"),
 "appprops_array_float": sec(0x74, {"k": t.Array("float", [t.float32(1.0)])}) + sec(0x75, b"x"),
 "appprops_array_int": sec(0x74, {"k": t.Array("int", [t.int32(1)])}) + sec(0x75, b"x"),
 "appprops_described": sec(0x74, {"k": t.Described(S("x"), t.int32(1))}) + sec(0x75, b"x"),
 "appprops_symbol_key": sec(0x74, {S("k"): "v"}) + sec(0x75, b"x"),
 "appprops_int_key": sec(0x74, {t.int32(1): "v"}) + sec(0x75, b"x"),
 "appprops_map_value": sec(0x74, {"k": {"a": "b"}}) + sec(0x75, b"x"),
 "appprops_uuid": sec(0x74, {"k": UUID}) + sec(0x75, b"x"),
 "appprops_decimal": sec(0x74, {"k": t.decimal64("1.5")}) + sec(0x75, b"x"),
 "appprops_char": sec(0x74, {"k": t.char("a")}) + sec(0x75, b"x"),
 "appprops_float": sec(0x74, {"k": t.float32(1.5)}) + sec(0x75, b"x"),
 "annot_ulong_key": sec(0x72, {t.ulong(7): "v"}) + sec(0x75, b"x"),
 "annot_string_key": sec(0x72, {"k": "v"}) + sec(0x75, b"x"),
 "annot_int_key": sec(0x72, {t.int32(1): "v"}) + sec(0x75, b"x"),
 "annot_array_float": sec(0x72, {S("x-k"): t.Array("float", [t.float32(1.0)])}) + sec(0x75, b"x"),
 "annot_list": sec(0x72, {S("x-k"): [t.int32(1), t.int32(2)]}) + sec(0x75, b"x"),
 "annot_described": sec(0x72, {S("x-k"): t.Described(S("x"), t.int32(1))}) + sec(0x75, b"x"),
 "delivery_annot": sec(0x71, {S("x-k"): "v"}) + sec(0x75, b"x"),
 "footer": sec(0x75, b"x") + sec(0x78, {S("x-k"): "v"}),
 "footer_described": sec(0x75, b"x") + sec(0x78, {S("x-k"): t.Described(S("x"), t.int32(1))}),
 "header_odd": sec(0x70, [True, t.ubyte(200), t.uint(1000), False, t.uint(3)]) + sec(0x75, b"x"),
 "header_long_list": sec(0x70, [True, t.ubyte(4), None, None, None, "extra"]) + sec(0x75, b"x"),
 "header_described": sec(0x70, [t.Described(S("x"), True)]) + X,
 "props_described": sec(0x73, [t.Described(S("x"), "id")]) + X,
 "annot_symbol_key_not_x": sec(0x72, {S("k"): "v"}) + X,
 "annot_key_described": sec(0x72, {t.Described(S("x"), S("k")): "v"}) + X,
 "props_uuid_id": sec(0x73, [UUID]) + sec(0x75, b"x"),
 "props_binary_id": sec(0x73, [b"\x01\x02"]) + sec(0x75, b"x"),
 "props_ulong_id": sec(0x73, [t.ulong(5)]) + sec(0x75, b"x"),
 "props_long_list": sec(0x73, [None] * 13 + ["extra"]) + sec(0x75, b"x"),
 "symbolic_descriptor": b"\x00" + encode(S("amqp:amqp-value:*")) + encode("x"),
 "no_body": sec(0x73, [None, None, "/queue/x"]),
 "order_props_header": P + H + X,
 "order_app_props": A + P + X,
 "order_ma_after_props": P + M + X,
 "two_ma": M + M + X,
 "two_props": P + P + X,
 "footer_then_data": sec(0x78, {S("x"): "v"}) + X,
 "data_footer_data": X + sec(0x78, {S("x"): "v"}) + X,
 "value_then_data": body("x") + X,
 "array_smallulong": arr(0x53, 2, b"\x01\x02"),
 "array_str8": arr(0xa1, 1, b"\x01a"),
 "array_sym8": arr(0xa3, 1, b"\x01a"),
 "array_true": arr(0x41, 2, b""),
 "array_described_float": arr(0x72, 1, b"\x3f\x80\x00\x00", b"\x00\xa3\x01x"),
 "array_of_array_float": array32_in_array(bytes([0, 0, 0, 1, 0x72]) + b"\x3f\x80\x00\x00"),
 "array_of_array_int": array32_in_array(bytes([0, 0, 0, 1, 0x71]) + b"\x00\x00\x00\x01"),
 "list_array_in_map_value": sec(0x77, {"k": t.Array("float", [t.float32(1.0)])}),
 "value_list2_in_described": sec(0x77, t.Described(S("x"), [t.int32(1), t.int32(2)])),
 "annot_symbol_described_ulong": sec(0x72, {S("x-k"): t.Described(t.ulong(0x70), [True])}) + X,
 "array_ctor_b3": arr(0xb3, 1, b"\0\0\0\1a"),
 "array_ctor_a0": arr(0xa0, 1, b"\1a"),
 "array_ctor_52": arr(0x52, 1, b"\1"),
 "array_ctor_54": arr(0x54, 1, b"\1"),
 "array_ctor_55": arr(0x55, 1, b"\1"),
 "array_ctor_43": arr(0x43, 2, b""),
 "array_ctor_44": arr(0x44, 2, b""),
 "array_ctor_42": arr(0x42, 2, b""),
 "array_ctor_45": arr(0x45, 2, b""),
 "array_ctor_e0": arr(0xe0, 1, bytes([2, 1, 0x50, 7])),
 "array_ctor_c0": arr(0xc0, 1, bytes([1, 0])),
 "array_ctor_d0": arr(0xd0, 1, bytes([0, 0, 0, 4, 0, 0, 0, 0])),
 "array_ctor_d1": arr(0xd1, 1, bytes([0, 0, 0, 4, 0, 0, 0, 0])),
 "array_ctor_74": arr(0x74, 1, b"\0" * 4),
 "array_ctor_84": arr(0x84, 1, b"\0" * 8),
 "array_ctor_94": arr(0x94, 1, b"\0" * 16),
 "array_ctor_40": arr(0x40, 2, b""),
 "array_ctor_56": arr(0x56, 1, b"\1"),
 "array_ctor_b1": arr(0xb1, 1, b"\0\0\0\1a"),
}


class _Probes(MessagingHandler):
    """Sends each message's bytes on a connection of its own, all at once; `results[name]` is what the
    broker did with it."""

    def __init__(self, url: str, address: str, cases: dict[str, bytes]):
        super().__init__(auto_accept=False, auto_settle=True)
        self.url, self.address, self.cases = url, address, cases
        self.results: dict[str, str] = {}
        self.names: dict = {}  # connection -> case name

    def on_start(self, event):
        self.timer = event.container.schedule(60.0, self)
        for name in self.cases:
            conn = event.container.connect(self.url, reconnect=False)
            self.names[conn] = name
            event.container.create_sender(conn, self.address)

    def on_timer_task(self, event):
        for conn in self.names:
            self._done(conn, "timeout")

    def on_sendable(self, event):
        name = self.names[event.connection]
        if getattr(event.sender, "bf_sent", False) or name in self.results:
            return
        event.sender.bf_sent = True
        event.sender.delivery(b"1")
        event.sender.stream(self.cases[name])
        event.sender.advance()

    def _done(self, conn, result: str) -> None:
        name = self.names[conn]
        if name not in self.results:
            self.results[name] = result
            conn.close()
        if len(self.results) == len(self.cases):
            self.timer.cancel()

    def on_accepted(self, event):
        self._done(event.connection, "accepted")

    def on_rejected(self, event):
        self._done(event.connection, "rejected")

    def on_released(self, event):
        self._done(event.connection, "released")

    def on_session_remote_close(self, event):
        self._done(event.connection, "session-ended")

    def on_link_remote_close(self, event):
        self._done(event.connection, "link-detached")

    def on_connection_remote_close(self, event):
        self._done(event.connection, "connection-closed")

    def on_transport_error(self, event):
        self._done(event.connection, "connection-dropped")


def probe_all(url: str, cases: dict[str, bytes], address: str) -> dict[str, str]:
    handler = _Probes(url, address, cases)
    Container(handler).run()
    return handler.results


@pytest.fixture(scope="module")
def broker_traits(rabbitmq_broker):
    from tests.support.rabbitmq_nodes import amqp10_ready

    props = amqp10_ready(30, rabbitmq_broker)
    return traits_of(props.get("product"), props.get("version"))


# Refused though RabbitMQ 3.10 takes it: a described value whose descriptor is one of the protocol's own
# types, which its decode reads as that type (the rule refuses every described value where decode
# looks; no client has reason to send these).
CONSERVATIVE = {"annot_symbol_described_ulong"}


def test_the_rule_is_what_the_broker_does(rabbitmq_broker, broker_traits):
    """Every shape: refused by the daemon exactly when the broker drops the connection on it."""
    address = f"/queue/poison-rules-{uuid.uuid4().hex[:8]}"
    results = probe_all(rabbitmq_broker.url, CASES, address)
    rabbitmq_broker.ctl("delete_queue", address.rsplit("/", 1)[1])
    assert set(results) == set(CASES)
    assert [name for name, r in results.items() if r == "timeout"] == []
    dropped = {name for name, r in results.items() if r in ("connection-dropped", "connection-closed")}
    refused = {name for name, data in CASES.items() if refusal(broker_traits, data) is not None}
    if rabbitmq_broker.major >= 4:
        assert dropped == set()  # RabbitMQ 4 never drops the connection for a message
        assert refused == set()
    else:
        assert refused - dropped == CONSERVATIVE, {n: results[n] for n in refused - dropped}
        assert dropped - refused == set(), {n: results[n] for n in dropped - refused}
        assert {"value_list2", "value_array_float", "appprops_array_float", "delivery_annot"} <= dropped
        assert len(dropped) >= 40
