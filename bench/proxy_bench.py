"""The daemon in front of RabbitMQ against RabbitMQ direct, fast clients, one run.

rhea clients (tests/js/rhea_bench.js, fast enough not to bound the direct rate): a consumer, then a
producer of N messages (64-byte body, application properties `half` = i % 2 and `i`; in the
latency runs also `ts`, the send time) to a fresh `/topic/<name>` on RabbitMQ 127.0.0.1:5672 each round:
  * direct:   producer and consumer at RabbitMQ; the consumer receives every message and keeps
              half = 1 itself (what a client does where the broker cannot filter);
  * consumer: the consumer through `broker-filter serve` with the selector `half = 1` (the daemon
              drops the rest), the producer at RabbitMQ;
  * both:     producer and consumer through the daemon (every selected message crosses it twice).
Rate = N / (producer start .. the consumer's last selected message); rounds are interleaved so
every target sees the same machine load; medians are reported.  The daemon's CPU (user + system,
from /proc) is per upstream message.  Then latency at half load: the producer paced at half the
lower of the direct and consumer rates measured in this run, direct against through the daemon (and
both ways through it), p50 and p99 of receive time - send time of the selected messages.

    python bench/proxy_bench.py [--messages 40000] [--rounds 3] [--latency-seconds 5] [--json]
                                [--profile daemon.prof]

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest) and rhea (tests/js/node_modules).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_relay_bench import one_round, start_daemon  # noqa: E402

TARGETS = ("direct", "consumer", "both")
TARGETS_MET = {"consumer": 0.85, "both": 0.7}  # rate vs direct, issue "the daemon on proton's engine"
CPU_TARGET_US = 40.0


def run(target: str, proc: subprocess.Popen, port: int, count: int, rate: float | None = None) -> dict:
    address = f"/topic/proxy-bench-{uuid.uuid4().hex[:12]}"
    through = target != "direct"
    return one_round(port, address, count, through, proc.pid if through else None, target == "both", rate)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-seconds", type=float, default=5.0,
                    help="length of each latency run at half load")
    ap.add_argument("--upstream", default="127.0.0.1:5672", help="RabbitMQ host:port (guest/guest)")
    ap.add_argument("--profile", metavar="FILE", help="run the daemon under cProfile, statistics to FILE")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()

    proc, port, log = start_daemon("engine", args.upstream, args.profile)
    rounds: dict[str, list[dict]] = {t: [] for t in TARGETS}
    latency: dict[str, dict] = {}
    try:
        for n in range(args.rounds):
            for target in TARGETS:
                r = run(target, proc, port, args.messages)
                rounds[target].append(r)
                if not args.json:
                    cpu = f", daemon CPU {r['cpu_us_per_msg']:.1f} µs/msg" if r["cpu_us_per_msg"] is not None else ""
                    print(f"round {n + 1} {target:9}: {r['rate']:8.0f} msg/s{cpu}", flush=True)
        median = {t: statistics.median(r["rate"] for r in rounds[t]) for t in TARGETS}
        half = round(min(median["direct"], median["consumer"]) / 2)
        count = max(200, int(half * args.latency_seconds)) // 2 * 2
        for target in TARGETS:
            latency[target] = run(target, proc, port, count, half)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.unlink()

    direct = median["direct"]
    result = {
        "messages": args.messages,
        "rounds": args.rounds,
        "direct_msgs_per_s": round(direct),
        "runs": {t: [round(r["rate"]) for r in rounds[t]] for t in TARGETS},
    }
    for t in ("consumer", "both"):
        result[f"{t}_ratio"] = round(median[t] / direct, 3)
        result[f"{t}_cpu_us_per_message"] = round(statistics.median(r["cpu_us_per_msg"] for r in rounds[t]), 1)
    result["latency_rate"] = half
    for t in TARGETS:
        result[f"{t}_p50_ms"] = round(latency[t]["p50_ms"], 2)
        result[f"{t}_p99_ms"] = round(latency[t]["p99_ms"], 2)
    for t in ("consumer", "both"):
        result[f"{t}_added_p50_ms"] = round(latency[t]["p50_ms"] - latency["direct"]["p50_ms"], 2)
        result[f"{t}_added_p99_ms"] = round(latency[t]["p99_ms"] - latency["direct"]["p99_ms"], 2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"\nmedians of {args.rounds} interleaved rounds of {args.messages} messages, selector 'half = 1':")
        print(f"  direct              {direct:8.0f} msg/s")
        for t in ("consumer", "both"):
            met = "met" if result[f"{t}_ratio"] >= TARGETS_MET[t] else "NOT met"
            print(f"  {t + ' through':18}  {median[t]:8.0f} msg/s  {result[f'{t}_ratio']:.2f}x direct "
                  f"(target >= {TARGETS_MET[t]}x: {met}); daemon CPU {result[f'{t}_cpu_us_per_message']} µs "
                  f"per upstream message")
        met = "met" if result["consumer_cpu_us_per_message"] <= CPU_TARGET_US else "NOT met"
        print(f"  daemon CPU target <= {CPU_TARGET_US:g} µs per upstream message (consumer through it): {met}")
        print(f"latency at half load ({half} msg/s, {count} messages):")
        for t in TARGETS:
            added = "" if t == "direct" else (f"; added p50 {result[f'{t}_added_p50_ms']} ms, "
                                              f"p99 {result[f'{t}_added_p99_ms']} ms")
            print(f"  {t:9} p50 {result[f'{t}_p50_ms']} ms, p99 {result[f'{t}_p99_ms']} ms{added}")
    if args.profile:
        import pstats

        print(f"\ndaemon profile ({args.profile}), top by own time:")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
