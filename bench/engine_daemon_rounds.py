"""The daemon's memory over rounds of receiver links attached and closed.

Each round: 5 connections to `broker-filter serve`, 200 receivers each on one topic with a selector
(`n = i`), every link closed, then the connection; the daemon's RSS (from /proc) is printed after
each round.

    python bench/engine_daemon_rounds.py [--rounds 4]

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from proton.reactor import Selector
    from proton.utils import BlockingConnection
    from launcher import Daemon
    from rabbitmq_nodes import RABBITMQ3

    proxy = Daemon(upstream=RABBITMQ3.url)
    try:
        topic = f"/topic/rounds-{uuid.uuid4().hex[:8]}"
        sizes = [rss_mib(proxy.proc.pid)]
        for r in range(options.rounds):
            for k in range(5):  # limits.links_per_connection is 256 by default
                connection = BlockingConnection(proxy.url, timeout=30)
                links = [connection.create_receiver(topic, name=f"r{r}-{k}-{i}", options=Selector(f"n = {i}"))
                         for i in range(200)]
                for link in links:
                    link.close()
                connection.close()
            time.sleep(1)
            sizes.append(rss_mib(proxy.proc.pid))
        print(f"daemon RSS MiB before and after each round of 1,000 links: {sizes}")
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
