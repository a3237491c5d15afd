"""Real parts for the proxy tests: a RabbitMQ 3.10 node (started here unless one already listens on
127.0.0.1:5672, and then stopped at the end of the session) and `broker-filter serve` subprocesses."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Tests here import the helper module proxy_clients (import-mode=importlib puts no test folder on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
RABBIT_ENV = {
    "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
    "ERL_EPMD_ADDRESS": "127.0.0.1",
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
}
UPSTREAM = "amqp://guest:guest@127.0.0.1:5672"


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
    return subprocess.run(["rabbitmqctl", *args], env={**os.environ, **RABBIT_ENV}, capture_output=True,
                          text=True, timeout=timeout)


def amqp10_ready(timeout: float = 30) -> None:
    """Port 5672 accepts and speaks AMQP 1.0 (the plugin is up)."""
    from proton.utils import BlockingConnection

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            BlockingConnection(UPSTREAM, timeout=3).close()
            return
        except Exception as e:  # not up yet
            last = e
            time.sleep(0.3)
    raise TimeoutError(f"RabbitMQ AMQP 1.0 not ready: {last}")


@pytest.fixture(scope="session")
def rabbitmq():
    """A RabbitMQ node with AMQP 1.0 on 127.0.0.1:5672."""
    started = False
    if not port_open(5672):
        if shutil.which("rabbitmq-server") is None:
            pytest.fail("rabbitmq-server is not installed (scripts/setup.sh installs it)")
        env = {**os.environ, **RABBIT_ENV}
        subprocess.run(["rabbitmq-plugins", "enable", "--offline", "rabbitmq_amqp1_0"], env=env,
                       capture_output=True, timeout=60)
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, timeout=60)
        started = True
        wait_port(5672, 60)
    amqp10_ready(60)
    yield UPSTREAM
    if started:
        rabbitmqctl("stop", timeout=60)
        subprocess.run(["epmd", "-kill"], capture_output=True, timeout=30)


class Proxy:
    """A `broker-filter serve` subprocess."""

    def __init__(self, *args: str, upstream: str = UPSTREAM):
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"broker-filter-{uuid.uuid4().hex[:8]}.log"
        self._log = open(self.log_path, "w+")
        cmd = [sys.executable, "-m", "broker_filter", "serve", "--listen", "127.0.0.1:0", "--upstream", upstream, *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.port = self._wait_port()
        self.url = f"amqp://127.0.0.1:{self.port}"

    def _wait_port(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"listening on [^:]+:(\d+)", self.log())
            if m and "connected (" in self.log():
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"proxy did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def proxy(rabbitmq):
    p = Proxy()
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture
def address():
    """A fresh queue name per test."""
    return f"q-{uuid.uuid4().hex[:10]}"
