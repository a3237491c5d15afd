"""Direct RabbitMQ vs through the proxy, same Python client, same run.

A producer process publishes N messages (64-byte body, application property `half` = 0/1, send time
`ts`) to `/topic/<name>` on RabbitMQ; a consumer process receives them
  * direct:   from RabbitMQ, every message, and keeps those with half = 1 itself;
  * proxied:  through `broker-filter serve`, with the selector `half = 1` (the proxy drops the rest).
Throughput is N / (first send .. last expected receive) in both cases (messages/s of the stream being
filtered); latency is receive time - `ts` of selected messages in a separate, rate-limited run.

    python bench/proxy_bench.py [--upstream amqp://guest:guest@127.0.0.1:5672] [--messages 20000]
                                [--latency-messages 3000 --rate 1000] [--repeat 2] [--profile out.prof]

Needs a RabbitMQ with AMQP 1.0 on the upstream URL (tests/proxy/conftest.py shows how to start one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", default="amqp://guest:guest@127.0.0.1:5672")
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--latency-messages", type=int, default=1500)
    ap.add_argument("--rate", default="300",
                    help="msg/s of the latency runs (well below saturation), or 'half': half the lower of the "
                         "direct and proxied throughput measured in the same run")
    ap.add_argument("--repeat", type=int, default=2, help="throughput runs per side (best is kept)")
    ap.add_argument("--profile", metavar="FILE", help="run the proxy under cProfile and write stats here")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--both-ways", action="store_true",
                    help="also measure publishing through the proxy (producer and consumer both proxied)")
    args = ap.parse_args()

    proc, port, log = start_proxy(args.upstream, args.profile)
    proxied_url = f"amqp://127.0.0.1:{port}"
    sel = "half = 1"
    try:
        direct, proxied = [], []
        proxy_cpu = 0.0
        for _ in range(args.repeat):  # interleaved, so both sides see the same machine load
            direct.append(run_once(args.upstream, args.upstream, None, args.messages, None))
            before = cpu_seconds(proc.pid)
            proxied.append(run_once(args.upstream, proxied_url, sel, args.messages, None))
            proxy_cpu += cpu_seconds(proc.pid) - before
        both = [run_once(proxied_url, proxied_url, sel, args.messages, None)
                for _ in range(args.repeat)] if args.both_ways else []
        d = max(direct, key=lambda r: r["rate"])
        p = max(proxied, key=lambda r: r["rate"])
        if args.rate == "half":
            args.rate = round(min(d["rate"], p["rate"]) / 2)
        args.rate = float(args.rate)
        dl = run_once(args.upstream, args.upstream, None, args.latency_messages, args.rate)
        pl = run_once(args.upstream, proxied_url, sel, args.latency_messages, args.rate)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    result = {
        "messages": args.messages,
        "direct_msgs_per_s": round(d["rate"]),
        "proxied_msgs_per_s": round(p["rate"]),
        "ratio": round(p["rate"] / d["rate"], 3),
        "proxy_cpu_us_per_message": round(1e6 * proxy_cpu / (args.messages * args.repeat), 1),
        "direct_runs": [round(r["rate"]) for r in direct],
        "proxied_runs": [round(r["rate"]) for r in proxied],
        "both_ways_msgs_per_s": round(max(r["rate"] for r in both)) if both else None,
        "both_ways_runs": [round(r["rate"]) for r in both],
        "latency_rate": args.rate,
        "direct_p50_ms": round(dl["p50_ms"], 2),
        "direct_p99_ms": round(dl["p99_ms"], 2),
        "proxied_p50_ms": round(pl["p50_ms"], 2),
        "proxied_p99_ms": round(pl["p99_ms"], 2),
        "added_p50_ms": round(pl["p50_ms"] - dl["p50_ms"], 2),
        "added_p99_ms": round(pl["p99_ms"] - dl["p99_ms"], 2),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"stream of {args.messages} messages, selector {sel!r} selects half")
        print(f"  direct   {result['direct_msgs_per_s']:>8} msg/s   runs {result['direct_runs']}")
        print(f"  proxied  {result['proxied_msgs_per_s']:>8} msg/s   runs {result['proxied_runs']}")
        print(f"  ratio    {result['ratio']:>8}x   (target >= 0.5)")
        if both:
            print(f"  publishing through the proxy too: {result['both_ways_msgs_per_s']} msg/s "
                  f"({round(result['both_ways_msgs_per_s'] / result['direct_msgs_per_s'], 3)}x direct), "
                  f"runs {result['both_ways_runs']}")
        print(f"  proxy CPU per upstream message: {result['proxy_cpu_us_per_message']} µs "
              f"(half of them forwarded to the client)")
        print(f"latency at {args.rate:g} msg/s: direct p50 {result['direct_p50_ms']} ms p99 {result['direct_p99_ms']} ms; "
              f"proxied p50 {result['proxied_p50_ms']} ms p99 {result['proxied_p99_ms']} ms; "
              f"added p50 {result['added_p50_ms']} ms p99 {result['added_p99_ms']} ms")
    if args.profile:
        import pstats

        print(f"\nproxy profile ({args.profile}), top by own time:")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
