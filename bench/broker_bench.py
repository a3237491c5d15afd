"""Embedded broker benchmark: produce -> consume throughput, and what a selective consumer costs as
the queue it selects from grows (1 k, 100 k, 1 M messages).

    .venv/bin/python bench/broker_bench.py [--depths 1000,100000,1000000] [--daemon-messages 5000]

Library figures drive `broker_filter.broker.Broker` directly (messages already decoded, as the
daemon stores them); the daemon figure sends and receives through `broker-filter serve` with the
embedded broker over loopback with python-qpid-proton clients.  Everything runs in one process
run, so the ratios between rows are what to compare across machines.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker_filter.broker import Broker, BrokerConfig  # noqa: E402
from broker_filter.filters import compile_selector  # noqa: E402
from broker_filter.message import Message, Properties  # noqa: E402


def fill(broker: Broker, address: str, depth: int) -> None:
    for i in range(depth):
        m = Message(properties=Properties(message_id=f"id-{i}"),
                    application_properties={"id": f"m{i}", "n": i, "color": ("red", "blue", "green")[i % 3]},
                    body=b"x" * 64)
        broker.publish(address, b"x" * 120, size=120, message=m)


def first_delivery(broker: Broker, address: str, selector: str) -> tuple[float, int, float]:
    """(seconds from attach to the first delivery, evaluations, seconds until dispatch is idle)."""
    t0 = time.perf_counter()
    c = broker.subscribe(address, filter=compile_selector(selector))
    broker.flow(c, 1)
    first = None
    while True:
        got, more = broker.dispatch()
        if got and first is None:
            first = time.perf_counter() - t0
        if not more:
            break
    idle = time.perf_counter() - t0
    for consumer, entry in got or []:
        broker.settle(consumer, entry, "released")
    evaluations = c.evaluations
    broker.close_consumer(c)
    return (first if first is not None else float("nan")), evaluations, idle


def library_throughput(n: int) -> tuple[float, float]:
    broker = Broker(BrokerConfig())
    msgs = [Message(application_properties={"n": i}, body=b"x" * 64) for i in range(n)]
    c = broker.subscribe("tp")
    broker.flow(c, n)
    t0 = time.perf_counter()
    for m in msgs:
        broker.publish("tp", b"x" * 120, size=120, message=m)
        for consumer, entry in broker.dispatch()[0]:
            broker.settle(consumer, entry, "accepted")
    plain = n / (time.perf_counter() - t0)
    broker = Broker(BrokerConfig())
    c = broker.subscribe("tp", filter=compile_selector("n >= 0"))
    broker.flow(c, n)
    t0 = time.perf_counter()
    for m in msgs:
        broker.publish("tp", b"x" * 120, size=120, message=m)
        for consumer, entry in broker.dispatch()[0]:
            broker.settle(consumer, entry, "accepted")
    return plain, n / (time.perf_counter() - t0)


def daemon_throughput(n: int) -> float:
    """Messages per second produced and consumed through the daemon (credit 500, one connection each)."""
    import re
    import tempfile

    from proton import Message as PMessage
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0",
                             "--set", "shutdown.grace_period=0"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        port = None
        for _ in range(600):
            m = re.search(r"listening on [^:\s]+:(\d+)", Path(log.name).read_text())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.05)
        if port is None:
            raise RuntimeError("daemon did not start: " + Path(log.name).read_text())
        url = f"amqp://127.0.0.1:{port}"

        class Both(MessagingHandler):
            def __init__(self):
                super().__init__(prefetch=500, auto_accept=True)
                self.sent = self.received = 0
                self.t0 = self.t1 = None

            def on_start(self, event):
                conn = event.container.connect(url)
                event.container.create_receiver(conn, "bench.tp")
                event.container.create_sender(event.container.connect(url), "bench.tp")
                self.t0 = time.perf_counter()

            def on_sendable(self, event):
                while event.sender.credit and self.sent < n:
                    event.sender.send(PMessage(body=b"x" * 64, properties={"n": self.sent}))
                    self.sent += 1

            def on_message(self, event):
                self.received += 1
                if self.received == n:
                    self.t1 = time.perf_counter()
                    event.container.stop()

        h = Both()
        Container(h).run()
        return n / (h.t1 - h.t0)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1000,100000,1000000")
    ap.add_argument("--throughput-messages", type=int, default=50_000)
    ap.add_argument("--daemon-messages", type=int, default=5_000)
    args = ap.parse_args()

    plain, selective = library_throughput(args.throughput_messages)
    print(f"library produce->consume: plain {plain:,.0f} msg/s, with a selector {selective:,.0f} msg/s")
    if args.daemon_messages:
        rate = daemon_throughput(args.daemon_messages)
        print(f"daemon produce->consume over loopback: {rate:,.0f} msg/s ({args.daemon_messages} messages)")

    print()
    print("| depth | selector | first delivery | evaluations | dispatch idle after |")
    print("|---:|---|---:|---:|---:|")
    for depth in [int(d) for d in args.depths.split(",")]:
        broker = Broker(BrokerConfig())
        t0 = time.perf_counter()
        fill(broker, "deep", depth)
        fill_s = time.perf_counter() - t0
        last = depth - 1
        cases = [
            (f"id = 'm{last}'", "equality index kept by another consumer"),
            (f"id = 'm{last}' AND color <> 'x'", "same index, extra conjunct"),
            (f"n = {last}", "new index: scans while the index builds"),
            (f"n >= {last}", "scan"),
            (f"id LIKE 'm{last}'", "scan"),
        ]
        keep = broker.subscribe("deep", filter=compile_selector("id = 'none'"))  # keeps the id index alive
        broker.flow(keep, 0)
        while broker.dispatch()[1]:
            pass
        for sel, how in cases:
            first, evals, idle = first_delivery(broker, "deep", sel)
            print(f"| {depth:,} | `{sel}` ({how}) | {first * 1000:,.1f} ms | {evals:,} | {idle * 1000:,.1f} ms |")
        print(f"<!-- filled {depth:,} in {fill_s:.1f} s -->")
        broker.close_consumer(keep)
        del broker


if __name__ == "__main__":
    main()
