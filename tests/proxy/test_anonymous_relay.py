"""Anonymous relay (issue 28 item 3): a sender with a null target addresses each message by its
`properties.to`; the transaction coordinator is refused (issue 28 item 9)."""

from __future__ import annotations

import uuid

import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from tests.support.clients import connect, receive_n, receiver, receives_nothing, run_js

from proton.handlers import MessagingHandler
from proton.reactor import Container


def _name() -> str:
    return f"relay-{uuid.uuid4().hex[:10]}"


class _Outcomes(MessagingHandler):
    """Sends `messages` on an anonymous sender; records each delivery's outcome and condition."""

    def __init__(self, url: str, messages: list[Message]):
        super().__init__(auto_accept=False)
        self.url = url
        self.messages = messages
        self.outcomes: dict = {}
        self.offered = None
        self.sent = False

    def on_start(self, event):
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, None)

    def on_connection_opened(self, event):
        self.offered = [str(c) for c in (event.connection.remote_offered_capabilities or [])]

    def on_sendable(self, event):
        if self.sent:
            return
        self.sent = True
        for i, m in enumerate(self.messages):
            dlv = event.sender.send(m)
            dlv.bf_index = i

    def _done(self, event, kind):
        cond = event.delivery.remote.condition
        self.outcomes[event.delivery.bf_index] = (kind, cond.name if cond else None, cond.description if cond else None)
        if len(self.outcomes) == len(self.messages):
            self.conn.close()

    def on_accepted(self, event):
        self._done(event, "accepted")

    def on_rejected(self, event):
        self._done(event, "rejected")

    def on_released(self, event):
        self._done(event, "released")

    def on_link_error(self, event):
        self.outcomes["link"] = str(event.link.remote_condition)
        self.conn.close()


def _run(url, messages):
    h = _Outcomes(url, messages)
    c = Container(h)
    c.timeout = 20
    c.run()
    return h


def _missing(daemon, queue: str) -> str:
    """An address the upstream refuses: a RabbitMQ exchange that does not exist; on the embedded broker
    (which creates addresses on demand) an existing queue named on an address it is not on."""
    if daemon.forms[1].startswith("/queue"):
        return f"/exchange/missing-{uuid.uuid4().hex[:8]}"
    return f"{_name()}::{queue}"


def test_relay_routes_each_message_by_its_to(daemon):
    a, b = daemon.forms[1].format(_name()), daemon.forms[1].format(_name())
    conn = connect(daemon.url)
    try:
        ra, rb = receiver(conn, a), receiver(conn, b)
        snd = conn.create_sender(None)
        for i in range(3):
            snd.send(Message(address=a, body=f"a{i}"))
            snd.send(Message(address=b, body=f"b{i}"))
        assert [m.body for m in receive_n(ra, 3)] == ["a0", "a1", "a2"]
        assert [m.body for m in receive_n(rb, 3)] == ["b0", "b1", "b2"]
        assert receives_nothing(ra) and receives_nothing(rb)
    finally:
        conn.close()


def test_open_offers_anonymous_relay(daemon):
    h = _run(daemon.url, [Message(address=daemon.forms[1].format(_name()), body="x")])
    assert "ANONYMOUS-RELAY" in h.offered
    assert h.outcomes[0][0] == "accepted"


def test_missing_to_and_missing_address_rejected_link_lives_on(daemon):
    name = _name()
    good = daemon.forms[1].format(name)
    conn = connect(daemon.url)
    try:
        rcv = receiver(conn, good)
        missing = _missing(daemon, name)
        h = _run(daemon.url, [Message(body="no to"), Message(address=good, body="one"),
                              Message(address=_missing(daemon, name), body="lost"),
                              Message(address=good, body="two")])
        assert "link" not in h.outcomes, h.outcomes
        assert h.outcomes[0][:2] == ("rejected", "amqp:invalid-field")
        assert "properties.to" in h.outcomes[0][2]
        assert h.outcomes[1][0] == "accepted"
        assert h.outcomes[2][:2] == ("rejected", "amqp:not-found"), h.outcomes
        assert h.outcomes[2][2]  # says what is missing
        assert h.outcomes[3][0] == "accepted"
        assert [m.body for m in receive_n(rcv, 2)] == ["one", "two"]
    finally:
        conn.close()


class _Coordinator(MessagingHandler):
    def __init__(self, url):
        super().__init__()
        self.url = url
        self.condition = None

    def on_start(self, event):
        from proton import Terminus

        conn = event.container.connect(self.url)
        session = conn.session()
        link = session.sender("txn-" + uuid.uuid4().hex[:6])
        link.target.type = Terminus.COORDINATOR
        link.source.address = "src"
        session.open()
        link.open()
        conn.open()
        self.conn = conn

    def on_link_remote_close(self, event):
        self.condition = event.link.remote_condition
        self.conn.close()

    on_link_error = on_link_remote_close


def test_transaction_coordinator_refused(daemon):
    h = _Coordinator(daemon.url)
    c = Container(h)
    c.timeout = 10
    c.run()
    assert h.condition is not None
    assert h.condition.name == "amqp:not-implemented"
    assert h.condition.description == "transactions are not supported"


def test_relay_publishers_are_bounded(daemon):
    """More addresses than RELAY_PUBLISHERS on one link: each still gets its message (the least
    recently used publishers are closed and reopened on demand)."""
    from broker_filter.proxy.sender import RELAY_PUBLISHERS

    names = [daemon.forms[1].format(_name()) for _ in range(RELAY_PUBLISHERS + 4)]
    conn = connect(daemon.url)
    try:
        receivers = [receiver(conn, a) for a in names]
        snd = conn.create_sender(None)
        for rnd in range(2):
            for a in names:
                snd.send(Message(address=a, body=f"{rnd}:{a}"))
        for a, r in zip(names, receivers):
            assert [m.body for m in receive_n(r, 2)] == [f"0:{a}", f"1:{a}"]
    finally:
        conn.close()


def test_relay_no_local(daemon):
    """A relayed message carries the origin annotation: a no-local receiver on the publishing
    connection does not get it, one on another connection does."""
    topic = daemon.forms[0].format(_name())
    mine, other = connect(daemon.url), connect(daemon.url)
    try:
        from proton.reactor import Filter
        from proton import Described, symbol, ulong

        no_local = Filter({symbol("no-local"): Described(ulong(0x0000468C00000003), [])})
        r_mine = mine.create_receiver(topic, credit=10, options=no_local)
        r_other = other.create_receiver(topic, credit=10, options=no_local)
        snd = mine.create_sender(None)
        snd.send(Message(address=topic, body="hello"))
        assert [m.body for m in receive_n(r_other, 1)] == ["hello"]
        assert receives_nothing(r_mine)
    finally:
        mine.close()
        other.close()


def test_rhea_anonymous_sender(daemon):
    a, b = daemon.forms[1].format(_name()), daemon.forms[1].format(_name())
    conn = connect(daemon.url)
    try:
        ra, rb = receiver(conn, a), receiver(conn, b)
        lines = run_js("anonymous_relay.js", str(daemon.port), a, b)
        assert "ANONYMOUS-RELAY" in lines[0]["offered"], lines
        outcomes = {line["i"]: (line["outcome"], line["condition"]) for line in lines if "i" in line}
        assert outcomes == {0: ("accepted", None), 1: ("rejected", "amqp:invalid-field"), 2: ("accepted", None)}, lines
        assert [m.body for m in receive_n(ra, 1)] == ["to-a"]
        assert [m.body for m in receive_n(rb, 1)] == ["to-b"]
    finally:
        conn.close()
