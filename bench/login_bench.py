"""A login flood from one address against `broker-filter serve`, and another address's logins meanwhile.

Run: .venv/bin/python bench/login_bench.py [--wait] [--tree PATH]  (prints a Markdown table; ~30 s)

The daemon (this tree's code, or `--tree`'s) serves five PLAIN users with scrypt hashes of the default
cost, no upstream (the embedded broker), metrics on.  From 127.0.0.2 (loopback is 127.0.0.0/8) the
flood opens `--count` connections (150) in `--seconds` (3), each sending a wrong PLAIN password;
each hangs up at once, or with `--wait` waits for its answer (up to 10 s).  Meanwhile users log in
from 127.0.0.1 with proton's BlockingConnection, one every 0.5 s from 0.5 s into the flood: the time
to their connection's open is the bystander's figure.  Measured too: the daemon's CPU seconds from
the flood's start to 10 s after its end (`/proc/PID/stat`), and the login counters of its metrics.

    python bench/login_bench.py                 # this tree
    python bench/login_bench.py --tree ../main  # another tree's code, for a comparison
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USERS = ("alice", "bob", "carol", "dave", "erin")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--wait", action="store_true", help="flood connections wait for their answer")
    parser.add_argument("--tree", default=str(ROOT), help="the broker-filter source tree to run")
    parser.add_argument("--flood-port", type=int, help=argparse.SUPPRESS)  # (the flood's own process)
    options = parser.parse_args()
    tree = str(Path(options.tree).resolve())
    sys.path.insert(0, tree)
    if options.flood_port:
        return _flood(options)
    from proton.utils import BlockingConnection

    from broker_filter.security import hash_password

    users = ", ".join(f'{u} = "{hash_password(u + "-secret")}"' for u in USERS)
    log = tempfile.NamedTemporaryFile("w+", prefix="login-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0",
                             "--set", f"listener.users={{{users}}}", "--set", "listener.allow_anonymous=false",
                             "--metrics", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    try:
        port, metrics = _started(log.name, proc)
        clock_tick = os.sysconf("SC_CLK_TCK")

        def cpu() -> float:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / clock_tick

        cpu_before = cpu()
        # the flood in a process of its own: its threads do not hold up the bystander's client here
        flooder = subprocess.Popen([sys.executable, __file__, "--flood-port", str(port), "--tree", tree,
                                    "--count", str(options.count), "--seconds", str(options.seconds)]
                                   + (["--wait"] if options.wait else []), stdout=subprocess.PIPE, text=True)
        took: list = []
        for user in USERS:
            time.sleep(0.5)
            start = time.monotonic()
            try:
                BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=30, user=user, password=user + "-secret",
                                   allowed_mechs="PLAIN").close()
                took.append(time.monotonic() - start)
            except Exception as e:  # noqa: BLE001 - a failed login is the figure
                took.append(f"failed after {time.monotonic() - start:.1f} s ({str(e)[:60]})")
        outcomes = json.loads(flooder.communicate(timeout=60)[0])
        time.sleep(10)
        cpu_spent = cpu() - cpu_before
        counters = _counters(metrics)
    finally:
        proc.terminate()
        proc.wait(30)
    times = [t for t in took if isinstance(t, float)]
    print(f"| flood ({options.count} wrong logins in {options.seconds:g} s from 127.0.0.2, "
          f"{'waiting for answers' if options.wait else 'each hanging up at once'}) | value |")
    print("|---|---|")
    print(f"| bystander logins from 127.0.0.1 (s) | {', '.join(f'{t:.2f}' if isinstance(t, float) else t for t in took)} |")
    if times:
        print(f"| bystander median / max (s) | {statistics.median(times):.2f} / {max(times):.2f} |")
    print(f"| daemon CPU, flood + 10 s (s) | {cpu_spent:.2f} |")
    print(f"| flood clients saw | {', '.join(f'{k}: {v}' for k, v in sorted(outcomes.items()))} |")
    print(f"| daemon counted | {', '.join(f'{k}: {v:g}' for k, v in sorted(counters.items())) or 'nothing'} |")
    print(f"| code | {tree} |")
    return 0


def _flood(options: argparse.Namespace) -> int:
    from broker_filter.security import SaslClientExchange

    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def attempt(i: int) -> None:
        client = SaslClientExchange("alice", f"guess-{i}")
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.2", 0))
                sock.settimeout(10)
                sock.connect(("127.0.0.1", options.flood_port))
                sock.sendall(client.data_to_send())
                while options.wait and not (client.done or client.failed):
                    data = sock.recv(4096)
                    if not data:
                        break
                    client.receive(data)
            code = re.search(r"code (\d)", client.reason)
            key = "hung up" if not options.wait else ("ok" if client.done else
                                                      f"outcome {code.group(1)}" if code else "closed")
        except OSError as e:
            key = type(e).__name__
        with lock:
            outcomes[key] = outcomes.get(key, 0) + 1

    threads = []
    for i in range(options.count):
        started = time.monotonic()
        thread = threading.Thread(target=attempt, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(max(0.0, options.seconds / options.count - (time.monotonic() - started)))
    for thread in threads:
        thread.join(30)
    print(json.dumps(outcomes))
    return 0


def _started(log_path: str, proc: subprocess.Popen) -> tuple[int, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = Path(log_path).read_text()
        port = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
        metrics = re.search(r"metrics and health endpoints on (http://[^ ]+?) ", text)
        if port and metrics:
            return int(port.group(1)), metrics.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited:\n{text}")
        time.sleep(0.1)
    raise SystemExit("the daemon did not start within 60 s")


def _counters(metrics: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("broker_filter_login_failures_total", "broker_filter_authentication_failures_total",
                            "broker_filter_connections_refused_total")):
            name, value = line.rsplit(" ", 1)
            out[name.replace("broker_filter_", "").replace("_total", "")] = float(value)
    return out


if __name__ == "__main__":
    sys.exit(main())
