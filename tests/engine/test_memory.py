"""The engine driven in memory: a client and a server connection pumped together, no sockets."""

from __future__ import annotations

import pytest

from broker_filter.amqp import types as t
from broker_filter.amqp import encode
from broker_filter.amqp.sections import encode_section
from broker_filter.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, Condition, Engine, Terminus
from broker_filter.engine.memory import pump

from .apps import EchoServer, Recorder

SELECTOR = t.ulong(0x0000468C00000004)


def body(text: str) -> bytes:
    return encode_section(0x77, text)


def connect(server_handler=None, client_handler=None, **server_options):
    engine = Engine()
    server_handler = server_handler or EchoServer()
    client_handler = client_handler or Recorder()
    server = engine.connection(server_handler, server=True, **server_options)
    client = engine.connection(client_handler, server=False)
    client.open(hostname="localhost")
    session = client.session()
    session.open()
    pump(engine, client, server)
    return engine, client, server, session, client_handler, server_handler


def test_open_attach_transfer_settle():
    engine, client, server, session, rec, echo = connect()
    assert rec.connection_open and client.remote_container == engine.container_id
    sender = session.sender("s", target=Terminus(address="q"))
    sender.open()
    receiver = session.receiver("r", source=Terminus(address="q"))
    receiver.open()
    pump(engine, client, server)
    assert sender.credit == 100
    deliveries = [sender.send(body(f"m{i}")) for i in range(5)]
    receiver.flow(3)
    pump(engine, client, server)
    assert rec.messages == [body(f"m{i}") for i in range(3)]
    assert [state for state, _ in rec.updates] == [ACCEPTED] * 5
    assert all(d.ptr is None for d in deliveries)  # settled on the remote's settlement
    receiver.flow(10)
    pump(engine, client, server)
    assert len(rec.messages) == 5
    assert echo.outcomes.count((ACCEPTED, None)) == 5


def test_credit_is_respected_and_drain_returns_it():
    engine, client, server, session, rec, echo = connect()
    sender = session.sender("s", target=Terminus(address="q"))
    sender.open()
    receiver = session.receiver("r", source=Terminus(address="q"))
    receiver.open()
    pump(engine, client, server)
    for i in range(4):
        sender.send(body(str(i)))
    pump(engine, client, server)
    assert rec.messages == []  # no credit granted yet
    receiver.flow(2)
    pump(engine, client, server)
    assert len(rec.messages) == 2 and receiver.credit == 0
    receiver.drain(5)
    pump(engine, client, server)
    assert len(rec.messages) == 4 and receiver.credit == 0  # two delivered, the rest drained


def test_dispositions_reach_the_sender_with_modified_flags_and_rejected_conditions():
    engine, client, server, session, rec, echo = connect(client_handler=Recorder(accept=False))
    sender = session.sender("s", target=Terminus(address="q"))
    receiver = session.receiver("r", source=Terminus(address="q"))
    sender.open()
    receiver.open()
    pump(engine, client, server)
    for i in range(3):
        sender.send(body(str(i)))
    receiver.flow(3)
    pump(engine, client, server)
    first, second, third = rec.deliveries
    first.reject(Condition("amqp:invalid-field", "no thanks"))
    second.modify(failed=True, undeliverable=True, annotations={t.symbol("x-why"): "test"})
    third.release()
    pump(engine, client, server)
    states = [state for state, _ in echo.outcomes[-3:]]
    assert states == [REJECTED, MODIFIED, RELEASED]
    assert echo.outcomes[-3][1] == Condition("amqp:invalid-field", "no thanks")


def test_modified_flags_are_readable_on_the_sending_side():
    seen = []

    class Watch(EchoServer):
        def on_delivery_update(self, delivery):
            seen.append((delivery.remote_state, delivery.remote_failed, delivery.remote_undeliverable,
                         delivery.remote_annotations))
            delivery.settle()

    engine, client, server, session, rec, echo = connect(Watch(), Recorder(accept=False))
    sender = session.sender("s", target=Terminus(address="q"))
    receiver = session.receiver("r", source=Terminus(address="q"))
    sender.open(), receiver.open()
    pump(engine, client, server)
    sender.send(body("x"))
    receiver.flow(1)
    pump(engine, client, server)
    rec.deliveries[0].modify(failed=True, undeliverable=False, annotations={t.symbol("x-n"): 1})
    pump(engine, client, server)
    assert seen == [(MODIFIED, True, False, {t.symbol("x-n"): 1})]


def test_termini_carry_filter_capabilities_distribution_durability_expiry():
    engine, client, server, session, rec, echo = connect()
    source = Terminus(
        address="/topic/a", durability=2, expiry_policy="never", timeout=30, distribution_mode="copy",
        filter={t.symbol("jms-selector"): t.Described(SELECTOR, "half = 1")},
        capabilities=("shared", "global"),
    )
    receiver = session.receiver("r", source=source)
    receiver.open()
    pump(engine, client, server)
    seen = echo.sources[0]
    assert seen.address == "/topic/a" and seen.durability == 2 and seen.expiry_policy == "never"
    assert seen.timeout == 30 and seen.distribution_mode == "copy"
    assert seen.filter == {t.symbol("jms-selector"): t.Described(SELECTOR, "half = 1")}
    assert seen.capabilities == ("shared", "global") and seen.filter_error is None
    assert receiver.remote_source.filter == seen.filter  # echoed back in the attach


def test_refused_link_reports_the_condition():
    engine, client, server, session, rec, echo = connect(EchoServer(refuse=("nope",)))
    receiver = session.receiver("r", source=Terminus(address="nope"))
    receiver.open()
    pump(engine, client, server)
    assert rec.closed == [("r", Condition("amqp:not-found", "no such address 'nope'"))]
    assert receiver.ptr is None and not engine.links.get(receiver)  # freed once closed both ways


def _frame(performative) -> bytes:
    payload = encode(performative)
    return (8 + len(payload)).to_bytes(4, "big") + bytes((2, 0, 0, 0)) + payload


def _raw_attach(filter_count: int | None) -> bytes:
    D, u = t.Described, t.ulong
    selector = {t.symbol("jms-selector"): D(SELECTOR, "half = 1")}
    source = D(u(0x28), ["q", t.uint(0), t.symbol("session-end"), t.uint(0), False, None, None, selector])
    attach = encode(D(u(0x12), ["l", t.uint(0), True, None, None, source, D(u(0x29), ["t"])]))
    if filter_count is not None:
        encoded = encode(selector)
        at = attach.index(encoded)
        attach = attach[: at + 2] + bytes((filter_count,)) + attach[at + 3 :]  # map8: code, size, count
    return (b"AMQP\x00\x01\x00\x00" + _frame(D(u(0x10), ["c"]))
            + _frame(D(u(0x11), [None, t.uint(0), t.uint(100), t.uint(100)]))
            + (8 + len(attach)).to_bytes(4, "big") + bytes((2, 0, 0, 0)) + attach)


@pytest.mark.parametrize("count", [1, 3, 4])
def test_a_garbled_filter_map_is_detected_not_read_as_no_filter(count):
    engine = Engine()
    echo = EchoServer()
    server = engine.connection(echo, server=True)
    data = _raw_attach(count)
    assert engine.push(server, data) == len(data)
    engine.process()
    (source,) = echo.sources
    assert source.filter is None and source.filter_error, source


def test_a_well_formed_raw_filter_is_read():
    engine = Engine()
    echo = EchoServer()
    server = engine.connection(echo, server=True)
    engine.push(server, _raw_attach(None))
    engine.process()
    assert echo.sources[0].filter == {t.symbol("jms-selector"): t.Described(SELECTOR, "half = 1")}


def test_heartbeats_keep_an_idle_connection_and_silence_closes_it():
    now = [1000.0]
    engine = Engine(clock=lambda: now[0])
    rec, echo = Recorder(), EchoServer()
    server = engine.connection(echo, server=True, idle_timeout=2.0)
    client = engine.connection(rec, server=False, idle_timeout=2.0)
    client.open()
    pump(engine, client, server)
    assert client.remote_idle_timeout == 1.0  # proton advertises half its own time-out
    for _ in range(10):  # 10 s of silence, but both sides tick: empty frames keep it open
        now[0] += 0.5
        engine.run_timers()
        pump(engine, client, server)
    assert client.ptr is not None and server.ptr is not None
    for _ in range(10):  # the client stops ticking and sending: the server times out
        now[0] += 0.5
        if client._tick_timer is not None:
            client._tick_timer.cancel()
        engine.run_timers()
        engine.process()
        out = engine.take_output(server)
        if out is not None and len(out):
            engine.push(client, bytes(out))
        engine.process()
    assert echo.disconnected and echo.disconnected[0].name == "amqp:resource-limit-exceeded"


def test_closing_frees_every_object():
    engine, client, server, session, rec, echo = connect()
    for i in range(20):
        link = session.receiver(f"r{i}", source=Terminus(address="q"))
        link.open()
    pump(engine, client, server)
    assert len(engine.links) == 40
    client.close()
    pump(engine, client, server)
    engine.abort(client)
    engine.abort(server)
    engine.process()
    assert not engine.links and not engine.sessions and not engine.connections
    assert rec.disconnected and echo.disconnected


def test_closing_releases_protons_connection_objects():
    """proton-c frees a connection once nothing refers to it: the engine must give back the reference
    `pn_connection()` handed it, not only the endpoint's (a connection kept alive keeps proton's copy of
    its sessions and links).  The test holds one reference of its own to read the count."""
    import ctypes

    import cproton_ffi

    proton_c = ctypes.CDLL(cproton_ffi.__file__)
    proton_c.pn_refcount.argtypes = proton_c.pn_incref.argtypes = proton_c.pn_decref.argtypes = [ctypes.c_void_p]
    proton_c.pn_refcount.restype = ctypes.c_int
    from broker_filter.engine._cproton import ffi

    engine, client, server, session, rec, echo = connect()
    session.receiver("r", source=Terminus(address="q")).open()
    pump(engine, client, server)
    pointers = [int(ffi.cast("uintptr_t", c.ptr)) for c in (client, server)]
    for pointer in pointers:
        proton_c.pn_incref(pointer)
    try:
        client.close()
        pump(engine, client, server)
        engine.abort(client)
        engine.abort(server)
        engine.process()
        engine.process()  # the collector lets go of the last event it handed out
        assert [proton_c.pn_refcount(p) for p in pointers] == [1, 1]  # the test's own only
    finally:
        for pointer in pointers:
            proton_c.pn_decref(pointer)


def _rss_kib() -> int:
    from pathlib import Path

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_memory_comes_back_after_rounds_of_a_thousand_links():
    import gc

    engine, client, server, session, rec, echo = connect()
    filter_map = {t.symbol("jms-selector"): t.Described(SELECTOR, "half = 1")}

    def one_round() -> None:
        links = []
        for i in range(1000):
            link = session.receiver(f"r{i}", source=Terminus(address="/topic/t", filter=filter_map))
            link.open()
            link.flow(10)
            links.append(link)
        pump(engine, client, server)
        assert len(engine.links) == 2000
        for link in links:
            link.close()
        pump(engine, client, server)
        echo.opened_links.clear()
        echo.senders.clear()
        echo.sources.clear()
        assert not engine.links

    one_round()  # the first round warms proton's and Python's allocators
    gc.collect()
    before = _rss_kib()
    sizes = []
    for _ in range(3):
        one_round()
        gc.collect()
        sizes.append(_rss_kib())
    assert max(sizes) <= before * 1.10, (before, sizes)


def test_a_failing_handler_closes_its_link_with_internal_error_and_nothing_else(caplog):
    class Broken(Recorder):
        def on_message(self, delivery, data):
            raise RuntimeError("a bug in the handler")

    engine, client, server, session, rec, echo = connect(client_handler=Broken())
    closed = []
    echo.on_link_close = lambda link: (closed.append((link.name, link.remote_condition)),
                                       EchoServer.on_link_close(echo, link))
    sender = session.sender("s", target=Terminus(address="q"))
    broken = session.receiver("broken", source=Terminus(address="q"))
    fine = session.receiver("fine", source=Terminus(address="other"))
    for link in (sender, broken, fine):
        link.open()
    pump(engine, client, server)
    sender.send(body("x"))
    broken.flow(1)
    with caplog.at_level("ERROR", logger="broker_filter.engine"):
        pump(engine, client, server)
    assert closed == [("broken", Condition("amqp:internal-error", "handling PN_DELIVERY failed"))]
    assert "a bug in the handler" in caplog.text
    assert fine.ptr is not None and client.ptr is not None and sender.credit > 0


def test_a_refused_attach_reads_as_a_null_source():
    """A sender that refuses an attach answers with a null source (then detaches): the client side
    reads it as `Terminus.null`, not as a source without an address; an ordinary answer is not null."""

    class Refusing(EchoServer):
        def on_link_open(self, link):
            if link.remote_source.address == "nope":
                link.set_source(Terminus(null=True))
                link.open()
                link.close(Condition("amqp:not-found", "no"))
                return
            super().on_link_open(link)

    engine, client, server, session, rec, echo = connect(Refusing())
    session.receiver("r", source=Terminus(address="nope")).open()
    session.receiver("ok", source=Terminus(address="q")).open()
    pump(engine, client, server)
    refused, answered = rec.sources
    assert refused.null and refused.address is None
    assert not answered.null and answered.address == "q"


def test_copy_remote_attaches_what_the_peer_attached():
    """`copy_remote`: a link attached with another link's remote termini, settle modes and link
    properties (how a relay passes a client's attach on)."""
    engine, client, server, session, rec, echo = connect()
    source = Terminus(address="/management", capabilities=("queue",), distribution_mode="copy")
    original = session.sender("pair", target=Terminus(address="/management"), source=source, settled=True,
                              properties={t.symbol("paired"): True})
    original.open()
    pump(engine, client, server)
    incoming = echo.opened_links[-1]  # the server's end of `original`
    copy = session.receiver("copy")
    copy.copy_remote(incoming.ptr)
    copy.open()
    pump(engine, client, server)
    theirs = echo.opened_links[-1]
    assert theirs.remote_target.address == "/management"
    assert theirs.remote_source.capabilities == ("queue",) and theirs.remote_source.distribution_mode == "copy"
    assert theirs.remote_settled_mode
    assert theirs.remote_properties == {t.symbol("paired"): True}


def test_trace_hands_over_each_frame_until_stopped():
    engine, client, server, session, rec, echo = connect()
    lines: list[str] = []
    client.trace(lines.append)
    receiver = session.receiver("traced", source=Terminus(address="q"))
    receiver.open()
    pump(engine, client, server)
    assert any("<- @attach(18)" in line and 'name="traced"' in line for line in lines), lines
    assert any("-> @attach(18)" in line for line in lines)
    client.trace(None)
    count = len(lines)
    receiver.flow(5)
    pump(engine, client, server)
    assert len(lines) == count  # stopped


def test_drain_flag_cleared_and_unsettled_counted():
    engine, client, server, session, rec, echo = connect(client_handler=Recorder(accept=False))
    sender = session.sender("s", target=Terminus(address="q"))
    sender.open()
    receiver = session.receiver("r", source=Terminus(address="q"))
    receiver.open()
    pump(engine, client, server)
    for i in range(3):
        sender.send(body(str(i)))
    pump(engine, client, server)
    receiver.drain(2)
    pump(engine, client, server)
    assert len(rec.deliveries) == 2 and receiver.unsettled_count == 2 and receiver.drain_mode
    rec.deliveries[0].accept()
    assert receiver.unsettled_count == 1
    receiver.set_drain(False)
    assert not receiver.drain_mode


def test_a_session_never_opened_is_freed_with_its_links():
    engine, client, server, session, rec, echo = connect()
    idle = client.session()
    link = idle.receiver("never", source=Terminus(address="q"))
    idle.free()
    assert idle.ptr is None and link.ptr is None and idle not in client.sessions
    pump(engine, client, server)  # nothing goes out for it, and the connection carries on
    live = session.receiver("live", source=Terminus(address="q"))
    live.open()
    pump(engine, client, server)
    assert live.remote_source.address == "q"
