"""Helpers for the proxy tests: RabbitMQ control and `broker-filter serve` subprocesses."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RABBIT_ENV = {
    "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
    "ERL_EPMD_ADDRESS": "127.0.0.1",
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
}
RABBITMQ4_ROOT = Path(os.environ.get("BROKER_FILTER_RABBITMQ4_ROOT", "/opt/broker-filter-trixie"))


class Broker:
    """A RabbitMQ node the proxy tests use as the upstream: the system's 3.10 on 5672, or 4.0 from its
    trixie chroot on 5682 (scripts/rabbitmq4.sh controls it)."""

    def __init__(self, version: str, port: int, ctl: list[str], env: dict | None = None):
        self.version = version
        self.major = int(version.split(".")[0])
        self.port = port
        self.url = f"amqp://guest:guest@127.0.0.1:{port}"
        self._ctl = ctl
        self._env = env or {}

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """rabbitmqctl against this node."""
        return subprocess.run([*self._ctl, *args], env={**os.environ, **self._env}, capture_output=True,
                              text=True, timeout=timeout)

    def __repr__(self) -> str:
        return f"RabbitMQ {self.version} on 127.0.0.1:{self.port}"


RABBITMQ3 = Broker("3.10", 5672, ["rabbitmqctl"], RABBIT_ENV)
RABBITMQ4 = Broker("4.0", 5682, ["bash", str(ROOT / "scripts" / "rabbitmq4.sh"), "ctl"])
# Optional: the newest RabbitMQ Debian ships (4.1+: filter expressions on streams), from its own chroot.
RABBITMQ_LATEST_ROOT = Path(os.environ.get("BROKER_FILTER_RABBITMQ_LATEST_ROOT", "/opt/broker-filter-sid"))
RABBITMQ_LATEST = Broker("4.1+", 5692, ["bash", str(ROOT / "scripts" / "rabbitmq-latest.sh"), "ctl"])
# The upstream of the RabbitMQ run in progress (the `rabbitmq` fixture sets it): `Proxy()`,
# `rabbitmqctl` and `amqp10_ready` default to it.
current = RABBITMQ3


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_port(port: int, timeout: float, want: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port) == want:
            return
        time.sleep(0.2)
    raise TimeoutError(f"port {port} {'not accepting' if want else 'still accepting'} after {timeout}s")


def rabbitmqctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return current.ctl(*args, timeout=timeout)


def amqp10_ready(timeout: float = 30, broker: Broker | None = None) -> dict:
    """The broker accepts AMQP 1.0 connections; returns its open frame's properties."""
    from proton.utils import BlockingConnection

    url = (broker or current).url
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            c = BlockingConnection(url, timeout=3)
            props = {str(k): v for k, v in (c.conn.remote_properties or {}).items()}
            c.close()
            return props
        except Exception as e:  # not up yet
            last = e
            time.sleep(0.3)
    raise TimeoutError(f"RabbitMQ AMQP 1.0 on {url} not ready: {last}")


RUNNING: set = set()  # every Proxy not yet stopped (conftest stops leftovers when the session ends)


class Proxy:
    """A `broker-filter serve` subprocess."""

    def __init__(self, *args: str, upstream: str | None = ""):
        """upstream None: the embedded broker; "" (default): the RabbitMQ node of the run in progress."""
        if upstream == "":
            upstream = current.url
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"broker-filter-{uuid.uuid4().hex[:8]}.log"
        self._log = open(self.log_path, "w+")
        cmd = [sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0", *args]
        if upstream is not None:
            cmd += ["--upstream", upstream]
        self.embedded = upstream is None
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        RUNNING.add(self)
        try:
            self.port = self._wait_port()
        except BaseException:
            self.stop()  # never leave a daemon behind a failed start
            raise
        self.url = f"amqp://127.0.0.1:{self.port}"

    def _wait_port(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"listening on [^:]+:(\d+)", self.log())
            if m and ("connected (" in self.log() or self.embedded):
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"proxy did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        RUNNING.discard(self)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
