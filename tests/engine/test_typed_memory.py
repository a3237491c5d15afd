"""The daemon's per-message path on the engine's link handlers, driven in memory: a client engine
connection pumped against the proxy (`ProxyServer` on `EngineContainer`), whose upstream
(`RemoteUpstream`) is pumped against a broker made of engine objects.  No sockets, no subprocess:
what the broker sees is what the proxy wrote on the wire (outcomes, their order, the disposition
and flow frames)."""

from __future__ import annotations

from typing import Any

import pytest

from broker_filter.amqp import decode, decode_message
from broker_filter.amqp import types as t
from broker_filter.amqp.sections import encode_section
from broker_filter.config import Config
from broker_filter.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, Handler, Terminus
from broker_filter.engine.container import EngineContainer, _symbol_keys
from broker_filter.proxy.lifecycle import ConnectionRegistry
from broker_filter.proxy.loop import EngineLoop
from broker_filter.proxy.remote import RemoteUpstream
from broker_filter.proxy.server import ProxyServer

from .apps import Recorder, settle_proxy

SELECTOR = t.ulong(0x0000468C00000004)
DISPOSITION, FLOW = 0x15, 0x13


class Broker(Handler):
    """The upstream broker: opens what the proxy attaches, grants its publishers credit, records
    the outcomes it gets (by message number) and the messages published to it."""

    def __init__(self, credit: int = 500):
        self.credit = credit
        self.senders: list = []
        self.sent: dict[Any, int] = {}  # Delivery -> message number
        self.outcomes: list[tuple] = []  # (n, state, failed, undeliverable, condition, annotations)
        self.published: list[bytes] = []
        self.publishes: list = []  # their deliveries, settled by the test

    def on_link_open(self, link) -> None:
        if link.is_sender:  # the proxy's consumer
            link.set_source(Terminus(address=link.remote_source.address))
            self.senders.append(link)
        else:  # the proxy's publisher
            link.set_target(Terminus(address=link.remote_target.address))
        link.open()
        if not link.is_sender:
            link.flow(self.credit)

    def send(self, n: int, selected: bool) -> None:
        sender = self.senders[-1]
        data = encode_section(0x74, {"n": n, "half": 1 if selected else 0}) + encode_section(0x77, f"m{n}")
        self.sent[sender.send(data)] = n

    def on_delivery_update(self, delivery) -> None:
        if not delivery.remote_settled:
            return
        self.outcomes.append((self.sent.get(delivery), delivery.remote_state, delivery.remote_failed,
                              delivery.remote_undeliverable, delivery.remote_condition, delivery.remote_annotations))
        delivery.settle()

    def on_message(self, delivery, data: memoryview) -> None:
        self.published.append(bytes(data))
        self.publishes.append(delivery)


class _MemoryContainer(EngineContainer):
    """`connect` joins the upstream in memory to `broker` (no socket, no SASL)."""

    def __init__(self, broker: Handler):
        super().__init__("typed-in-memory")
        self.broker = broker
        self.pairs: list = []

    def connect(self, url: str, handler: Any, *, properties: dict | None = None, **ignored: Any) -> Any:
        connection = self.loop.connection(handler, server=False)  # the upstream's handler: an engine Handler
        connection.open(hostname="localhost", properties=_symbol_keys(properties))
        self.pairs.append((connection, self.loop.connection(self.broker, server=True)))
        return connection


class Relayed:
    """A client, the proxy with a remote upstream, the broker; all pumped in memory.  The frames the
    proxy writes upstream are recorded (`frames`: performative codes)."""

    def __init__(self) -> None:
        self.broker = Broker()
        self.container = _MemoryContainer(self.broker)
        self.engine = self.container.loop
        self.frames: list[int] = []
        take_output = self.engine.take_output

        def recorded(connection):
            out = take_output(connection)
            if out is not None and self.container.pairs and connection is self.container.pairs[0][0]:
                self.frames += _performatives(bytes(out))
            return out

        self.engine.take_output = recorded
        self.loop = EngineLoop(self.container)
        self.upstream = RemoteUpstream("amqp://127.0.0.1:5672")
        self.server = ProxyServer(self.upstream, instance="typed", window=100, config=Config())
        self.upstream.start(self.loop, self.server)
        self.server_conn = self.engine.connection(None, server=True)  # type: ignore[arg-type]
        self.container.adopt(self.server_conn, ConnectionRegistry(self.server))
        self.client = Recorder(accept=False)
        self.client_conn = self.engine.connection(self.client, server=False)
        self.client_conn.open(hostname="localhost")
        self.session = self.client_conn.session()
        self.session.open()
        self.settle()
        assert self.server.upstream_up

    def settle(self) -> None:
        settle_proxy(self.container, self.loop, [(self.client_conn, self.server_conn), *self.container.pairs], 100)

    def receiver(self, address: str, selector: str | None = None, credit: int = 0, durable: bool = False):
        source = Terminus(address=address,
                          filter={t.symbol("jms-selector"): t.Described(SELECTOR, selector)} if selector else None,
                          **({"durability": 2, "expiry_policy": "never"} if durable else {}))
        receiver = self.session.receiver(f"r-{address}", source=source)
        receiver.open()
        self.settle()
        if credit:
            receiver.flow(credit)
            self.settle()
        return receiver


def _performatives(data: bytes) -> list[int]:
    out, pos = [], 8 if data[:4] == b"AMQP" else 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        if size > 8 * 1:
            body = pos + 4 * data[pos + 4]
            if body < pos + size:
                out.append(int(decode(data, body)[0].descriptor))
        pos += size
    return out


@pytest.fixture
def relayed():
    r = Relayed()
    yield r
    r.upstream.stop()


def test_each_client_outcome_reaches_the_upstream_as_that_outcome(relayed):
    # A durable subscription has an upstream subscription of its own, so each client outcome is the
    # upstream outcome (links sharing an address's subscription settle their copies: test_fanout_rules).
    relayed.receiver("/topic/outcomes", credit=10, durable=True)
    for n in range(4):
        relayed.broker.send(n, True)
    relayed.settle()
    assert [decode_message(m).body for m in relayed.client.messages] == ["m0", "m1", "m2", "m3"]
    accepted, rejected, released, modified = relayed.client.deliveries
    accepted.accept()
    rejected.reject(("amqp:invalid-field", "no thanks"))
    released.release()
    modified.modify(failed=True, undeliverable=True, annotations={t.symbol("x-opt-why"): "test"})
    relayed.settle()
    outcomes = {n: rest for n, *rest in relayed.broker.outcomes}
    assert outcomes[0][0] == ACCEPTED
    assert outcomes[1][0] == REJECTED and tuple(outcomes[1][3]) == ("amqp:invalid-field", "no thanks")
    assert outcomes[2][0] == RELEASED
    assert tuple(outcomes[3][:3]) == (MODIFIED, True, True) and outcomes[3][4] == {t.symbol("x-opt-why"): "test"}
    assert len(relayed.broker.outcomes) == 4


def test_a_subscription_settles_upstream_in_delivery_order_in_few_frames(relayed):
    relayed.receiver("/topic/ordered", "half = 1", credit=50)
    for n in range(40):
        relayed.broker.send(n, n % 2 == 0)  # every other message selected
    relayed.settle()
    assert len(relayed.client.deliveries) == 20
    # the unselected ones are decided (accepted) at once, but wait behind the first selected one
    assert relayed.broker.outcomes == []
    for d in relayed.client.deliveries[:10]:
        d.accept()
    relayed.settle()
    settled = [n for n, *_ in relayed.broker.outcomes]
    assert settled == list(range(20))  # up to the first undecided (selected message 20)
    for d in relayed.client.deliveries[10:]:
        d.accept()
    relayed.settle()
    assert [n for n, *_ in relayed.broker.outcomes] == list(range(40))
    assert all(state == ACCEPTED for _, state, *_ in relayed.broker.outcomes)
    # proton-c coalesces a run of consecutive settlements into one disposition frame
    assert relayed.frames.count(DISPOSITION) <= 4, relayed.frames


def test_closing_the_link_settles_what_was_decided_out_of_order(relayed):
    receiver = relayed.receiver("/topic/closing", "half = 1", credit=10, durable=True)
    relayed.broker.send(0, True)
    relayed.broker.send(1, False)
    relayed.broker.send(2, False)
    relayed.settle()
    assert relayed.broker.outcomes == []  # 1 and 2 wait behind 0, which the client holds
    receiver.close()
    relayed.settle()
    # the link went with 0 unsettled: it goes back as a failed attempt; 1 and 2 were accepted
    outcomes = {n: state for n, state, *_ in relayed.broker.outcomes}
    assert outcomes[1] == ACCEPTED and outcomes[2] == ACCEPTED
    assert outcomes.get(0, MODIFIED) == MODIFIED


def test_upstream_credit_and_client_credit_move_in_batches(relayed):
    link = relayed.receiver("/topic/credit", credit=0)
    flows_before = relayed.frames.count(FLOW)
    total = 0
    for _ in range(20):  # the client grants 10 at a time and accepts what it got
        link.flow(10)
        relayed.settle()
        sender = relayed.broker.senders[-1]
        while sender.credit > 0 and total < 200:
            relayed.broker.send(total, True)
            total += 1
        relayed.settle()
        for d in relayed.client.deliveries:
            d.accept()
        relayed.client.deliveries.clear()
        relayed.settle()
    assert len(relayed.client.messages) == 200
    flows = relayed.frames.count(FLOW) - flows_before
    assert 1 <= flows <= 200 // 10, flows  # far fewer flow frames than messages


def test_a_client_publish_goes_upstream_with_its_origin_and_gets_the_upstream_outcome(relayed):
    sender = relayed.session.sender("s", target=Terminus(address="/queue/in"))
    sender.open()
    relayed.settle()
    assert sender.credit > 0
    flows = relayed.client.flows
    sent = [sender.send(encode_section(0x77, f"p{n}")) for n in range(50)]
    relayed.settle()
    assert [decode_message(m).body for m in relayed.broker.published] == [f"p{n}" for n in range(50)]
    origin = decode_message(relayed.broker.published[0]).message_annotations[t.symbol("x-opt-broker-filter-origin")]
    assert origin.startswith("typed/")
    publishes = relayed.broker.publishes
    for d in publishes[:-1]:
        d.accept()
    publishes[-1].reject(("amqp:resource-limit-exceeded", "full"))
    relayed.settle()
    states = [state for state, settled in relayed.client.updates if settled]
    assert sorted(states) == [ACCEPTED] * 49 + [REJECTED]  # (ACCEPTED < REJECTED)
    assert all(d.ptr is None for d in sent)  # every client delivery settled
    assert relayed.client.flows - flows <= 5  # credit topped up in batches, not per message


def test_each_client_link_is_one_object_its_handler_with_its_state(relayed):
    from broker_filter.engine.endpoints import Transfers
    from broker_filter.proxy.receiver import ReceiverLink
    from broker_filter.proxy.sender import Relay, SenderLink

    def served(name: str):
        link = next(link for link in relayed.engine.links.values()
                    if link.connection is relayed.server_conn and link.name == name)
        return link, link.handler

    receiver = relayed.receiver("/topic/objects", "half = 1", credit=5)
    publisher = relayed.session.sender("s-objects", target=Terminus(address="/queue/in"))
    anonymous = relayed.session.sender("s-relay", target=Terminus())
    publisher.open()
    anonymous.open()
    relayed.settle()
    links = {name: served(name) for name in ("r-/topic/objects", "s-objects", "s-relay")}
    kinds = {name: (type(handler), handler.state) for name, (_, handler) in links.items()}
    assert kinds == {"r-/topic/objects": (ReceiverLink, "attached"), "s-objects": (SenderLink, "attached"),
                     "s-relay": (Relay, "attached")}
    # the engine hands each its transfers by link pointer; the upstream's links have handlers of their own
    for link, handler in links.values():
        assert relayed.engine.link_handlers[link.ptr] is handler
    upstream = relayed.container.pairs[0][0]
    upstream_links = [link for link in relayed.engine.links.values() if link.connection is upstream]
    assert upstream_links and all(isinstance(link.handler, Transfers) for link in upstream_links)
    # its flow and detach go to it, not to the server: the server's state of it is dropped, it is gone
    receiver.flow(5)
    relayed.settle()
    assert links["r-/topic/objects"][1].outlet.credit == 10
    receiver.close()
    publisher.close()
    relayed.settle()
    assert links["r-/topic/objects"][1].state == "gone" and links["s-objects"][1].state == "gone"
    assert links["s-relay"][1].state == "attached"
    assert links["r-/topic/objects"][0].ptr is None  # closed both ways: forgotten by the engine, its entry too
    assert len(relayed.engine.link_handlers) == 1 + len(upstream_links) - 2  # the relay's, and the upstream's left


def test_a_closed_client_link_and_its_object_are_freed_without_the_collector(relayed):
    import gc

    from broker_filter.proxy.forwarding import Outlet
    from broker_filter.proxy.receiver import ReceiverLink
    from broker_filter.proxy.sender import Relay

    gc.collect()
    gc.disable()  # (a link and its handler refer to each other until the engine forgets the link)
    try:
        receiver = relayed.receiver("/topic/freed", "half = 1", credit=5)
        anonymous = relayed.session.sender("s-freed", target=Terminus())
        anonymous.open()
        relayed.settle()
        relayed.broker.send(0, True)
        relayed.settle()
        relayed.client.deliveries[-1].accept()
        receiver.close()
        anonymous.close()
        relayed.settle()
        left = [o for o in gc.get_objects() if isinstance(o, (ReceiverLink, Relay, Outlet))]
        assert left == []
    finally:
        gc.enable()


def test_a_failure_in_a_link_handler_closes_that_link_only(relayed, caplog, monkeypatch):
    from broker_filter import logs
    from broker_filter.proxy.receiver import ReceiverLink

    caplog.handler.addFilter(logs._capture_ambient)  # (what `logs.configure` does for the daemon's handler)

    relayed.receiver("/topic/broken", credit=5, durable=True)  # own upstream subscriptions, as above
    healthy = relayed.receiver("/topic/healthy", credit=5, durable=True)
    relayed.broker.senders[0].send(encode_section(0x77, "to the broken link"))
    relayed.broker.senders[1].send(encode_section(0x77, "to the healthy link"))
    relayed.settle()
    first, second = relayed.client.deliveries
    broken_link = next(link for link in relayed.engine.links.values()
                       if link.connection is relayed.server_conn and link.name == "r-/topic/broken")
    handler = broken_link.handler
    assert isinstance(handler, ReceiverLink) and handler.state == "attached"

    def broken(self, delivery):
        raise RuntimeError("broken outcome handling")

    monkeypatch.setattr(ReceiverLink, "transfer", broken)  # while the broken link's outcome arrives
    first.accept()
    relayed.settle()
    monkeypatch.undo()
    assert handler.state == "gone"
    assert relayed.client.closed == [("r-/topic/broken", ("amqp:internal-error",
                                                          "proxy failure on this link; see the proxy log"))]
    assert "broken outcome handling" in caplog.text
    (failure,) = [r for r in caplog.records if r.getMessage() == "handling a delivery failed"]
    # logged with the connection and the link, though the per-message path runs outside the handlers
    assert failure._broker_filter_ambient == {"conn": failure._broker_filter_ambient["conn"], "link": "r-/topic/broken"}
    assert failure._broker_filter_ambient["conn"]
    second.accept()
    relayed.settle()
    assert healthy.remote_state != 0 and not healthy.remote_closed
    # the healthy link's message accepted; the broken link's given back as a failed attempt
    assert sorted(state for _, state, *_ in relayed.broker.outcomes) == [ACCEPTED, MODIFIED]


def test_a_stream_through_a_subscription_arrives_whole_and_is_settled_upstream_in_order(relayed):
    """2,000 messages relayed as a client takes them (accepting at once, credit in batches): the
    client gets exactly the selected ones in order, and the broker an accepted outcome for every
    message, settled in delivery order (in a handful of disposition frames)."""
    relayed.client.accept = True
    link = relayed.receiver("/topic/stream", "half = 1")
    sender = relayed.broker.senders[-1]
    sent = 0
    for _ in range(200):  # bounded: each turn moves a batch, about as many selected as the credit given
        if sent == 2000:
            break
        link.flow(100)
        relayed.settle()
        batch = sent + 300
        while sender.credit > 0 and sent < min(batch, 2000):
            relayed.broker.send(sent, sent % 3 == 0)
            sent += 1
        relayed.settle()
    assert sent == 2000
    assert [decode_message(m).application_properties["n"] for m in relayed.client.messages] == list(range(0, 2000, 3))
    # (the broker's engine may report a frame's range after the next frame's: the set, once each)
    assert sorted(n for n, *_ in relayed.broker.outcomes) == list(range(2000))
    assert all(state == ACCEPTED for _, state, *_ in relayed.broker.outcomes)
    # settled in delivery order, proton-c coalesces them: out of order, that is a frame a message or so
    assert relayed.frames.count(DISPOSITION) <= 2000 // 20, relayed.frames.count(DISPOSITION)
