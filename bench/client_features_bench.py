"""What two client features cost per message through the daemon: the anonymous relay (a sender with
a null target, each message's `to` naming the queue) and pulling with drain (a receiver without a
credit window that asks for K messages at a time with drain set), each against its plain path.

`broker-filter serve` runs in front of RabbitMQ 3.10 (127.0.0.1:5672); the clients are rhea
(tests/js/rhea_features_bench.js), connected to the daemon.  Each round runs every target once, in
an order that rotates from round to round (each target first equally often), each on a fresh queue:
  * named:      a producer of N messages (64-byte body, application properties half and i) on a
                sender whose target is `/queue/<fresh>`, as fast as credit allows;
  * anonymous:  the same producer on a sender with a null target (`target: {}`), every message's
                `to` set to `/queue/<fresh>`;
  * window:     N messages put in `/queue/<fresh>` at RabbitMQ directly (not measured), then a
                consumer through the daemon with a credit window of `--window` (rhea tops it up);
  * drain-K:    the same, consumed by a receiver with no credit window that pulls: K credits with
                drain set, the next pull once the last one is over (its credit used up by messages,
                or the daemon's drained answer), until N arrived.  K = `--pull` (500) on N messages,
                and K = 1 (a JMS consumer's receive() with prefetch 0: one message per pull) on
                `--pull-messages` messages.
Producer rate: N / (first credit .. every message settled); consumer rate: N / (attached .. the
last message).  CPU: the daemon's user + system time (from /proc) from before the client starts
to its result, per message; the whole machine's busy share over the round is shown for context.
Reported: the medians over rounds, and each feature's ratio to its plain path (anonymous / named;
drain-K / window), rates and CPU per message.

    python bench/client_features_bench.py [--messages 40000] [--rounds 5] [--pull-messages 4000]
                                          [--window 500] [--pull 500] [--json]

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest) and rhea (tests/js/node_modules).
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
sys.path.insert(0, str(HERE))

from cpu_usage import cpu_seconds, machine_busy  # noqa: E402
from engine_relay_bench import JS, delete_queue, node, start_daemon  # noqa: E402

PLAIN = {"anonymous": "named", "drain": "window"}  # a feature's target prefix -> its plain path


def client(*args: str) -> dict:
    """Runs tests/js/rhea_features_bench.js to its result line."""
    proc = subprocess.run(["node", "rhea_features_bench.js", *args], cwd=JS, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"error": f"no result (exit {proc.returncode}): {proc.stderr[-500:]}"}
    if "error" in result:
        raise RuntimeError(f"rhea_features_bench.js {' '.join(args)}: {result}")
    return result


def fill(upstream: str, address: str, count: int) -> None:
    """`count` messages into `address` at RabbitMQ directly (tests/js/rhea_bench.js's producer)."""
    producer = node("produce", upstream.rpartition(":")[2], address, str(count), "guest", "guest")
    produced = json.loads(producer.stdout.readline())
    producer.wait(30)
    assert produced["accepted"] == count, produced


def run(target: str, daemon: subprocess.Popen, port: int, options: argparse.Namespace, queues: list[str]) -> dict:
    name = f"client-features-{uuid.uuid4().hex[:12]}"
    queues.append(name)
    address = f"/queue/{name}"
    if target in ("named", "anonymous"):
        count = options.messages
        args = ("produce", str(port), address, str(count), target)
    else:
        kind, _, k = target.partition("-")
        count = options.pull_messages if k == "1" else options.messages
        fill(options.upstream, address, count)
        args = ("consume", str(port), address, str(count), kind, k or str(options.window))
    busy0, total0 = machine_busy()
    cpu0 = cpu_seconds(daemon.pid)
    r = client(*args)
    cpu1 = cpu_seconds(daemon.pid)
    busy1, total1 = machine_busy()
    if target in ("named", "anonymous") and r["accepted"] != count:
        raise RuntimeError(f"{target}: {r['accepted']} of {count} messages accepted ({r})")
    return {"messages": count, "rate": count * 1000 / max(1, r["t1"] - r["t0"]),
            "cpu_us_per_msg": (cpu1 - cpu0) * 1e6 / count,
            "machine_busy": (busy1 - busy0) / (total1 - total0) if total1 > total0 else None,
            **{k: r[k] for k in ("pulls", "drained") if k in r}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40000, help="messages per round (all but drain-1)")
    ap.add_argument("--pull-messages", type=int, default=4000, help="messages per drain-1 round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=500, help="the credit window of the plain consumer")
    ap.add_argument("--pull", type=int, default=500, help="K of the drain-K consumer (besides K = 1)")
    ap.add_argument("--upstream", default="127.0.0.1:5672", help="RabbitMQ host:port (guest/guest)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    options = ap.parse_args()

    targets = ["named", "anonymous", "window", f"drain-{options.pull}", "drain-1"]
    if options.pull == 1:
        targets.remove("drain-1")
    load = [os.getloadavg()]
    daemon, port, log = start_daemon("engine", options.upstream)
    rounds: dict[str, list[dict]] = {t: [] for t in targets}
    queues: list[str] = []
    try:
        for n in range(options.rounds):
            k = n % len(targets)
            for target in targets[k:] + targets[:k]:
                r = run(target, daemon, port, options, queues)
                rounds[target].append(r)
                if not options.json:
                    pulls = f", {r['pulls']} pulls ({r['drained']} ended drained)" if "pulls" in r else ""
                    print(f"round {n + 1} {target:9}: {r['rate']:8.0f} msg/s, daemon CPU {r['cpu_us_per_msg']:6.1f} "
                          f"µs/msg ({r['messages']} messages{pulls}; machine {100 * r['machine_busy']:.0f}% busy)",
                          flush=True)
            load.append(os.getloadavg())
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.unlink()
        for name in queues:
            delete_queue(name)

    median = {t: {key: statistics.median(r[key] for r in rounds[t]) for key in ("rate", "cpu_us_per_msg")}
              for t in targets}
    result = {"messages": options.messages, "pull_messages": options.pull_messages, "rounds": options.rounds,
              "window": options.window, "load_average_1min": [round(x[0], 2) for x in load], "targets": {}}
    for t in targets:
        plain = PLAIN.get(t.partition("-")[0])
        entry = {"messages": rounds[t][0]["messages"], "rate": round(median[t]["rate"]),
                 "cpu_us_per_msg": round(median[t]["cpu_us_per_msg"], 1),
                 "runs": [round(r["rate"]) for r in rounds[t]],
                 "cpu_runs": [round(r["cpu_us_per_msg"], 1) for r in rounds[t]]}
        if plain:
            entry["against"] = plain
            entry["rate_ratio"] = round(median[t]["rate"] / median[plain]["rate"], 3)
            entry["cpu_ratio"] = round(median[t]["cpu_us_per_msg"] / median[plain]["cpu_us_per_msg"], 3)
        result["targets"][t] = entry
    if options.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\nmedians of {options.rounds} interleaved rounds (load average, 1 min, at the start and after each "
          f"round: {', '.join(str(x) for x in result['load_average_1min'])}):")
    print(f"  {'target':10} {'messages':>8} {'msg/s':>8} {'daemon µs/msg':>14}   against the plain path")
    for t, e in result["targets"].items():
        against = (f"   rate {e['rate_ratio']:.2f}x, CPU {e['cpu_ratio']:.2f}x {e['against']}"
                   if "against" in e else "")
        print(f"  {t:10} {e['messages']:8} {e['rate']:8} {e['cpu_us_per_msg']:14.1f}{against}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
