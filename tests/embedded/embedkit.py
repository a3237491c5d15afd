"""`broker-filter serve` subprocesses on free ports and small blocking proton clients."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from proton import Data, Message, symbol
from proton.reactor import Container, LinkOption, Selector
from proton.utils import BlockingConnection

ROOT = Path(__file__).resolve().parents[2]


class Daemon:
    """`broker-filter serve --listen 127.0.0.1:0 [args]`: the embedded broker unless --upstream is given."""

    def __init__(self, *args: str, ready: str = ""):
        self.ready = ready  # log text that must also appear before the daemon counts as started
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"broker-filter-embedded-{uuid.uuid4().hex[:8]}.log"
        self._log = open(self.log_path, "w+")
        cmd = [sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0", *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.port = self._wait_port()
        self.url = f"amqp://127.0.0.1:{self.port}"

    def _wait_port(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"listening on [^:\s]+:(\d+)", self.log())
            if m and self.ready in self.log():
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"daemon did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


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


def connect(url: str, container_id: str | None = None) -> BlockingConnection:
    container = None
    if container_id is not None:
        container = Container()
        container.container_id = container_id
    return BlockingConnection(url, timeout=10, container=container)


def name() -> str:
    return f"link-{uuid.uuid4().hex[:8]}"


def receiver(conn: BlockingConnection, address: str, credit: int = 10, selector: str | None = None, caps=(), **kw):
    options = []
    if selector is not None:
        options.append(Selector(selector))
    if caps:
        options.append(Capabilities(*caps))
    return conn.create_receiver(address, credit=credit, name=kw.pop("link_name", None) or name(),
                                options=options or None, **kw)


def sender(conn: BlockingConnection, address: str):
    return conn.create_sender(address, name=name())


def send(snd, *bodies, **props) -> None:
    for b in bodies:
        snd.send(Message(body=b, properties=dict(props) or None))


def receive(rcv, count: int, timeout: float = 5.0, accept: bool = True) -> list:
    """Exactly `count` bodies (fails on timeout)."""
    out = []
    for _ in range(count):
        m = rcv.receive(timeout=timeout)
        out.append(m.body)
        if accept:
            rcv.accept()
    return out


def nothing(rcv, wait: float = 0.5) -> bool:
    """True if no message arrives within `wait` seconds."""
    try:
        rcv.receive(timeout=wait)
    except Exception as e:
        if type(e).__name__ == "Timeout":
            return True
        raise
    return False


def send_outcomes(url: str, address: str, bodies, timeout: float = 10.0) -> list:
    """Send each body and return [(outcome name, error condition or None)] in order."""
    from proton.handlers import MessagingHandler

    class Sender(MessagingHandler):
        def __init__(self):
            super().__init__()
            self.todo = list(bodies)
            self.results = {}
            self.sent = 0

        def on_start(self, event):
            self.conn = event.container.connect(url)
            event.container.create_sender(self.conn, address)
            self.timer = event.container.schedule(timeout, self)

        def on_timer_task(self, event):
            self.conn.close()

        def on_sendable(self, event):
            while event.sender.credit and self.todo:
                dlv = event.sender.send(Message(body=self.todo.pop(0)))
                dlv.index = self.sent
                self.sent += 1

        def _done(self, event, name):
            cond = event.delivery.remote.condition
            self.results[event.delivery.index] = (name, cond.name if cond is not None else None)
            if not self.todo and len(self.results) == self.sent:
                self.timer.cancel()
                event.connection.close()

        def on_accepted(self, event):
            self._done(event, "accepted")

        def on_rejected(self, event):
            self._done(event, "rejected")

        def on_released(self, event):
            self._done(event, "released")

    h = Sender()
    Container(h).run()
    return [h.results.get(i) for i in range(h.sent)]


class InProcessDaemon:
    """The daemon (`broker_filter.app.App`) on a thread of this process, so tests can read its
    embedded broker's counters."""

    def __init__(self, *args: str):
        import argparse
        import threading

        from broker_filter.app import App
        from broker_filter.config import add_serve_arguments, load

        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        self.app = App(load(parser.parse_args(["--listen", "127.0.0.1:0", *args]), environ={}))
        self.app.start()
        self.port = self.app.port
        self.url = f"amqp://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.app.run, name="embedded-daemon", daemon=True)
        self.thread.start()

    @property
    def broker(self):
        return self.app.upstream.broker

    def stop(self) -> None:
        self.app.container.stop()
        self.thread.join(10)
