"""Real parts for the proxy tests: RabbitMQ nodes and `broker-filter serve` subprocesses.

Every test on the `rabbitmq` fixture runs twice, against RabbitMQ 3.10 (the system's node on
127.0.0.1:5672, tests/conftest.py's `rabbitmq3`) and RabbitMQ 4.0 (from its chroot on
127.0.0.1:5682, marked `rabbitmq4`).  A node already listening is reused; one started here is
stopped when the session ends, unless BROKER_FILTER_KEEP_RABBITMQ is set (as on a machine where
other test sessions share the nodes).  Without the 4.0 chroot the 4.0 runs fail, unless
BROKER_FILTER_RABBITMQ4=0 says it is not wanted: then they are skipped."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

import rabbitmq_nodes as nodes  # tests/support, on the path from tests/conftest.py
from launcher import ROOT, Daemon, port_open
from rabbitmq_nodes import RABBITMQ3, RABBITMQ4, RABBITMQ4_ROOT, amqp10_ready


@pytest.fixture(scope="session")
def rabbitmq4():
    """RabbitMQ 4.0 from its trixie chroot on 127.0.0.1:5682 (node rabbit4@localhost, distribution
    port 25682): started by scripts/rabbitmq4.sh unless a node already listens there."""
    control = ["bash", str(ROOT / "scripts" / "rabbitmq4.sh")]
    started = False
    if not port_open(RABBITMQ4.port):
        if not (RABBITMQ4_ROOT / "usr/sbin/rabbitmq-server").exists():
            reason = (f"RabbitMQ 4.0 is not installed: no chroot at {RABBITMQ4_ROOT} "
                      "(scripts/setup-rabbitmq4.sh installs it)")
            if os.environ.get("BROKER_FILTER_RABBITMQ4") == "0":
                pytest.skip(f"{reason}; BROKER_FILTER_RABBITMQ4=0")
            pytest.fail(f"{reason}; set BROKER_FILTER_RABBITMQ4=0 to skip the RabbitMQ 4.0 tests")
        out = subprocess.run([*control, "start"], capture_output=True, text=True, timeout=120)
        started = True
        if out.returncode != 0:
            subprocess.run([*control, "stop"], capture_output=True, timeout=120)
            pytest.fail(f"RabbitMQ 4.0 did not start: {out.stdout}{out.stderr}")
    try:
        props = amqp10_ready(60, RABBITMQ4)
        if not str(props.get("version", "")).startswith("4."):
            pytest.fail(f"the node on 127.0.0.1:{RABBITMQ4.port} is {props.get('product')} "
                        f"{props.get('version')}, not RabbitMQ 4")
        yield RABBITMQ4
    finally:
        if started and not os.environ.get("BROKER_FILTER_KEEP_RABBITMQ"):
            out = subprocess.run([*control, "stop"], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="session", params=["3.10", pytest.param("4.0", marks=pytest.mark.rabbitmq4)],
                ids=["rabbitmq3", "rabbitmq4"])
def rabbitmq_broker(request):
    """The RabbitMQ node of this run (3.10, then 4.0): `rabbitmqctl` uses it."""
    broker = request.getfixturevalue("rabbitmq3" if request.param == "3.10" else "rabbitmq4")
    nodes.current = broker
    yield broker
    nodes.current = RABBITMQ3


@pytest.fixture(scope="session")
def rabbitmq(rabbitmq_broker):
    """The AMQP URL of the RabbitMQ node of this run."""
    return rabbitmq_broker.url


def _serve(upstream: str):
    p = Daemon(upstream=upstream)
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture(scope="module")
def proxy(rabbitmq):
    """A daemon in front of the RabbitMQ node of this run."""
    yield from _serve(rabbitmq)


@pytest.fixture(scope="module")
def proxy4(rabbitmq4):
    """A daemon in front of RabbitMQ 4.0, for what only RabbitMQ 4 has (v2 addresses)."""
    yield from _serve(rabbitmq4.url)


@pytest.fixture(scope="module", params=[
    "embedded",
    pytest.param("rabbitmq3", marks=pytest.mark.rabbitmq),
    pytest.param("rabbitmq4", marks=[pytest.mark.rabbitmq, pytest.mark.rabbitmq4]),
])
def daemon(request):
    """A daemon on the embedded broker, on RabbitMQ 3.10 and on 4.0 (the filtex tests); `forms` are
    the topic and the queue address forms of its upstream."""
    if request.param != "embedded":
        broker = request.getfixturevalue(request.param)
        p = Daemon(upstream=broker.url)
        forms = ("/topic/{}", "/queue/{}")
    else:
        p = Daemon()
        forms = ("multicast://{}", "anycast://{}")
    p.forms = forms
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


@pytest.fixture
def address():
    """A fresh queue name per test."""
    return f"q-{uuid.uuid4().hex[:10]}"
