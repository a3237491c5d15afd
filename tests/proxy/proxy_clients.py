"""Small blocking proton clients for the proxy tests."""

from __future__ import annotations

import re
import socket
import time
import urllib.request

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter
from proton.utils import BlockingConnection


def connect(url: str) -> BlockingConnection:
    return BlockingConnection(url, timeout=10)


def receive(receiver, count: int | None = None, idle: float = 1.0, limit: float = 20.0, accept: bool = True) -> list:
    """Messages until `count` arrived, or none came for `idle` seconds, or `limit` passed."""
    out = []
    deadline = time.monotonic() + limit
    while (count is None or len(out) < count) and time.monotonic() < deadline:
        try:
            m = receiver.receive(timeout=idle)
        except Exception as e:
            if type(e).__name__ == "Timeout":
                break
            raise
        out.append(m)
        if accept:
            receiver.accept()
    return out


def take(receiver, n: int, extra_wait: float = 0.3, accept: bool = True, limit: float = 30.0) -> list:
    """The next `n` messages (waiting as long as `limit` for them), plus any that arrive within
    `extra_wait` after them: a test compares the whole list, so an unexpected extra one fails it."""
    out = receive(receiver, count=n, idle=limit, limit=limit, accept=accept)
    if len(out) == n:
        out += receive(receiver, idle=extra_wait, limit=extra_wait + 1, accept=accept)
    return out


def send(sender, messages) -> None:
    for m in messages:
        sender.send(m if isinstance(m, Message) else Message(**m))


def send_outcomes(sender, messages) -> list[str]:
    """Send each message and return the outcome the proxy gave it ("accepted", "released", ...),
    without raising on a refusal."""
    from proton import Delivery

    names = {Delivery.ACCEPTED: "accepted", Delivery.RELEASED: "released", Delivery.REJECTED: "rejected",
             Delivery.MODIFIED: "modified"}
    return [names.get(sender.send(m if isinstance(m, Message) else Message(**m), error_states=[]).remote_state, "none")
            for m in messages]


def filter_option(filters: dict) -> Filter:
    """A receiver option putting `filters` (key -> proton Described) in the source filter-set."""
    return Filter(filters)


def receive_all(receivers: dict, idle_rounds: int = 5, wait: float = 0.3, limit: float = 60.0,
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
            batch = receive(r, idle=wait, limit=5.0)
            got[name].extend(batch)
            progress = progress or bool(batch)
        quiet = 0 if progress else quiet + 1
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def value(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + ("{" + want if want else "")):
            if not want or re.match(re.escape(name) + r"\{" + re.escape(want) + r"[,}]", line):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class _Paired:
    """Link option for one half of RabbitMQ 4's management link pair (HTTP over AMQP 1.0)."""

    def apply(self, link) -> None:
        from proton import Link, symbol

        link.properties = {symbol("paired"): True}
        link.snd_settle_mode = Link.SND_SETTLED

    def test(self, link) -> bool:
        return True


def _management(url: str, subject: str, to: str, body) -> str:
    """One request over RabbitMQ 4's `/management` link pair (HTTP over AMQP 1.0, what its own
    clients use to declare queues and bindings); returns the response status."""
    conn = connect(url)
    try:
        requests = conn.create_sender("/management", name="management-link-pair", options=_Paired())
        replies = conn.create_receiver("/management", name="management-link-pair", options=_Paired(), credit=1)
        requests.send(Message(id=f"{subject} {to}", address=to, subject=subject, reply_to="$me", body=body))
        reply = replies.receive(timeout=10)
        if not str(reply.subject).startswith("2"):
            raise RuntimeError(f"RabbitMQ management {subject} {to} failed: {reply.subject} {reply.body}")
        return str(reply.subject)
    finally:
        conn.close()


def declare_queue(url: str, name: str, queue_type: str = "classic") -> str:
    """Declare a durable queue on RabbitMQ 4 (v2 addresses need the queue to exist); it expires after
    ten minutes unused, so test runs leave nothing behind."""
    from urllib.parse import quote

    arguments = {"x-queue-type": queue_type}
    if queue_type != "stream":  # a stream takes no x-expires: delete it when done
        arguments["x-expires"] = 600_000
    return _management(url, "PUT", f"/queues/{quote(name, safe='')}", {"durable": True, "arguments": arguments})


def bind_queue(url: str, queue: str, exchange: str, key: str) -> str:
    """Bind a queue to an exchange with a binding key on RabbitMQ 4."""
    return _management(url, "POST", "/bindings",
                       {"source": exchange, "destination_queue": queue, "binding_key": key, "arguments": {}})


class _Publish(MessagingHandler):
    def __init__(self, url: str, address: str, messages: list):
        super().__init__(auto_settle=True)
        self.url, self.address, self.messages = url, address, messages
        self.sent = self.confirmed = 0

    def on_start(self, event):
        conn = event.container.connect(self.url)
        event.container.create_sender(conn, self.address)

    def on_sendable(self, event):
        sender = event.sender
        while sender.credit and self.sent < len(self.messages):
            sender.send(self.messages[self.sent])
            self.sent += 1

    def on_accepted(self, event):
        self.confirmed += 1
        if self.confirmed == len(self.messages):
            event.connection.close()

    def on_rejected(self, event):
        raise AssertionError(f"the broker rejected a message: {event.delivery.remote.condition}")


def publish_many(url: str, address: str, messages: list, timeout: float = 120.0) -> None:
    """Publish every message (pipelined, as fast as the broker grants credit) and wait until the
    broker accepted all of them."""
    handler = _Publish(url, address, messages)
    c = Container(handler)
    c.timeout = timeout
    c.run()
    assert handler.confirmed == len(messages), (handler.confirmed, len(messages))


class _Drain(MessagingHandler):
    def __init__(self, url: str, address: str, idle: float, credit: int, key):
        super().__init__(prefetch=credit, auto_accept=True)
        self.url, self.address, self.idle, self.key = url, address, idle, key
        self.bodies: list = []
        self._timer = None

    def on_start(self, event):
        self.container = event.container
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address)
        self._arm()

    def _arm(self):
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.container.schedule(self.idle, self)

    def on_timer_task(self, event):
        self.container.stop()

    def on_message(self, event):
        self.bodies.append(self.key(event.message))
        if len(self.bodies) % 100 == 0:
            self._arm()
        elif len(self.bodies) % 100 == 1:
            self._arm()


def drain(url: str, address: str, idle: float = 2.0, credit: int = 1000, key=lambda m: m.body) -> list:
    """key(message) of every message left at `address` (accepted, so consumed), until none came for
    `idle` seconds."""
    handler = _Drain(url, address, idle, credit, key)
    Container(handler).run()
    return handler.bodies


def run_js(script: str, *args: str, timeout: float = 30) -> list[dict]:
    """Run a rhea client of tests/js (node and rhea come from scripts/setup.sh); its JSON lines."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    js = Path(__file__).resolve().parents[1] / "js"
    node = shutil.which("node")
    if node is None or not (js / "node_modules" / "rhea").is_dir():
        pytest.fail("node and rhea are required (scripts/setup.sh installs them)")
    p = subprocess.run([node, str(js / script), *args], capture_output=True, text=True, timeout=timeout)
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def rhea_publish_regions(port: int, queue: str, n: int = 10) -> None:
    """rhea publishes m0..m<n-1>: subject "eu.<i>" for odd i, "us.<i>" for even, total = i * 10."""
    import json

    batch = [{"body": f"m{i}", "subject": ("eu." if i % 2 else "us.") + str(i),
              "application_properties": {"total": i * 10}} for i in range(n)]
    assert run_js("send.js", str(port), queue, json.dumps(batch)) == [{"accepted": n, "other": []}]
