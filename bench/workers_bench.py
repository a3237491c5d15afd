"""`listener.workers`: the daemon with 1 worker against 2, rhea producers and consumers on several
connections, in one run.

Each round: PAIRS pairs of a rhea consumer (selector `half = 1`) and a rhea producer (MESSAGES
messages of 64 bytes, `half` = i % 2), every pair on a fresh `/topic/<name>` of its own, all through
`broker-filter serve` in front of RabbitMQ 3.10; the pairs run at once, so that their connections
spread over the workers.  Rate = messages produced by all pairs / (first send .. last selected
message of any pair).  The daemon's CPU (user + system, the workers') is read from /proc around
each round and divided by the messages produced.  Rounds interleave the two daemons.

    python bench/workers_bench.py [--pairs 4] [--messages 10000] [--rounds 3]

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest) and rhea (tests/js/node_modules).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "tests" / "js"
UPSTREAM = "amqp://guest:guest@127.0.0.1:5672"


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def start_daemon(workers: int) -> tuple[subprocess.Popen, int, list[int]]:
    log = tempfile.NamedTemporaryFile("w+", prefix="workers-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0",
                             "--set", f"listener.workers={workers}", "--upstream", UPSTREAM],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = Path(log.name).read_text()
        match = re.search(r"listening on [^\s]+:(\d+)", text)
        if match and text.count("connected (") >= workers:
            pids = children(proc.pid) if workers > 1 else [proc.pid]
            return proc, int(match.group(1)), pids
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the daemon with {workers} workers did not start: {Path(log.name).read_text()[-2000:]}")


def node(*args: str) -> subprocess.Popen:
    return subprocess.Popen(["node", "rhea_bench.js", *args], cwd=JS, stdout=subprocess.PIPE, text=True)


def one_round(port: int, pids: list[int], pairs: int, count: int) -> dict:
    base = f"/topic/workers-{uuid.uuid4().hex[:8]}"
    consumers = [node("consume", str(port), f"{base}-{k}", str(count // 2), "half = 1", "0", "1000", "-", "-")
                 for k in range(pairs)]
    for consumer in consumers:
        ready = json.loads(consumer.stdout.readline())
        assert ready.get("ready"), ready
    cpu0 = sum(cpu_seconds(p) for p in pids)
    producers = [node("produce", str(port), f"{base}-{k}", str(count), "-", "-") for k in range(pairs)]
    produced = [json.loads(p.stdout.readline()) for p in producers]
    consumed = [json.loads(c.stdout.readline()) for c in consumers]
    cpu1 = sum(cpu_seconds(p) for p in pids)
    for p in producers + consumers:
        p.wait(30)
    assert all(c["selected"] == count // 2 for c in consumed), consumed
    seconds = (max(c["last"] for c in consumed) - min(p["t0"] for p in produced)) / 1000
    total = pairs * count
    return {"rate": total / seconds, "cpu_us": (cpu1 - cpu0) * 1e6 / total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--messages", type=int, default=10000, help="per producer")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    daemons = {n: start_daemon(n) for n in (1, 2)}
    results: dict[int, list[dict]] = {1: [], 2: []}
    try:
        for r in range(options.rounds):
            for n, (_, port, pids) in daemons.items():
                result = one_round(port, pids, options.pairs, options.messages)
                results[n].append(result)
                print(f"round {r + 1}, {n} worker(s): {result['rate']:,.0f} msg/s, "
                      f"{result['cpu_us']:.1f} µs daemon CPU per message", flush=True)
    finally:
        for proc, _, _ in daemons.values():
            proc.terminate()
            proc.wait(60)
    rate = {n: statistics.median(x["rate"] for x in results[n]) for n in results}
    for n in (1, 2):
        runs = " / ".join(f"{x['rate']:,.0f}" for x in results[n])
        cpu = statistics.median(x["cpu_us"] for x in results[n])
        print(f"{n} worker(s): median {rate[n]:,.0f} msg/s ({runs}), {cpu:.1f} µs daemon CPU per message")
    print(f"2 workers / 1 worker: {rate[2] / rate[1]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
