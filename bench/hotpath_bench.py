"""The daemon's per-message path in memory: CPU per upstream message, without sockets or scheduling.

`bench/proxy_bench.py` measures the daemon on the wire, where the machine's noise (other processes,
how many messages a loop turn finds) moves its CPU per message by 10-20% from round to round.  This
bench takes the noise out to compare two versions of the code: the proxy (`ProxyServer` on
`EngineContainer`, upstream `RemoteUpstream`) relays a topic subscription with the selector
`half = 1` between a broker and a client made of engine objects, all in one process and pumped in
memory (the harness of tests/engine/test_typed_memory.py).  The broker sends N messages shaped as
RabbitMQ 3.10 delivers the rhea producer's (header, properties, application properties `half` and
`i`, a 64-byte data body) as fast as the proxy's credit allows; the client grants credit in batches
and accepts what it gets.  The figure is the process's CPU time per upstream message: the proxy's
path plus the in-memory broker's and client's (the same in both versions, so a difference between
two versions is the proxy's).  Each round runs in a process of its own; with `--against ROOT` the
rounds alternate between this checkout and ROOT and the medians are compared.

    python bench/hotpath_bench.py [--messages 20000] [--rounds 5] [--against /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 250  # the client's credit per grant


def _messages(n: int) -> list[bytes]:
    from broker_filter.amqp import types as t
    from broker_filter.amqp.sections import encode_section

    header = encode_section(0x70, [False, t.ubyte(4)])
    properties = b"\x00\x53\x73\x45"  # an empty list, as RabbitMQ 3.10 writes it
    body = b"\x00\x53\x75\xa0\x40" + b"x" * 64
    return [header + properties + encode_section(0x74, {"half": t.int32(i % 2), "i": t.int32(i)}) + body
            for i in range(n)]


def child(count: int) -> dict:
    """One round in this process: CPU seconds for `count` upstream messages after a warm-up."""
    sys.path.insert(0, str(Path.cwd()))
    from tests.engine.test_typed_memory import Relayed

    relayed = Relayed()
    relayed.client.accept = True
    link = relayed.receiver("/topic/hotpath", "half = 1")
    sender = relayed.broker.senders[-1]

    def run(messages: list[bytes]) -> None:
        i = 0
        for _ in range(4 * len(messages) // BATCH + 100):  # bounded: each turn moves a batch
            if i >= len(messages):
                return
            link.flow(BATCH)
            relayed.settle()
            k = 0
            while sender.credit > 0 and k < 2 * BATCH and i < len(messages):
                sender.send(messages[i])
                i += 1
                k += 1
            relayed.settle()
            relayed.client.messages.clear()
        raise RuntimeError(f"the relay stalled after {i} of {len(messages)} messages")

    warm = _messages(2000)
    messages = _messages(count)
    run(warm)
    outcomes = len(relayed.broker.outcomes)
    t0 = time.process_time()
    run(messages)
    seconds = time.process_time() - t0
    settled = len(relayed.broker.outcomes) - outcomes
    relayed.upstream.stop()
    if settled != count:
        raise RuntimeError(f"the broker got {settled} outcomes for {count} messages")
    return {"us_per_msg": seconds * 1e6 / count, "settled": settled}


def one(root: Path, count: int) -> dict:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--messages", str(count)],
                         cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"a round in {root} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", type=Path, help="another checkout to compare with, round by round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.messages)))
        return 0
    roots = {"this": ROOT}
    if args.against is not None:
        roots["against"] = args.against.resolve()
    runs: dict[str, list[float]] = {name: [] for name in roots}
    for n in range(args.rounds):
        names = list(roots) if n % 2 == 0 else list(reversed(roots))
        for name in names:
            r = one(roots[name], args.messages)
            runs[name].append(r["us_per_msg"])
            print(f"round {n + 1} {name:8} {r['us_per_msg']:6.2f} µs per upstream message", flush=True)
    print(f"\nmedians of {args.rounds} rounds of {args.messages} messages (selector 'half = 1', in memory):")
    for name, root in roots.items():
        print(f"  {name:8} {statistics.median(runs[name]):6.2f} µs per upstream message "
              f"({min(runs[name]):.2f}-{max(runs[name]):.2f})  {root}")
    if "against" in roots:
        ratio = statistics.median(runs["this"]) / statistics.median(runs["against"])
        print(f"  this / against: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
