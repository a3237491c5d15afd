"""Small python-qpid-proton clients for the tests: connections and links, sending, receiving, and
RabbitMQ 4's management requests.

Receiving, one meaning per name:
- `receive_n(receiver, n)`: exactly n messages; raises proton.Timeout when one is late.
- `receive_until_quiet(receiver, at_most=None)`: messages until `at_most` arrived, none came for
  `idle` seconds, or `limit` passed; never raises for lateness.
- `receive_n_and_extras(receiver, n)`: the next n (waiting up to `limit`) plus any that arrive within
  `extra_wait` after them, so a comparison of the whole list fails on an extra one.
- `receive_from_each(receivers)`: `receive_until_quiet` over several receivers in turn.
- `receives_nothing(receiver, wait)`: True if no message arrives within `wait` seconds.
- `drain(url, address)`: on a connection of its own, everything left at the address (accepted).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from proton import Data, Delivery, Link, Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption, Selector
from proton.utils import BlockingConnection

JS = Path(__file__).resolve().parents[1] / "js"


# ----------------------------------------------------------------------------- connections and links
def connect(url: str, container_id: str | None = None, **kwargs) -> BlockingConnection:
    container = None
    if container_id is not None:
        container = Container()
        container.container_id = container_id
    return BlockingConnection(url, timeout=10, container=container, **kwargs)


def link_name() -> str:
    return f"link-{uuid.uuid4().hex[:8]}"


class Capabilities(LinkOption):
    """Source (receiver) or target (sender) capabilities, as Qpid JMS sends them."""

    def __init__(self, *caps: str, target: bool = False):
        self.caps = caps
        self.target = target

    def apply(self, link) -> None:
        terminus = link.target if self.target else link.source
        terminus.capabilities.put_array(False, Data.SYMBOL)
        terminus.capabilities.enter()
        for c in self.caps:
            terminus.capabilities.put_symbol(symbol(c))
        terminus.capabilities.exit()


def receiver(conn: BlockingConnection, address: str, credit: int = 10, selector: str | None = None, caps=(), **kw):
    """A receiver with a fresh link name, an optional selector and source capabilities."""
    options = []
    if selector is not None:
        options.append(Selector(selector))
    if caps:
        options.append(Capabilities(*caps))
    return conn.create_receiver(address, credit=credit, name=kw.pop("link_name", None) or link_name(),
                                options=options or None, **kw)


def sender(conn: BlockingConnection, address: str):
    return conn.create_sender(address, name=link_name())


# ----------------------------------------------------------------------------- sending
def send_bodies(snd, *bodies, **props) -> None:
    """One message per body, each with the application properties `props`."""
    for b in bodies:
        snd.send(Message(body=b, properties=dict(props) or None))


def send_messages(snd, messages) -> None:
    """Each of `messages`: a proton Message, or the keyword arguments of one."""
    for m in messages:
        snd.send(m if isinstance(m, Message) else Message(**m))


OUTCOMES = {Delivery.ACCEPTED: "accepted", Delivery.RELEASED: "released", Delivery.REJECTED: "rejected",
            Delivery.MODIFIED: "modified"}


def send_outcomes(snd, messages) -> list[str]:
    """Send each message on `snd` and return the outcome it got ("accepted", "released", ...),
    without raising on a refusal."""
    return [OUTCOMES.get(snd.send(m if isinstance(m, Message) else Message(**m), error_states=[]).remote_state, "none")
            for m in messages]


class _Publish(MessagingHandler):
    """Sends `messages` pipelined as credit allows; records each outcome and its error condition."""

    def __init__(self, url: str, address: str, messages: list, timeout: float):
        super().__init__(auto_settle=True)
        self.url, self.address, self.messages, self.timeout = url, address, messages, timeout
        self.results: dict[int, tuple[str, str | None]] = {}
        self.sent = 0

    def on_start(self, event):
        self.conn = event.container.connect(self.url)
        event.container.create_sender(self.conn, self.address)
        self.timer = event.container.schedule(self.timeout, self)

    def on_timer_task(self, event):
        self.conn.close()

    def on_sendable(self, event):
        while event.sender.credit and self.sent < len(self.messages):
            m = self.messages[self.sent]
            event.sender.send(m if isinstance(m, Message) else Message(body=m)).index = self.sent
            self.sent += 1

    def _outcome(self, event, name: str) -> None:
        cond = event.delivery.remote.condition
        self.results[event.delivery.index] = (name, cond.name if cond is not None else None)
        if len(self.results) == len(self.messages):
            self.timer.cancel()
            event.connection.close()

    def on_accepted(self, event):
        self._outcome(event, "accepted")

    def on_rejected(self, event):
        self._outcome(event, "rejected")

    def on_released(self, event):
        self._outcome(event, "released")


def publish_outcomes(url: str, address: str, messages, timeout: float = 10.0) -> list:
    """On a connection of its own, send each message (a Message, or a body) and return
    [(outcome, error condition or None)] in order (None for one without an outcome in `timeout`)."""
    handler = _Publish(url, address, list(messages), timeout)
    Container(handler).run()
    return [handler.results.get(i) for i in range(handler.sent)]


def publish_many(url: str, address: str, messages: list, timeout: float = 120.0) -> None:
    """Publish every message (pipelined, as fast as the broker grants credit) on a connection of its
    own and wait until the broker accepted all of them."""
    outcomes = publish_outcomes(url, address, messages, timeout)
    refused = [o for o in outcomes if o is not None and o[0] != "accepted"]
    assert not refused, f"the broker refused messages: {refused[:5]}"
    confirmed = sum(1 for o in outcomes if o is not None)
    assert confirmed == len(messages), (confirmed, len(messages))


# ----------------------------------------------------------------------------- receiving
def send_at_least_once(snd, message, timeout: float = 30.0) -> int:
    """Send `message`, again each time it comes back `released` (as an at-least-once producer does
    while the daemon's upstream reconnects); how many times it was released."""
    from proton.utils import SendException

    released = 0
    deadline = time.monotonic() + timeout
    while True:
        try:
            snd.send(message, timeout=max(1.0, deadline - time.monotonic()))
            return released
        except SendException as e:
            if e.state != Delivery.RELEASED or time.monotonic() > deadline:
                raise
            released += 1
            time.sleep(0.05)


def bodies(messages) -> list:
    return [m.body for m in messages]


def _timed_out(e: Exception) -> bool:
    return type(e).__name__ == "Timeout"


def receive_n(rcv, n: int, timeout: float = 5.0, accept: bool = True) -> list[Message]:
    """Exactly `n` messages; raises proton.Timeout when one does not come within `timeout` seconds."""
    out = []
    for _ in range(n):
        out.append(rcv.receive(timeout=timeout))
        if accept:
            rcv.accept()
    return out


def receive_until_quiet(rcv, at_most: int | None = None, idle: float = 1.0, limit: float = 20.0,
                        accept: bool = True) -> list[Message]:
    """Messages until `at_most` arrived, or none came for `idle` seconds, or `limit` passed."""
    out = []
    deadline = time.monotonic() + limit
    while (at_most is None or len(out) < at_most) and time.monotonic() < deadline:
        try:
            m = rcv.receive(timeout=idle)
        except Exception as e:
            if _timed_out(e):
                break
            raise
        out.append(m)
        if accept:
            rcv.accept()
    return out


def receive_n_and_extras(rcv, n: int, extra_wait: float = 0.3, accept: bool = True, limit: float = 30.0) -> list:
    """The next `n` messages (waiting as long as `limit` for them), plus any that arrive within
    `extra_wait` after them: a test compares the whole list, so an unexpected extra one fails it."""
    out = receive_until_quiet(rcv, at_most=n, idle=limit, limit=limit, accept=accept)
    if len(out) == n:
        out += receive_until_quiet(rcv, idle=extra_wait, limit=extra_wait + 1, accept=accept)
    return out


def receive_from_each(receivers: dict, idle_rounds: int = 5, wait: float = 0.3, limit: float = 60.0,
                      expect: int | None = None) -> dict:
    """Receive (and accept) from several receivers in turn until `expect` messages arrived in all, or
    none got anything for `idle_rounds` rounds."""
    got = {name: [] for name in receivers}
    quiet = 0
    deadline = time.monotonic() + limit
    while quiet < idle_rounds and time.monotonic() < deadline:
        if expect is not None and sum(len(v) for v in got.values()) >= expect:
            break
        progress = False
        for name, r in receivers.items():
            batch = receive_until_quiet(r, idle=wait, limit=5.0)
            got[name].extend(batch)
            progress = progress or bool(batch)
        quiet = 0 if progress else quiet + 1
    return got


def receives_nothing(rcv, wait: float = 0.5) -> bool:
    """True if no message arrives within `wait` seconds."""
    try:
        rcv.receive(timeout=wait)
    except Exception as e:
        if _timed_out(e):
            return True
        raise
    return False


# A drain runs right after a daemon stopped, when RabbitMQ 3.10 may still be taking back what that
# daemon held (50,000 messages deep and 5,000 in flight in test_custody): its attach may wait a while.
ATTACH_TIMEOUT = 60.0


class _Drain(MessagingHandler):
    def __init__(self, url: str, address: str, idle: float, limit: float, credit: int, key):
        super().__init__(prefetch=credit, auto_accept=True)
        self.url, self.address, self.idle, self.key = url, address, idle, key
        self.deadline = time.monotonic() + limit
        self.attach_deadline = time.monotonic() + ATTACH_TIMEOUT
        self.got: list = []
        self.last: float | None = None  # when the receiver attached, then when the last message came
        self.error: str | None = None

    def on_start(self, event):
        self.container = event.container
        self.conn = event.container.connect(self.url)
        event.container.create_receiver(self.conn, self.address)
        event.container.schedule(self.idle, self)

    def on_link_opened(self, event):
        self.last = time.monotonic()

    def on_link_error(self, event):
        self.error = f"the receiver was detached: {event.link.remote_condition}"
        self.conn.close()

    def on_timer_task(self, event):
        now = time.monotonic()
        quiet_until = now + self.idle if self.last is None else self.last + self.idle
        if self.error is not None:
            return
        if self.last is None and now >= self.attach_deadline:
            self.error = f"no answer to the attach within {ATTACH_TIMEOUT:.0f} s"
            self.conn.close()
            return
        if now >= self.deadline or (self.last is not None and now >= quiet_until):
            self.conn.close()  # closed, not abandoned: the broker must not keep a consumer with credit
        else:
            self.container.schedule(min(quiet_until, self.deadline) - now, self)

    def on_message(self, event):
        self.got.append(self.key(event.message))
        self.last = time.monotonic()


def drain(url: str, address: str, idle: float = 2.0, limit: float = 300.0, credit: int = 1000,
          key=lambda m: m) -> list:
    """On a connection of its own: key(message) of every message left at `address` (accepted, so
    consumed), until none came for `idle` seconds after the receiver attached, or `limit` passed."""
    handler = _Drain(url, address, idle, limit, credit, key)
    Container(handler).run()
    if handler.error is not None:
        raise RuntimeError(f"draining {address} at {url}: {handler.error}")
    return handler.got


def filtered_round_trip(url: str) -> list[str]:
    """Through the daemon at `url`: a receiver with the selector `color = 'red'` on a fresh queue, a
    blue and a red message sent; returns the bodies the receiver got (the red one only, if it filters)."""
    address = f"install-{uuid.uuid4().hex[:8]}"
    conn = BlockingConnection(url, timeout=20)
    try:
        rcv = conn.create_receiver(address, options=Selector("color = 'red'"), credit=10)
        snd = conn.create_sender(address)
        for color in ("blue", "red"):
            snd.send(Message(body=color, properties={"color": color}))
        return bodies(receive_n_and_extras(rcv, 1, extra_wait=3, limit=20))
    finally:
        conn.close()


# ----------------------------------------------------------------------------- RabbitMQ 4 management
class _Paired:
    """Link option for one half of RabbitMQ 4's management link pair (HTTP over AMQP 1.0)."""

    def apply(self, link) -> None:
        link.properties = {symbol("paired"): True}
        link.snd_settle_mode = Link.SND_SETTLED

    def test(self, link) -> bool:
        return True


class _Request(Message):
    """A management request whose body may be null.  RabbitMQ 4.0 reads a DELETE's body as an
    amqp-value holding null (`rabbit_amqp_management:handle_http_req(<<"DELETE">>, ..., null, ...)`;
    a request without a body section fails there with function_clause and is never answered).
    RabbitMQ's own client sends `Message(body=None)` through a Qpid Proton whose encoder writes that
    null section when a message has no body; this one writes no body section, so it is added."""

    NULL_BODY = b"\x00\x53\x77\x40"  # described amqp-value (0x77), null

    def encode(self) -> bytes:
        data = super().encode()
        return data + self.NULL_BODY if self.body is None else data


def _management(url: str, subject: str, to: str, body, absent: str | None = None) -> str:
    """One request over RabbitMQ 4's `/management` link pair (HTTP over AMQP 1.0, what its own
    clients use to declare queues and bindings); returns the response status, a 2xx one or
    `absent` ("404" when a missing node is an answer)."""
    conn = connect(url)
    try:
        requests = conn.create_sender("/management", name="management-link-pair", options=_Paired())
        replies = conn.create_receiver("/management", name="management-link-pair", options=_Paired(), credit=1)
        requests.send(_Request(id=f"{subject} {to}", address=to, subject=subject, reply_to="$me", body=body))
        reply = replies.receive(timeout=10)
        if not str(reply.subject).startswith("2") and str(reply.subject) != absent:
            raise RuntimeError(f"RabbitMQ management {subject} {to} failed: {reply.subject} {reply.body}")
        return str(reply.subject)
    finally:
        conn.close()


def declare_queue(url: str, name: str, queue_type: str = "classic", expires: bool = True) -> str:
    """Declare a durable queue on RabbitMQ 4 (v2 addresses need the queue to exist); it expires after
    ten minutes unused, so test runs leave nothing behind (unless `expires` is false: delete it)."""
    arguments = {"x-queue-type": queue_type}
    if queue_type != "stream" and expires:  # a stream takes no x-expires: delete it when done
        arguments["x-expires"] = 600_000
    return _management(url, "PUT", _queue_path(name), {"durable": True, "arguments": arguments})


def delete_queue(url: str, name: str) -> str:
    """Delete a queue on RabbitMQ 4 (a stream, which takes no x-expires, when a test is done with it)."""
    return _management(url, "DELETE", _queue_path(name), None)


def queue_exists(url: str, name: str) -> bool:
    """Whether RabbitMQ 4 has the queue (GET /queues/{name}: 200, or 404)."""
    return _management(url, "GET", _queue_path(name), None, absent="404") != "404"


def _queue_path(name: str) -> str:
    from urllib.parse import quote

    return f"/queues/{quote(name, safe='')}"


def bind_queue(url: str, queue: str, exchange: str, key: str) -> str:
    """Bind a queue to an exchange with a binding key on RabbitMQ 4."""
    return _management(url, "POST", "/bindings",
                       {"source": exchange, "destination_queue": queue, "binding_key": key, "arguments": {}})


# ----------------------------------------------------------------------------- rhea (node) clients
def run_js(script: str, *args: str, timeout: float = 30) -> list[dict]:
    """Run a rhea client of tests/js (node and rhea come from scripts/setup.sh); its JSON lines."""
    import pytest

    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "rhea").is_dir():
        pytest.fail("node and rhea are required (scripts/setup.sh installs them)")
    p = subprocess.run([node, str(JS / script), *args], capture_output=True, text=True, timeout=timeout)
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def rhea_publish_regions(port: int, queue: str, n: int = 10) -> None:
    """rhea publishes m0..m<n-1>: subject "eu.<i>" for odd i, "us.<i>" for even, total = i * 10."""
    batch = [{"body": f"m{i}", "subject": ("eu." if i % 2 else "us.") + str(i),
              "application_properties": {"total": i * 10}} for i in range(n)]
    assert run_js("send.js", str(port), queue, json.dumps(batch)) == [{"accepted": n, "other": []}]
