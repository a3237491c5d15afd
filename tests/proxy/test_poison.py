"""Issue 44 items 1 and 3: one client's message never takes other clients' links down.

RabbitMQ 3.10 drops the whole connection on a message its AMQP 1.0 plugin cannot parse (an
`amqp-value` list or float array body, ...; tests/proxy/test_poison_rules.py holds the rules), and
through the daemon that connection is every client's.  The daemon refuses such a message itself
(`rejected`, `amqp:not-implemented`, naming the upstream's version); the sender's link stays usable and a
bystander publishing meanwhile loses nothing.  RabbitMQ 4.0 takes these messages: they are forwarded
unchanged.  When the broker does drop the connection, the clients whose publishes were in flight are
logged and the reconnect is counted by its cause."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from proton import Array, Data, Message, UNDESCRIBED, float32
from proton.handlers import MessagingHandler
from proton.reactor import Container

from tests.support.clients import connect, receive_n, receiver, sender

pytestmark = pytest.mark.rabbitmq

BYSTANDER_SENDS = 12
PACE = 0.15  # seconds between the bystander's sends (the reproduction)
FLOATS = [1.5, 2.5, -0.25]


def _poison() -> Message:
    # (proton encodes Python floats in a float array as zeros: float32 values)
    return Message(body=Array(UNDESCRIBED, Data.FLOAT, *map(float32, FLOATS)))


class _Outcomes(MessagingHandler):
    """Sends `messages` on one sender (to `address`; None: the anonymous relay, each message's
    `address` naming its node) and records each outcome with its condition and description, and the
    link's detach if any."""

    def __init__(self, url: str, address: str | None, messages: list[Message], timeout: float = 15.0):
        super().__init__(auto_accept=False, auto_settle=True)
        self.url, self.address, self.messages, self.timeout = url, address, messages, timeout
        self.outcomes: dict[int, tuple] = {}
        self.detached = None
        self.sent = False

    def on_start(self, event):
        self.timer = event.container.schedule(self.timeout, self)
        self.conn = event.container.connect(self.url, reconnect=False)
        self.sender = event.container.create_sender(self.conn, self.address)

    def on_timer_task(self, event):
        self.conn.close()

    def on_sendable(self, event):
        if self.sent:
            return
        self.sent = True
        for i, m in enumerate(self.messages):
            event.sender.send(m).bf_index = i

    def _done(self, event, kind: str) -> None:
        c = event.delivery.remote.condition
        self.outcomes[event.delivery.bf_index] = (kind, c.name if c else None, c.description if c else None)
        if len(self.outcomes) == len(self.messages):
            self.timer.cancel()
            self.conn.close()

    def on_accepted(self, event):
        self._done(event, "accepted")

    def on_rejected(self, event):
        self._done(event, "rejected")

    def on_released(self, event):
        self._done(event, "released")

    def on_link_remote_close(self, event):
        c = event.link.remote_condition
        self.detached = (c.name, c.description) if c else ("", "")
        self.timer.cancel()
        self.conn.close()


def send_outcomes(url: str, address: str | None, messages: list[Message]) -> _Outcomes:
    handler = _Outcomes(url, address, messages)
    Container(handler).run()
    return handler


class Bystander(threading.Thread):
    """Another client: publishes `BYSTANDER_SENDS` string messages to its own queue, one every `PACE`
    seconds, counting those accepted and noting every failure; `started` is set after its second."""

    def __init__(self, url: str, address: str):
        super().__init__(daemon=True)
        self.url, self.address = url, address
        self.accepted = 0
        self.failures: list[str] = []
        self.started = threading.Event()

    def run(self) -> None:
        conn = None
        try:
            conn = connect(self.url)
            snd = sender(conn, self.address)
            for i in range(BYSTANDER_SENDS):
                try:
                    snd.send(Message(body=f"innocent {i}"), timeout=10)
                    self.accepted += 1
                except Exception as e:  # a refused send, a detached link, a lost connection
                    self.failures.append(f"send {i}: {type(e).__name__}: {e}")
                    try:
                        snd = sender(conn, self.address)
                    except Exception as e2:
                        self.failures.append(f"re-attach after send {i}: {type(e2).__name__}: {e2}")
                if i == 1:
                    self.started.set()
                time.sleep(PACE)  # pacing, as the reproduction: not a synchronisation
        except Exception as e:
            self.failures.append(f"connection: {type(e).__name__}: {e}")
        finally:
            self.started.set()
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass


def _names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"/queue/poison-{tag}", f"/queue/innocent-{tag}"


def _through(proxy, rabbitmq_broker, relay: bool) -> None:
    """The reproduction through the daemon: the poison client sends the float array then a string
    while the bystander publishes (and a consumer of the bystander's queue stays attached)."""
    poison_q, innocent_q = _names()
    watch = connect(proxy.url)
    try:
        rcv = receiver(watch, innocent_q, credit=BYSTANDER_SENDS)
        bystander = Bystander(proxy.url, innocent_q)
        bystander.start()
        assert bystander.started.wait(30)
        messages = [_poison(), Message(body="good after poison")]
        if relay:
            for m in messages:
                m.address = poison_q
        poisoner = send_outcomes(proxy.url, None if relay else poison_q, messages)
        bystander.join(60)
        assert not bystander.is_alive()
        # the bystander: every send accepted, every message delivered to its consumer, no detach
        assert bystander.failures == []
        assert bystander.accepted == BYSTANDER_SENDS
        got = receive_n(rcv, BYSTANDER_SENDS, timeout=10)
        assert sorted(m.body for m in got) == sorted(f"innocent {i}" for i in range(BYSTANDER_SENDS))
    finally:
        watch.close()
    assert poisoner.detached is None, poisoner.detached
    if rabbitmq_broker.major >= 4:
        # RabbitMQ 4.0 takes the array: forwarded unchanged
        assert poisoner.outcomes == {0: ("accepted", None, None), 1: ("accepted", None, None)}
        conn = connect(proxy.url)
        try:
            got = receive_n(receiver(conn, poison_q, credit=2), 2, timeout=10)
        finally:
            conn.close()
        body = got[0].body
        assert isinstance(body, Array) and body.type == Data.FLOAT and list(body.elements) == FLOATS
        assert got[1].body == "good after poison"
    else:
        kind, condition, description = poisoner.outcomes[0]
        assert (kind, condition) == ("rejected", "amqp:not-implemented")
        assert "RabbitMQ 3.10" in description and "array of float elements" in description
        assert poisoner.outcomes[1] == ("accepted", None, None)  # the sender's link stays usable
    assert "connection lost" not in proxy.log()


def test_a_poison_message_hurts_only_its_sender(proxy, rabbitmq_broker):
    _through(proxy, rabbitmq_broker, relay=False)


def test_a_poison_message_on_the_anonymous_relay_hurts_only_its_sender(proxy, rabbitmq_broker):
    _through(proxy, rabbitmq_broker, relay=True)


@pytest.mark.parametrize("body, what", [
    ([1, 2, 3], "an amqp-value body holding a list of 3 values"),
    (Array(UNDESCRIBED, Data.DOUBLE, 1.0, 2.0), "array of double elements"),
])
def test_each_refusal_names_what_and_the_upstream(proxy, rabbitmq_broker, body, what):
    if rabbitmq_broker.major >= 4:
        pytest.skip("RabbitMQ 4 takes these messages (the float-array case shows them forwarded unchanged)")
    poison_q, _ = _names()
    out = send_outcomes(proxy.url, poison_q, [Message(body=body), Message(body="then a good one")])
    kind, condition, description = out.outcomes[0]
    assert (kind, condition) == ("rejected", "amqp:not-implemented")
    assert what in description and "RabbitMQ 3.10" in description and "127.0.0.1:5672" in description
    assert out.outcomes[1][0] == "accepted"


def test_a_dropped_connection_names_the_clients_in_flight(rabbitmq3, caplog, monkeypatch):
    """Without the refusal (switched off here), RabbitMQ 3.10 drops the upstream connection on the
    float array: the log names the client whose publish was in flight (connection id, container id,
    address) and the reconnect is counted with cause `socket`."""
    from broker_filter.proxy import admission
    from tests.support.launcher import InProcessDaemon

    monkeypatch.setattr(admission, "refused", lambda upstream, data: None)
    caplog.set_level(logging.WARNING, logger="broker_filter.proxy.upstream")
    daemon = InProcessDaemon("--upstream", rabbitmq3.url, "--metrics", "127.0.0.1:0")
    try:
        up = daemon.app.upstream
        deadline = time.monotonic() + 30
        while not up.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert up.connected
        poison_q, _ = _names()
        container = f"poisoner-{uuid.uuid4().hex[:6]}"
        conn = connect(daemon.url, container_id=container)
        try:
            snd = sender(conn, poison_q)
            with pytest.raises(Exception):
                snd.send(_poison(), timeout=10)
        finally:
            try:
                conn.close()
            except Exception:
                pass
        counter = daemon.app.metrics.upstream_reconnects.labels(cause="socket")
        deadline = time.monotonic() + 30
        while counter._value.get() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counter._value.get() == 1
        lines = [r.getMessage() for r in caplog.records if "publishes in flight" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in caplog.records]
        assert f"address {poison_q} from client connection" in lines[0]
        assert f"container id '{container}'" in lines[0]
        assert "(socket:" in lines[0]
    finally:
        daemon.stop()
