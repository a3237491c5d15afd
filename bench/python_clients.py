"""Python (python-qpid-proton) clients and a daemon launcher shared by the benchmarks that measure
with them (broker_bench, fanout_bench, streaming_bench).

A producer process publishes N messages (64-byte body, application property `half` = 0/1, send time
`ts`) to `/topic/<name>`; a consumer process receives them, with a selector or keeping half = 1
itself.  `run_once` gives the stream's rate (N / first send .. last expected receive) and the
latency of the selected messages.  bench/proxy_bench.py measures with rhea clients instead, which
do not bound the direct rate.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CREDIT = 1000


def producer(url: str, address: str, count: int, rate: float | None, start_evt, out_q) -> None:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    body = b"x" * 64

    class Send(MessagingHandler):
        def __init__(self):
            super().__init__(auto_settle=True)
            self.sent = 0
            self.confirmed = 0
            self.t0 = None

        def on_start(self, event):
            self.conn = event.container.connect(url)
            self.sender = event.container.create_sender(self.conn, address)

        def on_sendable(self, event):
            if self.t0 is None:
                start_evt.wait()
                self.t0 = time.time()
                out_q.put(("t0", self.t0))
            self._send(event)

        def _send(self, event):
            s = self.sender
            while s.credit > 0 and self.sent < count:
                if rate and self.sent >= (time.time() - self.t0) * rate:
                    event.container.schedule(0.002, self)
                    return
                s.send(Message(body=body, properties={"half": self.sent % 2, "ts": time.time(), "i": self.sent}))
                self.sent += 1

        def on_timer_task(self, event):
            self._send(event)

        def on_accepted(self, event):
            self.confirmed += 1
            if self.confirmed == count:
                event.connection.close()

    Container(Send()).run()


def consumer(url: str, address: str, selector: str | None, expect: int, total: int, ready_evt, out_q) -> None:
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, Selector

    class Receive(MessagingHandler):
        def __init__(self):
            super().__init__(prefetch=CREDIT, auto_accept=True)
            self.seen = 0
            self.matched = 0
            self.latencies: list[float] = []

        def on_start(self, event):
            conn = event.container.connect(url)
            opts = Selector(selector) if selector else None
            event.container.create_receiver(conn, address, options=opts)

        def on_link_opened(self, event):
            if event.receiver:
                ready_evt.set()

        def on_message(self, event):
            now = time.time()
            m = event.message
            self.seen += 1
            if m.properties["half"] == 1:  # what a client without server-side filtering does itself
                self.matched += 1
                self.latencies.append(now - m.properties["ts"])
            if self.matched == expect:
                out_q.put(("done", now, self.seen, self.latencies))
                event.connection.close()

    Container(Receive()).run()


def run_once(direct_url: str, consume_url: str, selector: str | None, count: int, rate: float | None) -> dict:
    """One stream: the producer publishes to `direct_url`, the consumer receives from `consume_url`."""
    ctx = mp.get_context("spawn")
    address = f"/topic/bench-{uuid.uuid4().hex[:8]}"
    ready, start = ctx.Event(), ctx.Event()
    q = ctx.Queue()
    expect = count // 2
    c = ctx.Process(target=consumer, args=(consume_url, address, selector, expect, count, ready, q))
    c.start()
    if not ready.wait(30):
        c.kill()
        raise RuntimeError("consumer did not attach")
    time.sleep(0.3)
    p = ctx.Process(target=producer, args=(direct_url, address, count, rate, start, q))
    p.start()
    start.set()
    t0 = t1 = None
    seen = 0
    lat: list[float] = []
    deadline = time.time() + 600
    while t1 is None and time.time() < deadline:
        kind, *rest = q.get(timeout=600)
        if kind == "t0":
            t0 = rest[0]
        else:
            t1, seen, lat = rest
    p.join(60)
    c.join(60)
    for proc in (p, c):
        if proc.is_alive():
            proc.kill()
    if t0 is None:
        kind, t0 = q.get(timeout=10)
    elapsed = t1 - t0
    lat.sort()
    return {
        "rate": count / elapsed,
        "elapsed": elapsed,
        "received": seen,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


def start_proxy(upstream: str, profile: str | None) -> tuple[subprocess.Popen, int, Path]:
    log = Path(tempfile.mkstemp(prefix="proxy-bench-", suffix=".log")[1])
    cmd = [sys.executable]
    if profile:
        cmd += ["-m", "cProfile", "-o", profile]
    cmd += ["-m", "broker_filter", "serve", "--listen", "127.0.0.1:0", "--upstream", upstream, "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    # The listening port: WARNING level hides the INFO line, so ask the kernel.
    deadline = time.time() + 30
    while time.time() < deadline:
        port = _listening_port(proc.pid)
        if port:
            time.sleep(1.0)  # let the upstream connection come up
            return proc, port, log
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.2)
    raise RuntimeError("proxy did not start")


def _listening_port(pid: int) -> int | None:
    try:
        out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return None
    for line in out.splitlines():
        if f"pid={pid}," in line:
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            if m and m.group(1) != "5672":
                return int(m.group(1))
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
