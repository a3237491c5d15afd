"""Helpers of the operations tests: the Dockerfile's instructions, and `broker-filter serve` started
the way a user starts it (a console script or scripts/serve.sh, outside this checkout's Python path)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def user_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at this checkout or configures the
    daemon: what a user's shell would have."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("BROKER_FILTER_")}
    return {**env, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A command that ends in `broker-filter serve`, its output in `log_path`; `stop()` sends SIGTERM."""

    def __init__(self, cmd: list[str], *, cwd: Path, env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output())
            if match:
                return match
            if self.proc.poll() is not None:
                raise AssertionError(f"exited with status {self.proc.returncode} before {pattern!r}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} not in the output after {timeout:.0f} s:\n{self.output()}")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def filtered_round_trip(url: str) -> list[str]:
    """Through the daemon at `url`: a receiver with the selector `color = 'red'` on a fresh queue, a
    blue and a red message sent; returns the bodies the receiver got (the red one only, if it filters)."""
    from proton import Message, Timeout
    from proton.reactor import Selector
    from proton.utils import BlockingConnection

    address = f"install-{uuid.uuid4().hex[:8]}"
    conn = BlockingConnection(url, timeout=20)
    try:
        receiver = conn.create_receiver(address, options=Selector("color = 'red'"), credit=10)
        sender = conn.create_sender(address)
        for color in ("blue", "red"):
            sender.send(Message(body=color, properties={"color": color}))
        got = []
        try:
            while len(got) < 2:
                got.append(receiver.receive(timeout=3 if got else 20).body)
                receiver.accept()
        except Timeout:
            pass
        return got
    finally:
        conn.close()


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()
