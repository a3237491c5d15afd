"""The daemon's CPU per published message at saturation, this checkout beside another (`--against`,
e.g. /work/main without the admission check of broker_filter/proxy/admission.py), in front of RabbitMQ
3.10 (127.0.0.1:5672), where the check runs on every message.

Each round starts `broker-filter serve` from one checkout, publishes `--messages` messages as fast as
the daemon grants credit (one proton sender on a connection of its own, to a fresh /queue/<name>) and
reads the daemon's user + system CPU time from /proc before and after; rounds alternate between the
checkouts and the medians are compared.  The messages are shaped as a JMS client's: properties with a
message-id, `to` and a creation-time, application properties with an int, a long, a double and a
string, a 100-byte data body (their numbers put zero bytes in the sections, so the check's item walk
runs too; `--plain`: a string id, one string application property and a string body instead).  The
machine may be shared: compare the ratio of one run.

    python bench/publish_cost_bench.py [--messages 20000] [--rounds 3] [--against /work/main]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

sys.path.insert(0, str(ROOT / "tests" / "support"))

from engine_relay_bench import start_daemon  # noqa: E402
from rabbitmq_nodes import RABBITMQ3  # noqa: E402


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _publish(url: str, address: str, n: int, plain: bool = False) -> None:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    class Sender(MessagingHandler):
        def __init__(self):
            super().__init__()
            self.sent = self.settled = 0

        def on_start(self, event):
            self.conn = event.container.connect(url)
            event.container.create_sender(self.conn, address)

        def on_sendable(self, event):
            while event.sender.credit and self.sent < n:
                if plain:
                    m = Message(id=f"ID:bench-{self.sent}", address=address, properties={"kind": "order"},
                                body="x" * 100)
                else:
                    m = Message(id=f"ID:bench-{self.sent}", address=address, creation_time=time.time(),
                                properties={"n": self.sent, "big": 2**40 + self.sent, "price": 12.5,
                                            "kind": "order"}, body=b"x" * 100)
                event.sender.send(m)
                self.sent += 1

        def on_settled(self, event):
            self.settled += 1
            if self.settled == n:
                self.conn.close()

    Container(Sender()).run()


def one_round(root: Path, n: int, plain: bool = False) -> float:
    proc, port, log = start_daemon("engine", "127.0.0.1:5672", root=root)
    try:
        address = f"/queue/bench-publish-{uuid.uuid4().hex[:8]}"
        _publish(f"amqp://127.0.0.1:{port}", address, 200)  # warm up (and declare the queue)
        before = _cpu(proc.pid)
        _publish(f"amqp://127.0.0.1:{port}", address, n, plain)
        used = _cpu(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(30)
        log.unlink(missing_ok=True)
    RABBITMQ3.ctl("delete_queue", address.rsplit("/", 1)[1])
    return used / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", type=Path, default=None)
    ap.add_argument("--plain", action="store_true", help="messages of strings only (no numbers in the sections)")
    args = ap.parse_args()
    targets = {"this checkout": ROOT}
    if args.against is not None:
        targets[f"{args.against}"] = args.against.resolve()
    runs: dict[str, list[float]] = {name: [] for name in targets}
    for r in range(args.rounds):
        for name, root in targets.items():
            runs[name].append(one_round(root, args.messages, args.plain))
            print(f"round {r + 1}: {name}: {runs[name][-1]:.1f} µs CPU per message", flush=True)
    for name, values in runs.items():
        print(f"{name}: median {statistics.median(values):.1f} µs CPU per published message "
              f"({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
