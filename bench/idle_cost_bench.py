"""What idle clients cost the daemon: CPU while 1,000 AMQP connections with 2,000 filtered receiving
links stay attached and no message moves, in front of RabbitMQ 3.10 (127.0.0.1:5672).

rhea opens the connections (tests/js/many_connections.js: each connection a session and two
receivers on `/topic/idle-<i % 10>` with the selectors `k = 0` and `k = 1`, credit 1); once every
link is attached and the daemon has settled (`--settle` seconds), the daemon's user + system CPU
(from /proc) is read over `--seconds` of idleness, `--rounds` times.  The figure is the daemon's
share of one core; the target is what an idle daemon must stay under whatever its handler layer:
work per loop turn must not grow with the links attached (heartbeats and timers only).  A daemon
with no client at all is measured the same way first, as the floor.

    python bench/idle_cost_bench.py [--connections 1000] [--links 2] [--seconds 20] [--rounds 3] [--metrics] [--json]

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest) and rhea (tests/js/node_modules).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from cpu_usage import cpu_seconds  # noqa: E402
from engine_relay_bench import start_daemon  # noqa: E402

TARGET_PERCENT = 0.5  # of one core, 1,000 idle connections with 2,000 filtered links


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idle_share(pid: int, seconds: float) -> float:
    """The process's CPU over `seconds` of wall time, in percent of one core."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", default="127.0.0.1:5672")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--links", type=int, default=2, help="filtered receivers per connection")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle time measured per round")
    parser.add_argument("--settle", type=float, default=5.0, help="wait after the last attach")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metrics", action="store_true",
                        help="with the metrics exporter on (its once-a-second snapshot walks the feeds and links)")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()

    settings = [f"limits.connections={options.connections + 100}"]
    if options.metrics:
        settings.append(f"metrics.listen=127.0.0.1:{free_port()}")
    proc, port, log = start_daemon("engine", options.upstream, settings=tuple(settings))
    clients = None
    try:
        time.sleep(options.settle)
        floor = [idle_share(proc.pid, options.seconds) for _ in range(options.rounds)]
        clients = subprocess.Popen(
            ["node", str(ROOT / "tests/js/many_connections.js"), str(port), str(options.connections),
             "/topic/idle-", str(options.links), "k = {k}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT / "tests/js")
        opened = json.loads(clients.stdout.readline())
        if opened["failed"]:
            raise RuntimeError(f"connections failed: {opened}")
        attached = json.loads(clients.stdout.readline())["attached"]  # every receiver's attach answered
        time.sleep(options.settle)
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited:\n{log.read_text()[-2000:]}")
        loaded = [idle_share(proc.pid, options.seconds) for _ in range(options.rounds)]
        clients.stdin.write("\n")
        clients.stdin.flush()
        alive = json.loads(clients.stdout.readline())["alive"]
    finally:
        if clients is not None:
            clients.stdin.close()
            clients.wait(timeout=30)
        proc.terminate()
        proc.wait(timeout=30)
    result = {
        "connections": options.connections, "links": attached, "metrics": options.metrics, "alive_after": alive,
        "seconds": options.seconds, "rounds": options.rounds,
        "floor_percent": round(statistics.median(floor), 3),
        "idle_percent": round(statistics.median(loaded), 3),
        "idle_range": [round(min(loaded), 3), round(max(loaded), 3)],
        "target_percent": TARGET_PERCENT,
    }
    result["met"] = result["idle_percent"] <= TARGET_PERCENT and alive == options.connections
    if options.json:
        print(json.dumps(result))
    else:
        print(f"metrics exporter {'on' if options.metrics else 'off'}")
        print(f"daemon CPU, no clients:                       {result['floor_percent']:.3f}% of a core")
        print(f"daemon CPU, {options.connections} idle connections, {attached} filtered links: "
              f"{result['idle_percent']:.3f}% of a core (rounds {result['idle_range'][0]:.3f}-"
              f"{result['idle_range'][1]:.3f}); target <= {TARGET_PERCENT}%: {'met' if result['met'] else 'NOT met'}")
        print(f"connections still open after: {alive} of {options.connections}")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
