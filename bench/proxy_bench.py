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
every target sees the same machine load, and the order rotates from round to round (each target
runs first, second and third equally often: the broker's state after one target's round is not
always what the same next target meets); medians are reported.  The daemon's CPU (user + system,
from /proc) is per upstream message.  Then latency at half load: the producer paced at half the
lower of the direct and consumer rates measured in this run, direct against through the daemon (and
both ways through it), p50 and p99 of receive time - send time of the selected messages.

Where the CPU goes, per round and upstream message: the whole machine's (from /proc/stat, every
process and the kernel's network work) and the broker's (the process listening on the upstream
port, when it can be found).  On a machine whose cores the round keeps busy, a target's rate
against direct is about the inverse of its machine CPU per message against direct's: the daemon's
CPU adds to what the broker and the clients spend.

With `--against ROOT` a second daemon runs the code of another checkout beside this one, and a fourth
target, "against", is the consumer through it: the two versions are compared in the same rounds,
each round's ratio against that round's direct run (the machine's noise moves both alike).

    python bench/proxy_bench.py [--messages 40000] [--rounds 3] [--latency-seconds 5] [--json]
                                [--profile daemon.prof] [--against /path/to/other/checkout]

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

from cpu_usage import cpu_seconds, listening_pid, machine_busy  # noqa: E402
from engine_relay_bench import one_round, start_daemon  # noqa: E402

TARGETS = ("direct", "consumer", "both")
TARGETS_MET = {"consumer": 0.85, "both": 0.7}  # rate vs direct, issue "the daemon on proton's engine"
CPU_TARGET_US = 40.0


def run(target: str, proc: subprocess.Popen, port: int, count: int, rate: float | None = None,
        broker: int | None = None) -> dict:
    address = f"/topic/proxy-bench-{uuid.uuid4().hex[:12]}"
    through = target != "direct"
    busy0, total0 = machine_busy()
    broker0 = cpu_seconds(broker) if broker else 0.0
    r = one_round(port, address, count, through, proc.pid if through else None, target == "both", rate)
    busy1, total1 = machine_busy()
    r["machine_us_per_msg"] = (busy1 - busy0) * 1e6 / count
    r["machine_busy"] = (busy1 - busy0) / (total1 - total0) if total1 > total0 else None
    r["broker_us_per_msg"] = (cpu_seconds(broker) - broker0) * 1e6 / count if broker else None
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-seconds", type=float, default=5.0,
                    help="length of each latency run at half load")
    ap.add_argument("--upstream", default="127.0.0.1:5672", help="RabbitMQ host:port (guest/guest)")
    ap.add_argument("--profile", metavar="FILE", help="run the daemon under cProfile, statistics to FILE")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--against", type=Path, metavar="ROOT",
                    help="also run the consumer through a daemon of another checkout, in the same rounds")
    args = ap.parse_args()

    proc, port, log = start_daemon("engine", args.upstream, args.profile)
    other = start_daemon("engine", args.upstream, root=args.against.resolve()) if args.against else None
    broker = listening_pid(int(args.upstream.rpartition(":")[2]))
    targets = TARGETS + (("against",) if other else ())
    rounds: dict[str, list[dict]] = {t: [] for t in targets}
    latency: dict[str, dict] = {}
    try:
        for n in range(args.rounds):
            k = n % len(targets)
            for target in targets[k:] + targets[:k]:  # each target first in as many rounds
                if target == "against":
                    r = run("consumer", other[0], other[1], args.messages, broker=broker)
                else:
                    r = run(target, proc, port, args.messages, broker=broker)
                rounds[target].append(r)
                if not args.json:
                    cpu = f", daemon CPU {r['cpu_us_per_msg']:.1f} µs/msg" if r["cpu_us_per_msg"] is not None else ""
                    rabbit = f", broker {r['broker_us_per_msg']:.1f}" if r["broker_us_per_msg"] is not None else ""
                    print(f"round {n + 1} {target:9}: {r['rate']:8.0f} msg/s{cpu}; machine CPU "
                          f"{r['machine_us_per_msg']:.1f} µs/msg ({100 * r['machine_busy']:.0f}% busy){rabbit}",
                          flush=True)
        median = {t: statistics.median(r["rate"] for r in rounds[t]) for t in targets}
        half = round(min(median["direct"], median["consumer"]) / 2)
        count = max(200, int(half * args.latency_seconds)) // 2 * 2
        for target in TARGETS:
            latency[target] = run(target, proc, port, count, half)
    finally:
        for p, _, daemon_log in [(proc, port, log)] + ([other] if other else []):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
            daemon_log.unlink()

    direct = median["direct"]
    result = {
        "messages": args.messages,
        "rounds": args.rounds,
        "direct_msgs_per_s": round(direct),
        "runs": {t: [round(r["rate"]) for r in rounds[t]] for t in targets},
    }
    for t in ("consumer", "both"):
        result[f"{t}_ratio"] = round(median[t] / direct, 3)
        result[f"{t}_cpu_us_per_message"] = round(statistics.median(r["cpu_us_per_msg"] for r in rounds[t]), 1)
    if other:
        for t in ("consumer", "against"):
            result[f"{t}_paired_ratio"] = round(statistics.median(
                r["rate"] / d["rate"] for r, d in zip(rounds[t], rounds["direct"])), 3)
        result["against_ratio"] = round(median["against"] / direct, 3)
        result["against_cpu_us_per_message"] = round(
            statistics.median(r["cpu_us_per_msg"] for r in rounds["against"]), 1)
        result["against"] = str(args.against.resolve())
    for t in TARGETS:
        result[f"{t}_machine_us_per_message"] = round(statistics.median(r["machine_us_per_msg"] for r in rounds[t]), 1)
        if broker:
            result[f"{t}_broker_us_per_message"] = round(
                statistics.median(r["broker_us_per_msg"] for r in rounds[t]), 1)
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
        print("  machine CPU per upstream message (medians; the broker's in brackets): " + ", ".join(
            f"{t} {result[f'{t}_machine_us_per_message']} µs"
            + (f" ({result[f'{t}_broker_us_per_message']})" if broker else "") for t in TARGETS))
        if other:
            print(f"  consumer through the daemon of {result['against']}: {median['against']:8.0f} msg/s  "
                  f"{result['against_ratio']:.2f}x direct; daemon CPU {result['against_cpu_us_per_message']} µs")
            print(f"  median of the rounds' own ratios (each against that round's direct run): this checkout "
                  f"{result['consumer_paired_ratio']:.3f}x, the other {result['against_paired_ratio']:.3f}x")
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
