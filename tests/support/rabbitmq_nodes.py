"""The RabbitMQ nodes the tests use as upstreams: the system's 3.10 on 5672, 4.0 from its trixie
chroot on 5682 (scripts/rabbitmq4.sh controls it), and optionally the newest Debian ships on 5692
(scripts/rabbitmq-latest.sh)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RABBIT_ENV = {
    "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
    "ERL_EPMD_ADDRESS": "127.0.0.1",
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
}
RABBITMQ4_ROOT = Path(os.environ.get("BROKER_FILTER_RABBITMQ4_ROOT", "/opt/broker-filter-trixie"))


class Broker:
    """A RabbitMQ node: its version, AMQP port and URL, and rabbitmqctl against it."""

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
# The node of the RabbitMQ run in progress (tests/proxy's `rabbitmq_broker` fixture sets it):
# `rabbitmqctl` and `amqp10_ready` default to it.
current = RABBITMQ3


def rabbitmqctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return current.ctl(*args, timeout=timeout)


def bound_queues(node: "Broker | None", exchange: str, key: str) -> list[str]:
    """The queues bound to `exchange` with `key` on `node` (None: the current node), asked with
    rabbitmqctl (which does not count as a use of the queues)."""
    out = (node or current).ctl("list_bindings", "-q", "source_name", "destination_name", "routing_key").stdout
    return [cols[1] for cols in (line.split("\t") for line in out.splitlines())
            if len(cols) == 3 and cols[0] == exchange and cols[2] == key]


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


class ManagementNode(Broker):
    """A RabbitMQ 3.10 node of a test's own with the management plugin (its HTTP API on loopback),
    the system's installation under another node name, ports and data directory: started by
    `start()` (about 5 s), stopped and removed by `stop()`."""

    def __init__(self, base: Path, port: int, http_port: int, dist_port: int):
        self.base = base
        self.http_port = http_port
        self.name = f"bf-management-{port}@localhost"
        self.env = {
            **RABBIT_ENV,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
        }
        super().__init__("3.10", port, ["rabbitmqctl", "-n", self.name], self.env)
        self.management_url = f"http://127.0.0.1:{http_port}"

    def start(self, timeout: float = 90) -> None:
        import shutil
        import urllib.request

        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {self.http_port}\n")
        (self.base / "enabled_plugins").write_text("[rabbitmq_amqp1_0,rabbitmq_management].\n")
        if os.geteuid() == 0 and shutil.which("chown"):  # Debian's rabbitmq-server runs the node as `rabbitmq`
            subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(self.base)], capture_output=True, timeout=30)
        subprocess.run(["rabbitmq-server", "-detached"], env={**os.environ, **self.env}, check=True, timeout=60)
        deadline = time.monotonic() + timeout
        while True:
            try:
                request = urllib.request.Request(self.management_url + "/api/overview",
                                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
                with urllib.request.urlopen(request, timeout=3):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"RabbitMQ node {self.name}'s management API did not answer")
                time.sleep(0.3)
        amqp10_ready(timeout, self)

    def stop(self) -> None:
        import shutil

        self.ctl("stop", timeout=60)
        shutil.rmtree(self.base, ignore_errors=True)
