"""Real parts for the proxy tests: a RabbitMQ 3.10 node (started here unless one already listens on
127.0.0.1:5672, and then stopped at the end of the session) and `broker-filter serve` subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# Tests here import the helper modules proxy_harness and proxy_clients (import-mode=importlib puts no
# test folder on the path; the names are unique so no other folder shadows them).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import RABBIT_ENV, RUNNING, UPSTREAM, Proxy, amqp10_ready, port_open, rabbitmqctl, wait_port  # noqa: E402


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


@pytest.fixture(scope="session", autouse=True)
def no_daemon_left_behind():
    """Stop any proxy a failed test did not stop."""
    yield
    for p in list(RUNNING):
        p.stop()
