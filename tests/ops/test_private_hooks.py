"""The internals of python-qpid-proton and lark the code relies on, one test each.  pyproject.toml pins
both below their next minor version; when a new version is allowed, these say what to re-check."""

from __future__ import annotations

import inspect

import pytest


def hook(condition: bool, what: str, user: str) -> None:
    if not condition:
        pytest.fail(f"{what} is gone or changed in this version; {user} depends on it: adapt it before "
                    "raising the version bound in pyproject.toml")


# -- python-qpid-proton ----------------------------------------------------------------------------


# (the frame-trace hook of python-qpid-proton is at the end of this file)


# -- lark --------------------------------------------------------------------------------------------


def test_lark_lalr_tables():
    from lark import Lark

    try:
        from lark.parsers.lalr_analysis import Shift
    except ImportError:
        Shift = None  # noqa: N806
    hook(Shift is not None, "lark.parsers.lalr_analysis.Shift", "broker_filter.filters.parser._Grammar")
    lark = Lark('start: "a" b\n?b: "b"', parser="lalr", lexer="basic", maybe_placeholders=False)
    inner = getattr(getattr(getattr(lark, "parser", None), "parser", None), "parser", None)
    table = getattr(inner, "parse_table", None)
    hook(table is not None and all(hasattr(table, a) for a in ("states", "start_states", "end_states")),
         "Lark(...).parser.parser.parser.parse_table with states / start_states / end_states",
         "broker_filter.filters.parser._Grammar (runs lark's LALR tables with its own driver)")
    actions = [a for row in table.states.values() for a in row.values()]
    hook(all(isinstance(a, tuple) and len(a) == 2 for a in actions), "parse-table actions as (action, argument)",
         "broker_filter.filters.parser._Grammar")
    rules = [arg for action, arg in actions if action is not Shift]
    hook(any(rules), "reduce actions in the parse table", "broker_filter.filters.parser._Grammar")
    for rule in rules:
        hook(all(hasattr(rule, a) for a in ("alias", "origin", "expansion", "options"))
             and hasattr(rule.origin, "name") and hasattr(rule.options, "expand1"),
             "Rule.alias / origin.name / expansion / options.expand1", "broker_filter.filters.parser._Grammar")



def test_proton_frame_trace_shows_an_attach_replys_offered_capabilities():
    """proton 0.40 has no getter for a link's remote offered-capabilities: broker_filter.proxy.remote
    reads them from the frame trace (`Transport.tracer`).  A real proton-c transport is fed an attach
    carrying offered-capabilities, and the line it traces must be one the upstream reads."""
    import struct

    from proton import Connection, Data, Transport, symbol

    def frame(code: int, *fields) -> bytes:
        d = Data()
        d.put_described()
        d.enter()
        d.put_ulong(code)
        d.put_list()
        d.enter()
        for put in fields:
            put(d)
        d.exit()
        d.exit()
        body = d.encode()
        return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body

    def capabilities(d: Data) -> None:
        d.put_array(False, Data.SYMBOL)
        d.enter()
        for c in ("AMQP_FILTEX_PROP_V1_0", "AMQP_FILTEX_SQL_V1_0"):
            d.put_symbol(symbol(c))
        d.exit()

    null = Data.put_null
    wire = b"AMQP\x00\x01\x00\x00" + frame(0x10, lambda d: d.put_string("peer")) + frame(
        0x11, null, lambda d: d.put_uint(0), lambda d: d.put_uint(100), lambda d: d.put_uint(100)) + frame(
        # attach: name, handle, role (sender), 6 fields left out, initial-delivery-count, max-message-size,
        # offered-capabilities
        0x12, lambda d: d.put_string('c"q-1'), lambda d: d.put_uint(0), lambda d: d.put_bool(False),
        *[null] * 6, lambda d: d.put_uint(0), null, capabilities)
    lines: list[str] = []
    transport = Transport(Transport.SERVER)
    transport.tracer = lambda _transport, message: lines.append(message)
    transport.trace(Transport.TRACE_FRM)
    transport.bind(Connection())
    transport.push(wire)
    assert transport.condition is None, transport.condition

    from broker_filter.proxy.remote import RemoteUpstream

    up = RemoteUpstream("amqp://127.0.0.1:1")
    up._endpoints = {'c"q-1': type("Consumer", (), {"offer_pending": True})()}
    for line in lines:
        up._on_trace(None, line)
    hook(up._traced == {'c"q-1': {"AMQP_FILTEX_PROP_V1_0", "AMQP_FILTEX_SQL_V1_0"}},
         f"proton's frame trace of an attach's offered-capabilities (traced: {lines!r})",
         "broker_filter.proxy.remote.RemoteUpstream._on_trace (RabbitMQ 4.1+ stream filter push-down)")
