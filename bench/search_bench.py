"""Time to the first match behind N non-matching messages, through the daemon, against draining the
same N directly from RabbitMQ, in one run.

For each depth N, `--rounds` times (default 3): N messages with `half = 0` and then one with
`half = 1` are published to a fresh RabbitMQ queue (twice: one queue per measurement).  Then
  * direct:  a rhea receiver (tests/js/first_match.js, credit 1000, accepting) drains all N + 1
             messages straight from RabbitMQ: time from its connect to the last message;
  * daemon:  `broker-filter serve` with the default configuration (limits.upstream_window 100) in
             front of RabbitMQ, a rhea receiver with the selector `half = 1` attaches through it:
             time from its connect to the match.
Odd rounds measure direct first, even rounds the daemon first, so neither always meets the broker
just after a publish of N or just after the other's drain; the medians per depth are reported with
the range of the rounds (RabbitMQ 3.10's direct drain of 100,000 varied from 2.5 s to 6 s from run
to run here, which moved a single round's ratio by as much).  The daemon's peak resident memory
(VmHWM) is reported per round (a fresh daemon per round): bounded by the window, it should not grow
with N.  After the match the daemon is stopped with SIGTERM and
the queue drained, which must give back exactly the N non-matching messages (no duplicate).

While the daemon searches, its metrics are sampled every 0.2 s: the mean number of moves in flight
(the pipelining depth), and by Little's law, with the moves per second, the mean time a move waits
for the broker's confirm of its copy.  `--window W` runs the daemon with limits.upstream_window W.

The broker's CPU (the process listening on the upstream port, when this user can see it) is
reported per message drained and per message moved, and the daemon's per message moved: where the
broker is the bound, a move costing it k times a drained message puts the ratio near k.

    python bench/search_bench.py [--upstream amqp://guest:guest@127.0.0.1:5672] [--depths 10000 100000]
                                 [--window 100] [--rounds 3]

Needs node with rhea (tests/js/node_modules) and a RabbitMQ with AMQP 1.0 on the upstream URL.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "tests" / "js"
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

from cpu_usage import cpu_seconds, listening_pid  # noqa: E402


def publish(upstream: str, address: str, depth: int) -> None:
    from proton import Message

    from clients import publish_many

    body = b"x" * 64
    publish_many(upstream, address, [Message(body=body, properties={"half": 0, "i": i}) for i in range(depth)]
                 + [Message(body=b"match", properties={"half": 1, "i": depth})], timeout=600)


def rhea(port: int, address: str, selector: str, count: int, user: str | None, password: str | None,
         timeout_s: float) -> dict:
    args = ["node", str(JS / "first_match.js"), str(port), address, selector, str(count), "1000",
            str(int(timeout_s * 1000))]
    if user:
        args += [user, password or ""]
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s + 30, cwd=JS)
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


class Sampler(threading.Thread):
    """Samples the daemon's moves in flight on `address` every 0.2 s until stopped."""

    def __init__(self, port: int, address: str):
        super().__init__(daemon=True)
        self.port, self.address = port, address
        self.moving: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        from launcher import metric_value, scrape

        while not self.halt.wait(0.2):
            try:
                self.moving.append(metric_value(scrape(self.port), "broker_filter_moves_in_flight",
                                                address=self.address))
            except Exception:  # noqa: BLE001 - the exporter is not up yet, or a scrape timed out
                pass

    def mean(self) -> float:
        busy = [m for m in self.moving if m > 0]
        return sum(busy) / len(busy) if busy else 0.0


def one_round(args: argparse.Namespace, parts, broker: int | None, depth: int, daemon_first: bool) -> dict:
    """One measurement at `depth`: the direct drain and the search through a fresh daemon, each on a
    fresh queue published beforehand (`daemon_first`: the search runs first, so alternate rounds
    see the broker in either order)."""
    from clients import drain
    from launcher import Daemon, free_port

    direct_q, proxied_q = (f"/queue/search-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("direct", "proxied"))
    publish(args.upstream, direct_q, depth)
    publish(args.upstream, proxied_q, depth)

    def measure_direct() -> tuple[dict, float | None]:
        broker0 = cpu_seconds(broker) if broker else 0.0
        direct = rhea(parts.port or 5672, direct_q, "-", depth + 1, parts.username, parts.password, 600)
        assert direct["received"] == depth + 1, direct
        return direct, (cpu_seconds(broker) - broker0) * 1e6 / (depth + 1) if broker else None

    def measure_daemon() -> tuple[dict, float, float | None, float, Sampler]:
        mport = free_port()
        extra = ("--set", f"limits.upstream_window={args.window}") if args.window else ()
        daemon = Daemon("--metrics", f"127.0.0.1:{mport}", *extra, upstream=args.upstream)
        sampler = Sampler(mport, proxied_q)
        sampler.start()
        try:
            broker0 = cpu_seconds(broker) if broker else 0.0
            daemon0 = cpu_seconds(daemon.proc.pid)
            found = rhea(daemon.port, proxied_q, "half = 1", 1, None, None, 600)
            daemon_search = (cpu_seconds(daemon.proc.pid) - daemon0) * 1e6 / depth
            broker_search = (cpu_seconds(broker) - broker0) * 1e6 / depth if broker else None
            rss = peak_rss_mb(daemon.proc.pid)
        finally:
            sampler.halt.set()
            daemon.stop()
        assert found["received"] == 1, found
        return found, daemon_search, broker_search, rss, sampler

    if daemon_first:
        found, daemon_search, broker_search, rss, sampler = measure_daemon()
        direct, broker_drain = measure_direct()
    else:
        direct, broker_drain = measure_direct()
        found, daemon_search, broker_search, rss, sampler = measure_daemon()
    left = drain(args.upstream, proxied_q, idle=3.0, key=lambda m: m.properties["i"])
    return {
        "depth": depth,
        "order": "daemon first" if daemon_first else "direct first",
        "direct_drain_s": direct["last_ms"] / 1000,
        "first_match_s": found["first_ms"] / 1000,
        "ratio": found["first_ms"] / direct["last_ms"],
        "moves_in_flight_mean": round(sampler.mean(), 1),
        "moves_per_s": round(depth / (found["first_ms"] / 1000)),
        "confirm_wait_ms": round(1000 * sampler.mean() / (depth / (found["first_ms"] / 1000)), 1),
        "daemon_peak_rss_mb": round(rss, 1),
        "broker_us_per_drained": round(broker_drain, 1) if broker_drain is not None else None,
        "broker_us_per_move": round(broker_search, 1) if broker_search is not None else None,
        "daemon_us_per_move": round(daemon_search, 1),
        "left_after_sigterm": len(left),
        "duplicates": len(left) - len(set(left)),
        "lost": depth - len(set(left)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", default="amqp://guest:guest@127.0.0.1:5672")
    ap.add_argument("--depths", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3,
                    help="measurements per depth, alternating which of direct and daemon runs first")
    args = ap.parse_args()

    parts = urlsplit(args.upstream)
    broker = listening_pid(parts.port or 5672)
    rows = []
    for depth in args.depths:
        for n in range(args.rounds):
            row = one_round(args, parts, broker, depth, daemon_first=n % 2 == 1)
            row["round"] = n + 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| depth N | round | direct drain of N (rhea) | first match through the daemon | ratio (target <= 3x) "
          "| moves/s | moves in flight (mean) | confirm wait | daemon peak RSS | left after SIGTERM "
          "| broker CPU per drained / per moved message | daemon CPU per move |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['depth']:,} | {r['round']} ({r['order']}) | {r['direct_drain_s']:.2f} s | {r['first_match_s']:.2f} s | {r['ratio']:.2f}x "
              f"| {r['moves_per_s']:,} | {r['moves_in_flight_mean']} | {r['confirm_wait_ms']} ms "
              f"| {r['daemon_peak_rss_mb']} MB | {r['left_after_sigterm']:,} ({r['duplicates']} duplicates) "
              f"| {r['broker_us_per_drained']} / {r['broker_us_per_move']} µs | {r['daemon_us_per_move']} µs |")


    print(f"\nmedians of {args.rounds} rounds per depth (target: first match <= 3x the direct drain):")
    for depth in args.depths:
        mine = [r for r in rows if r["depth"] == depth]
        ratio = statistics.median(r["ratio"] for r in mine)
        print(f"  {depth:>9,}: direct drain {statistics.median(r['direct_drain_s'] for r in mine):.2f} s, "
              f"first match {statistics.median(r['first_match_s'] for r in mine):.2f} s, ratio {ratio:.2f}x "
              f"({'met' if ratio <= 3 else 'NOT met'}; rounds {min(r['ratio'] for r in mine):.2f}x-"
              f"{max(r['ratio'] for r in mine):.2f}x); duplicates {sum(r['duplicates'] for r in mine)}, "
              f"lost {sum(r['lost'] for r in mine)}")


if __name__ == "__main__":
    main()
