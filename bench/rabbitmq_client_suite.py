"""RabbitMQ's Python AMQP 1.0 client runs its own test suite against RabbitMQ 4.0 directly and through
the daemon in front of it (pass-through logins); prints both counts and the tests that pass directly
and fail through the daemon (issue 29).

The suite is the client's (github.com/rabbitmq/rabbitmq-amqp-python-client, `tests/`), run as a
measurement and never copied into the project: give the client's git directory (`--repo`) and a
Python that has the client, pytest and pytest-asyncio installed (`--python`), e.g.

    python3 -m venv /tmp/rmqc-venv
    /tmp/rmqc-venv/bin/pip install rabbitmq-amqp-python-client pytest pytest-asyncio requests pika pyjwt
    python bench/rabbitmq_client_suite.py --repo /path/to/rabbitmq-amqp-python-client/.git

The suite names `localhost:5672` in its fixtures and tests; a temporary copy of it has that replaced by
the address under test (RabbitMQ 4.0 on 127.0.0.1:5682, or the daemon).  Tests that need the
broker's HTTP API (15672), OAuth2 or TLS fail both ways and are not counted against the daemon.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def suite_copy(repo: str, port: int, into: Path) -> Path:
    """The client's tests/ (and what they import) from `repo`'s HEAD, pointed at `port`."""
    archive = subprocess.run(["git", "--git-dir", repo, "archive", "HEAD", "tests", "pyproject.toml"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for f in (into / "tests").rglob("*.py"):
        text = f.read_text()
        new = re.sub(r"(localhost|127\.0\.0\.1):5672\b", f"127.0.0.1:{port}", text)
        if new != text:
            f.write_text(new)
    return into


def run_suite(python: str, repo: str, port: int, timeout: float) -> dict[str, str]:
    """test id -> passed / failed / skipped."""
    with tempfile.TemporaryDirectory(prefix="rmqc-suite-") as tmp:
        where = suite_copy(repo, port, Path(tmp))
        report = Path(tmp) / "report.xml"
        # (a test the daemon fails by hanging, e.g. a client reconnecting forever, is bounded by
        # pytest-timeout when the Python has it)
        bound = ["--timeout=60"] if _has_timeout(python) else []
        run = subprocess.run([python, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", *bound,
                              f"--junitxml={report}"], cwd=where, capture_output=True, text=True, timeout=timeout)
        if not report.exists():
            raise SystemExit(f"the suite on port {port} left no report:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
        results = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case}
            results[name] = ("failed" if kinds & {"failure", "error"} else
                             "skipped" if "skipped" in kinds else "passed")
        return results


def _has_timeout(python: str) -> bool:
    return subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="the client's git directory")
    ap.add_argument("--python", default="/tmp/rmqc-venv/bin/python", help="a Python with the client and pytest")
    ap.add_argument("--upstream", default="127.0.0.1:5682", help="RabbitMQ 4.0's AMQP address")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds each run of the suite may take")
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)

    direct = run_suite(args.python, args.repo, int(port), args.timeout)
    print(f"passed directly: {sum(r == 'passed' for r in direct.values())} of {len(direct)}", flush=True)
    listen = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="rmqc-daemon-", suffix=".log", delete=False)
    daemon = subprocess.Popen([sys.executable, "-m", "broker_filter", "serve", "--listen", f"127.0.0.1:{listen}",
                               "--upstream", f"amqp://guest:guest@{host}:{port}",
                               "--set", "upstream.credentials=pass-through"],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "connected (" not in Path(log.name).read_text():
            if time.monotonic() > deadline or daemon.poll() is not None:
                print(Path(log.name).read_text())
                return 1
            time.sleep(0.1)
        through = run_suite(args.python, args.repo, listen, args.timeout)
    finally:
        daemon.terminate()
        daemon.wait(30)

    passed_direct = {t for t, r in direct.items() if r == "passed"}
    passed_through = {t for t, r in through.items() if r == "passed"}
    print(f"tests run: {len(direct)} directly, {len(through)} through the daemon")
    print(f"passed directly: {len(passed_direct)}")
    print(f"passed through the daemon: {len(passed_through)}")
    lost = sorted(passed_direct - passed_through)
    print(f"pass directly, fail through the daemon: {len(lost)}")
    for t in lost:
        print(f"  {t}")
    gained = sorted(passed_through - passed_direct)
    if gained:
        print(f"pass through the daemon only: {len(gained)}")
        for t in gained:
            print(f"  {t}")
    print(f"daemon log: {log.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
