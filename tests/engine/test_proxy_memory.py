"""The daemon's proxy handlers (`ProxyServer` with the embedded broker upstream) on engine objects,
driven in memory: an engine client connection pumped against a server connection whose events go to
the proxy through `EngineContainer`, no sockets and no subprocess."""

from __future__ import annotations

import pytest

from broker_filter.amqp import types as t
from broker_filter.amqp import decode_message
from broker_filter.amqp.sections import encode_section
from broker_filter.config import Config
from broker_filter.engine import ACCEPTED, Terminus
from broker_filter.engine.container import EngineContainer
from broker_filter.proxy import reports
from broker_filter.proxy.lifecycle import ConnectionRegistry
from broker_filter.proxy.embedded import EmbeddedUpstream
from broker_filter.proxy.loop import EngineLoop
from broker_filter.proxy.server import ProxyServer

from .apps import Recorder, settle_proxy

SELECTOR = t.ulong(0x0000468C00000004)


class Proxied:
    """A ProxyServer on the embedded broker, its loop an EngineContainer's, and one client."""

    def __init__(self) -> None:
        config = Config()
        self.container = EngineContainer("proxy-in-memory")
        self.engine = self.container.loop
        self.loop = EngineLoop(self.container)
        self.upstream = EmbeddedUpstream.from_config(config.embedded)
        self.server = ProxyServer(self.upstream, instance="proxy-in-memory", window=100, config=config)
        self.upstream.start(self.loop, self.server)
        self.server_conn = self.engine.connection(None, server=True)  # type: ignore[arg-type]
        self.container.adopt(self.server_conn, ConnectionRegistry(self.server))
        self.client = Recorder()
        self.client_conn = self.engine.connection(self.client, server=False)
        self.client_conn.open(hostname="localhost")
        self.session = self.client_conn.session()
        self.session.open()
        self.settle()

    def settle(self) -> None:
        settle_proxy(self.container, self.loop, [(self.client_conn, self.server_conn)])

    def close(self) -> None:
        self.upstream.stop()


@pytest.fixture
def proxied():
    p = Proxied()
    yield p
    p.close()


def message(n: int) -> bytes:
    return encode_section(0x74, {"n": n}) + encode_section(0x77, f"m{n}")


def test_a_selector_on_a_receiver_filters_through_the_proxy_in_memory(proxied):
    s = proxied.session
    receiver = s.receiver("r", source=Terminus(address="orders",
                                                filter={t.symbol("jms-selector"): t.Described(SELECTOR, "n > 2")}))
    receiver.open()
    sender = s.sender("s", target=Terminus(address="orders"))
    sender.open()
    proxied.settle()
    assert receiver.remote_source.filter == {t.symbol("jms-selector"): t.Described(SELECTOR, "n > 2")}
    assert sender.credit > 0
    for n in range(6):
        sender.send(message(n))
    receiver.flow(10)
    proxied.settle()
    assert [decode_message(m).body for m in proxied.client.messages] == ["m3", "m4", "m5"]
    assert [state for state, _ in proxied.client.updates] == [ACCEPTED] * 6


def test_an_invalid_selector_is_refused_with_the_wire_contract(proxied):
    receiver = proxied.session.receiver("bad", source=Terminus(
        address="orders", filter={t.symbol("jms-selector"): t.Described(SELECTOR, "n >")}))
    receiver.open()
    proxied.settle()
    (name, condition), = proxied.client.closed
    assert name == "bad" and condition.name == "amqp:invalid-field"
    (source,) = proxied.client.sources
    assert source.address is None and source.filter is None  # the attach reply had a null source


@pytest.mark.parametrize("count", [1, 3])
def test_a_garbled_filter_map_is_refused_with_decode_error_not_served_unfiltered(proxied, count):
    from broker_filter.amqp import decode

    from .test_memory import _raw_attach

    conn = proxied.engine.connection(None, server=True)  # type: ignore[arg-type]
    proxied.container.adopt(conn, ConnectionRegistry(proxied.server))
    data = _raw_attach(count)
    assert proxied.engine.push(conn, data) == len(data)
    proxied.engine.process()
    proxied.engine.after_turn()  # the proxy's call_soon work (EngineLoop)
    proxied.engine.process()
    out = bytes(proxied.engine.take_output(conn))
    frames, pos = [], 8  # after the AMQP header
    while pos < len(out):
        size = int.from_bytes(out[pos:pos + 4], "big")
        if size > 8:
            frames.append(decode(out, pos + 4 * out[pos + 4])[0])
        pos += size
    names = [int(f.descriptor) for f in frames]
    assert names == [0x10, 0x11, 0x12, 0x16], names  # open, begin, attach, detach
    attach, detach = frames[2].value, frames[3].value
    assert len(attach) < 6 or attach[5] is None  # null source
    assert detach[1] is True and detach[2].value[0] == "amqp:decode-error"
    assert reports.snapshot(proxied.server)["links"]["consumer"] == 0  # the proxy never made it a consumer
