"""Replicas: N daemons in front of one queue, with `[replicas]` (one owner per queue) and without
(each daemon its own consumer on the queue, as before), N = 1, 2, 3, 4, in one run.  Mode
`forwarded` (not run by default): one daemon, and in the other N - 1 places forwarders that only
copy bytes to it (bench/byte_forwarder.py): the floor of any hop a replica adds in front of the owner.

Each run: a fresh queue on RabbitMQ 3.10 filled with DEPTH messages (64-byte bodies, application
property `part` = i % 3) by a rhea producer; then N `broker-filter serve` processes; three rhea
consumers (tests/js/parts_bench.js, credit 500) with the disjoint selectors `part = k`, consumer k
connected to replica k mod N; and, once they are attached, live traffic: a rhea producer of LIVE
more messages through replica 0 at RATE a second.  A run ends when every consumer has every message
of its part (distinct; a duplicate would count in `received`).

- rate: DEPTH + LIVE messages / (first message received .. last message received, any consumer)
- moves per delivered message: the times a message was moved to the queue's tail, from the daemons'
  counters: upstream deliveries received by the daemons consuming from RabbitMQ (all N without
  replicas, the owner with) minus the messages, over the messages
- CPU per message: user + system CPU of all N daemons from the consumers' start to the end, over
  the messages; with `[replicas]` also split: the owner's, and the others' together (those serve
  their consumers through the owner: a second AMQP hop for each message they deliver)

    python bench/replicas_bench.py [--depth 30000] [--live 6000] [--rate 2000] [--ns 1,2,3,4]
                                   [--rounds 1] [--modes replicas,independent] [--placements]

The owner of a run's queue is where its random name hashes, so which consumers cross a hop varies
from round to round (at N = 4, the replica without a consumer owns the queue in a quarter of them,
and then all three cross).  `--placements` picks the queue's name so that round r's owner is
replica r mod N (the forwarders' daemon likewise), and reports the CPU of N > 1 as the mean over the
rounds: with a multiple of N rounds, the mean over the owner's places, what many queues cost (one
daemon's, which has no owner to place, stays the median).

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest) and rhea (tests/js/node_modules).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "bench"), str(ROOT)]

from cpu_usage import cpu_seconds  # noqa: E402
from launcher import Daemon, free_port, metric_value, scrape  # noqa: E402
from rabbitmq_nodes import RABBITMQ3  # noqa: E402
from replicas import ReplicaSet  # noqa: E402

from broker_filter.proxy.replicas import owner_of  # noqa: E402

JS = ROOT / "tests" / "js"
UPSTREAM = "amqp://guest:guest@127.0.0.1:5672"
PARTS = 3


def node(*args: str) -> subprocess.Popen:
    return subprocess.Popen(["node", "parts_bench.js", *args], cwd=JS, stdout=subprocess.PIPE, text=True)


def line(p: subprocess.Popen, timeout: float) -> dict:
    import select

    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        p.kill()
        raise TimeoutError(f"no line from {p.args} in {timeout:.0f} s")
    text = p.stdout.readline()
    if not text:
        raise RuntimeError(f"{p.args} ended: status {p.wait()}")
    return json.loads(text)


def produce(port: int, address: str, start: int, count: int, rate: float = 0, user: str = "guest",
            password: str = "guest") -> subprocess.Popen:
    args = ["produce", "127.0.0.1", str(port), address, str(start), str(count), str(PARTS), user, password]
    if rate:
        args.append(str(rate))
    return node(*args)


class Forwarder:
    """bench/byte_forwarder.py in front of `port` (a daemon): copies bytes, nothing else."""

    def __init__(self, port: int):
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "byte_forwarder.py"), "--upstream",
                                      f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True)
        self.port = line(self.proc, 30)["port"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def one_run(n: int, mode: str, depth: int, live: int, rate: float, place: int | None = None) -> dict:
    rs = None
    if mode in ("replicas", "splice") and n > 1:
        rs = ReplicaSet(UPSTREAM, n, heartbeat=2.0, splice=mode == "splice")  # (2.0: the default)
    while True:  # (with `place`: a name whose owner is replica `place`)
        name = f"replicas-bench-{uuid.uuid4().hex[:8]}"
        address = f"/queue/{name}"
        if place is None or rs is None or owner_of(address, rs.peers) == rs.peers[place]:
            break
    filler = produce(5672, address, 0, depth)
    done = line(filler, 300)
    assert done.get("accepted") == depth, done
    filler.wait(30)
    daemons: list[Daemon] = []
    metrics: list[int] = []
    if mode == "forwarded" and n > 1:
        # One daemon, and N - 1 forwarders that only copy bytes to it (bench/byte_forwarder.py) in
        # the other replicas' places: the floor of any hop a replica adds, a client's connection
        # spliced to the owner, which dies with the owner (what `[replicas]` does not do).
        port = free_port()
        owner = Daemon("--metrics", f"127.0.0.1:{port}", upstream=UPSTREAM)
        at = int(name[-8:], 16) % n if place is None else place  # the owner's place, as the hashed owner's
        daemons = [Forwarder(owner.port) for _ in range(n - 1)]
        daemons.insert(at, owner)
        metrics = [port]
        direct = [at]
    elif rs is not None:
        rs.start_all()
        daemons = list(rs.daemons)
        metrics = rs.metrics_ports
        direct = [rs.peers.index(owner_of(address, rs.peers))]
    else:
        for _ in range(n):
            port = free_port()
            daemons.append(Daemon("--metrics", f"127.0.0.1:{port}", upstream=UPSTREAM))
            metrics.append(port)
        direct = list(range(n))
    total = depth + live
    try:
        cpu0s = [cpu_seconds(d.proc.pid) for d in daemons]
        cpu0 = sum(cpu0s)
        consumers = []
        for k in range(PARTS):
            want = sum(1 for i in range(total) if i % PARTS == k)
            consumers.append(node("consume", "127.0.0.1", str(daemons[k % n].port), address, str(want),
                                  f"part = {k}", "500", "-", "-"))
        for c in consumers:
            assert line(c, 60).get("ready"), "a consumer did not attach"
        producer = produce(daemons[0].port, address, depth, live, rate, "-", "-") if live else None
        results = [line(c, 600) for c in consumers]
        cpu1s = [cpu_seconds(d.proc.pid) for d in daemons]
        cpu1 = sum(cpu1s)
        if producer is not None:
            assert line(producer, 60).get("accepted") == live
            producer.wait(30)
        for c in consumers:
            c.wait(30)
        if mode == "forwarded" and n > 1:
            received = metric_value(scrape(metrics[0]), "broker_filter_messages_received_total", address=address)
            handed_back = 0
        else:
            received = sum(metric_value(scrape(metrics[i]), "broker_filter_messages_received_total", address=address)
                           for i in direct)
            handed_back = sum(metric_value(scrape(p), "broker_filter_messages_handed_back", address=address)
                              for i, p in enumerate(metrics) if i not in direct)
    finally:
        for d in daemons:
            d.stop()
        RABBITMQ3.ctl("delete_queue", name)
    first = min(r["first"] for r in results)
    last = max(r["last"] for r in results)
    delivered = sum(r["received"] for r in results)
    return {
        "rate": total / max(0.001, (last - first) / 1000),
        "moves": max(0.0, received - total) / total,
        "cpu_us": (cpu1 - cpu0) / total * 1e6,
        "cpu_us_each": [round((b - a) / total * 1e6, 1) for a, b in zip(cpu0s, cpu1s)],
        "owners": direct,
        # with `[replicas]`: the owner's CPU, and the other replicas' together, per message
        "cpu_us_owner": sum(cpu1s[i] - cpu0s[i] for i in direct) / total * 1e6,
        "duplicates": delivered - total,
        "handed_back_non_owners": handed_back,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=30000)
    ap.add_argument("--live", type=int, default=6000)
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--ns", default="1,2,3,4")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="replicas,independent")
    ap.add_argument("--placements", action="store_true",
                    help="round r's queue owned by replica r mod N; CPU as the mean over the rounds")
    a = ap.parse_args()
    ns = [int(x) for x in a.ns.split(",")]
    modes = a.modes.split(",")
    rows: dict = {}
    for r in range(a.rounds):
        for n in ns:
            for mode in modes:
                if n == 1 and mode != modes[0]:
                    continue  # one daemon: the same either way
                res = one_run(n, mode, a.depth, a.live, a.rate, r % n if a.placements else None)
                print(f"round {r + 1} N={n} {mode}: {res}", flush=True)
                rows.setdefault((n, mode if n > 1 else "one"), []).append(res)
    base = statistics.median(x["rate"] for x in rows[(ns[0], "one")]) if (ns[0], "one") in rows else None
    cpu_of = statistics.mean if a.placements else statistics.median
    base_cpu = statistics.median(x["cpu_us"] for x in rows[(ns[0], "one")]) if base else None
    print()
    if a.placements:
        print("CPU with N > 1: the mean over the rounds, round r's queue owned by replica r mod N; the rest "
              "(one daemon's CPU too: it has no owner to place): medians")
    print("| replicas | mode | rate | moves per delivered message | daemon CPU per message, all replicas "
          "| of which owner / other replicas | duplicates |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (n, mode), res in rows.items():
        rate = statistics.median(x["rate"] for x in res)
        moves = statistics.median(x["moves"] for x in res)
        cpu = cpu_of(x["cpu_us"] for x in res)
        dup = max(x["duplicates"] for x in res)
        rel = f" ({rate / base:.2f}x)" if base and n > 1 else ""
        crel = f" ({cpu / base_cpu:.2f}x)" if base_cpu and n > 1 else ""
        label = {"one": "one daemon", "replicas": "`[replicas]`", "independent": "independent",
                 "forwarded": "byte forwarders to one daemon", "splice": "`[replicas]`, `splice = true`"}[mode]
        owner = cpu_of(x["cpu_us_owner"] for x in res)
        split = f"{owner:.0f} / {cpu - owner:.0f} µs" if mode != "independent" and n > 1 else "—"
        print(f"| {n} | {label} | {rate:,.0f} msg/s{rel} | {moves:.2f} | {cpu:.0f} µs{crel} | {split} | {dup} |")


if __name__ == "__main__":
    main()
