"""Embedded broker benchmark: produce -> consume throughput, and what a selective consumer costs as
the queue it selects from grows (1 k, 100 k, 1 M messages).

    .venv/bin/python bench/broker_bench.py [--depths 1000,100000,1000000] [--daemon-messages 10000]
                                           [--daemon-repeat 3] [--latency-messages 1500 --rate 300]

Library figures drive `broker_filter.broker.Broker` directly (messages already decoded, as the
daemon stores them); the daemon figures send and receive through `broker-filter serve` with the
embedded broker over loopback, with a python-qpid-proton producer and consumer in processes of
their own, once with the product's event loop and once with the former zero-delay-timer loop.  Everything runs in one process
run, so the ratios between rows are what to compare across machines.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker_filter.broker import Broker, BrokerConfig  # noqa: E402
from broker_filter.filters import compile_selector  # noqa: E402
from broker_filter.amqp.message import Message, Properties  # noqa: E402


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


class TimerLoop:
    """Baseline for comparison only: the proxy's former loop, which ran `call_soon` work on a
    zero-delay timer (so after the next poll and the socket reads that follow it)."""

    def __init__(self, container):
        from collections import deque

        self.container = container
        self.engine = container.loop
        self._soon = deque()
        self._scheduled = False

    def call_soon(self, fn):
        self._soon.append(fn)
        if not self._scheduled:
            self._scheduled = True
            self.engine.call_later(0, self._run)

    def _run(self):
        self._scheduled = False
        for _ in range(len(self._soon)):
            fn = self._soon.popleft()
            try:
                fn()
            except Exception:  # noqa: BLE001 - as the product's loop: log, go on
                logging.getLogger("broker_filter.proxy").exception("callback %r failed", fn)
        if self._soon and not self._scheduled:
            self._scheduled = True
            self.engine.call_later(0, self._run)

    def call_later(self, delay, fn):
        return self.engine.call_later(max(0.0, delay), fn)


def serve_with_timer_loop(argv: list[str]) -> int:
    """`broker-filter serve` with `TimerLoop` in place of the product's loop (bench use only)."""
    import broker_filter.app as app
    from broker_filter.cli import main as cli_main

    app.EngineLoop = TimerLoop
    return cli_main(["serve", *argv])


def start_daemon(loop: str) -> tuple[subprocess.Popen, str]:
    """An embedded `broker-filter serve` on a free port; loop "product" (`EngineLoop`) or "timer" (`TimerLoop`)."""
    import re
    import tempfile

    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    args = ["--listen", "127.0.0.1:0", "--set", "shutdown.grace_period=0"]
    if loop == "timer":
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-with-timer-loop", *args]
    else:
        cmd = [sys.executable, "-m", "broker_filter", "serve", *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    for _ in range(600):
        m = re.search(r"listening on [^:\s]+:(\d+)", Path(log.name).read_text())
        if m:
            return proc, f"amqp://127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("daemon did not start: " + Path(log.name).read_text())


def stop_daemon(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def daemon_figures(messages: int, repeat: int, latency_messages: int, rate: float) -> dict:
    """Produce -> consume through the daemon with separate producer and consumer processes (the
    python-qpid-proton clients of bench/python_clients.py: the producer waits for each message to be
    accepted, the consumer takes credit 1000 and accepts): best stream rate of `repeat` runs, the
    daemon's CPU use while streaming, and latency at a fixed rate.  Both loops run side by side,
    interleaved, so they see the same machine load."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from python_clients import cpu_seconds, run_once

    daemons = {loop: start_daemon(loop) for loop in ("product", "timer")}
    out: dict = {loop: {"runs": [], "cpu": 0.0, "elapsed": 0.0} for loop in daemons}
    try:
        for _ in range(repeat):
            for loop, (proc, url) in daemons.items():
                before = cpu_seconds(proc.pid)
                r = run_once(url, url, None, messages, None)
                out[loop]["cpu"] += cpu_seconds(proc.pid) - before
                out[loop]["elapsed"] += r["elapsed"]
                out[loop]["runs"].append(r["rate"])
        for loop, (proc, url) in daemons.items():
            lat = run_once(url, url, None, latency_messages, rate)
            out[loop]["p50_ms"], out[loop]["p99_ms"] = lat["p50_ms"], lat["p99_ms"]
    finally:
        for proc, _ in daemons.values():
            stop_daemon(proc)
    for r in out.values():
        r["best"] = max(r["runs"])
        r["cpu_share"] = r["cpu"] / r["elapsed"]
        r["cpu_us_per_message"] = 1e6 * r["cpu"] / (messages * repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1000,100000,1000000")
    ap.add_argument("--throughput-messages", type=int, default=50_000)
    ap.add_argument("--daemon-messages", type=int, default=10_000, help="per daemon run (0: skip the daemon)")
    ap.add_argument("--daemon-repeat", type=int, default=3)
    ap.add_argument("--latency-messages", type=int, default=1500)
    ap.add_argument("--rate", type=float, default=300.0, help="msg/s of the latency runs")
    args = ap.parse_args()

    plain, selective = library_throughput(args.throughput_messages)
    print(f"library produce->consume: plain {plain:,.0f} msg/s, with a selector {selective:,.0f} msg/s")
    if args.daemon_messages:
        figures = daemon_figures(args.daemon_messages, args.daemon_repeat, args.latency_messages, args.rate)
        print(f"daemon produce->consume over loopback ({args.daemon_messages} messages per run):")
        for loop, label in (("product", "call_soon at the turn's end (product)"), ("timer", "call_soon on a 0 s timer")):
            r = figures[loop]
            runs = " / ".join(f"{x:,.0f}" for x in r["runs"])
            print(f"  {label:34} best {r['best']:>7,.0f} msg/s (runs {runs}); daemon CPU {r['cpu_share']:.0%} "
                  f"of one core, {r['cpu_us_per_message']:.0f} us/msg; latency at {args.rate:g} msg/s "
                  f"p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms")

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
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-with-timer-loop":
        raise SystemExit(serve_with_timer_loop(sys.argv[2:]))
    main()
