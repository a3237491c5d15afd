"""The daemon's CPU per upstream message when traffic is light, beside the minimal relay on the same
engine loop (the floor), with the latency each adds over going direct: one run, rhea clients, in
front of RabbitMQ 3.10 (127.0.0.1:5672).

Loads: 500, 1,000 and 4,000 msg/s paced (the rhea producer's RATE; `--seconds` of traffic each) and
saturation (`--messages`, unpaced).  At each load, rounds are interleaved over the targets:
  * direct:  the consumer reads from RabbitMQ and selects half = 1 itself (latency baseline);
  * relay:   the minimal filtering relay of bench/engine_relay_bench.py on the engine loop;
  * bytes:   a forwarder that copies bytes between the consumer and RabbitMQ and does nothing else
             (bench/byte_forwarder.py, the floor of any Python process in the path); the consumer
             selects for itself, as direct;
  * after:   `broker-filter serve` from this checkout;
  * before:  `broker-filter serve` from `--before ROOT` (e.g. /work/main, main's head), if given.
Each round publishes to a fresh /topic/<name> with the selector `half = 1` (a selective consumer on
a queue would measure queue custody instead: the daemon moves unselected messages to the tail).
CPU is the server's user + system time (from /proc) per upstream message; the added latency is the
median over rounds of the target's p50 / p99 (receive time - send time, selected messages) minus
direct's in the same round.  The machine may be shared: the figures are noisy, compare ratios of the
same run.

    python bench/paced_cost_bench.py [--rounds 3] [--seconds 4] [--messages 40000] [--before /work/main]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from engine_relay_bench import one_round, start_daemon  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", default="127.0.0.1:5672")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="paced traffic per round")
    parser.add_argument("--messages", type=int, default=40000, help="messages per saturated round")
    parser.add_argument("--rates", default="500,1000,4000,0", help="msg/s; 0 is saturation")
    parser.add_argument("--before", metavar="ROOT", help="a checkout whose daemon is the 'before' column")
    options = parser.parse_args()
    rates = [float(r) for r in options.rates.split(",") if r]

    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    logs: list[Path] = []
    results: dict[tuple[float, str], list[dict]] = {}
    try:
        relay = subprocess.Popen([sys.executable, str(HERE / "engine_relay_bench.py"), "--serve",
                                  "--upstream", options.upstream], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        servers["relay"] = (relay, json.loads(relay.stdout.readline())["port"])
        forwarder = subprocess.Popen([sys.executable, str(HERE / "byte_forwarder.py"), "--upstream", options.upstream],
                                     stdout=subprocess.PIPE, text=True)
        servers["bytes"] = (forwarder, json.loads(forwarder.stdout.readline())["port"])
        proc, port, log = start_daemon("engine", options.upstream, root=ROOT)
        servers["after"] = (proc, port)
        logs.append(log)
        if options.before:
            proc, port, log = start_daemon("engine", options.upstream, root=Path(options.before))
            servers["before"] = (proc, port)
            logs.append(log)
        targets = ["direct", *servers]
        for rate in rates:
            count = options.messages if not rate else max(200, int(rate * options.seconds)) // 2 * 2
            for n in range(options.rounds):
                base = None
                for kind in targets:
                    name = f"paced-{uuid.uuid4().hex[:12]}"
                    proc, port = servers.get(kind, (None, 0))
                    r = None
                    for attempt in (1, 2):  # a round whose client failed (shared machine) gets one retry
                        try:
                            r = one_round(port, f"/topic/{name}-{attempt}", count, kind not in ("direct", "bytes"),
                                          proc.pid if proc is not None else None, rate=rate or None,
                                          plain_port=port if kind == "bytes" else 5672)
                            break
                        except (ValueError, AssertionError, subprocess.TimeoutExpired) as e:
                            print(f"  {kind}: a client failed ({e!r})", flush=True)
                    if r is None or (proc is not None and proc.poll() is not None):
                        print(f"  {kind}: round skipped", flush=True)
                        if kind == "direct":
                            base = None
                        continue
                    if kind == "direct":
                        base = r
                    elif rate and base and r["p50_ms"] is not None and base["p50_ms"] is not None:
                        r["p50_added"] = r["p50_ms"] - base["p50_ms"]
                        r["p99_added"] = r["p99_ms"] - base["p99_ms"]
                    results.setdefault((rate, kind), []).append(r)
                    cpu = f", CPU {r['cpu_us_per_msg']:.1f} us/msg" if proc is not None else ""
                    lat = (f", p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms"
                           if rate and r["p50_ms"] is not None else "")
                    print(f"{'sat' if not rate else int(rate):>5} round {n + 1} {kind:7}: {r['rate']:8.0f} msg/s"
                          f"{cpu}{lat}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.unlink()

    def med(rate: float, kind: str, key: str) -> float | None:
        values = [r[key] for r in results.get((rate, kind), []) if r.get(key) is not None]
        return statistics.median(values) if values else None

    print(f"\nmedians of {options.rounds} interleaved rounds (noisy: shared machine); CPU in us per upstream "
          f"message, latency added over direct p50 / p99 in ms")
    kinds = [k for k in servers]
    print("load      " + "".join(f"{k + ' CPU':>12}{k + ' +p50/+p99':>22}" for k in kinds)
          + ("   after/before CPU" if "before" in servers else ""))
    for rate in rates:
        row = f"{'sat' if not rate else int(rate):>8}  "
        for kind in kinds:
            cpu = med(rate, kind, "cpu_us_per_msg")
            p50, p99 = med(rate, kind, "p50_added"), med(rate, kind, "p99_added")
            row += f"{cpu:12.1f}" if cpu is not None else f"{'-':>12}"
            row += f"{p50:+10.2f} / {p99:+7.2f}  " if p50 is not None else f"{'-':>22}"
        if "before" in servers:
            a, b = med(rate, "after", "cpu_us_per_msg"), med(rate, "before", "cpu_us_per_msg")
            row += f"{a / b:16.2f}x" if a and b else ""
        if not rate:
            row += f"   ({med(rate, 'direct', 'rate'):.0f} msg/s direct)"
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
