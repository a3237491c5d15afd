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
import tempfile
import uuid
from pathlib import Path

import pytest

import rabbitmq_nodes as nodes  # tests/support, on the path from tests/conftest.py
from launcher import ROOT, Daemon, free_port, port_open
from rabbitmq_nodes import RABBITMQ3, RABBITMQ4, RABBITMQ4_ROOT, RABBITMQ_LATEST, RABBITMQ_LATEST_ROOT, amqp10_ready


def _chroot_node(broker, root: Path, script: str, give_up, missing: str, check):
    """Yield `broker`, a RabbitMQ node in a chroot at `root`, started by scripts/`script` unless a node
    already listens on its port (and then stopped at the end of the session, unless
    BROKER_FILTER_KEEP_RABBITMQ is set).  `give_up(reason)` (pytest.fail or pytest.skip) when it is
    not installed (`missing` says so), does not start, or `check(open frame properties)` names a
    problem."""
    control = ["bash", str(ROOT / "scripts" / script)]
    started = False
    if not port_open(broker.port):
        if not (root / "usr/sbin/rabbitmq-server").exists():
            give_up(missing)
        out = subprocess.run([*control, "start"], capture_output=True, text=True, timeout=120)
        started = True
        if out.returncode != 0:
            subprocess.run([*control, "stop"], capture_output=True, timeout=120)
            give_up(f"RabbitMQ {broker.version} did not start: {out.stdout}{out.stderr}")
    try:
        try:
            props = amqp10_ready(60, broker)
        except TimeoutError as e:
            give_up(str(e))
        problem = check(props)
        if problem:
            give_up(f"the node on 127.0.0.1:{broker.port} is {props.get('product')} {props.get('version')}, {problem}")
        yield broker
    finally:
        if started and not os.environ.get("BROKER_FILTER_KEEP_RABBITMQ"):
            out = subprocess.run([*control, "stop"], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="session")
def rabbitmq4():
    """RabbitMQ 4.0 from its trixie chroot on 127.0.0.1:5682 (node rabbit4@localhost, distribution
    port 25682): started by scripts/rabbitmq4.sh unless a node already listens there."""
    missing = f"RabbitMQ 4.0 is not installed: no chroot at {RABBITMQ4_ROOT} (scripts/setup-rabbitmq4.sh installs it)"
    if os.environ.get("BROKER_FILTER_RABBITMQ4") == "0":
        give_up, missing = pytest.skip, f"{missing}; BROKER_FILTER_RABBITMQ4=0"
    else:
        give_up, missing = pytest.fail, f"{missing}; set BROKER_FILTER_RABBITMQ4=0 to skip the RabbitMQ 4.0 tests"
    yield from _chroot_node(RABBITMQ4, RABBITMQ4_ROOT, "rabbitmq4.sh", give_up, missing,
                            lambda props: None if str(props.get("version", "")).startswith("4.") else "not RabbitMQ 4")


def _at_least_4_1(props: dict) -> str | None:
    major, _, rest = str(props.get("version", "")).partition(".")
    minor = rest.partition(".")[0]
    if major.isdigit() and minor.isdigit() and (int(major), int(minor)) >= (4, 1):
        return None
    return "not RabbitMQ 4.1+"


@pytest.fixture(scope="session")
def rabbitmq_latest():
    """The newest RabbitMQ Debian ships (4.1 or later: it applies filter expressions on streams), on
    127.0.0.1:5692 from its own chroot: optional, so every test on it is skipped, with the reason,
    where it is not installed (`scripts/rabbitmq-latest.sh install`) or does not start."""
    yield from _chroot_node(RABBITMQ_LATEST, RABBITMQ_LATEST_ROOT, "rabbitmq-latest.sh", pytest.skip,
                            f"RabbitMQ 4.1+ is not installed (no chroot at {RABBITMQ_LATEST_ROOT}; optional: "
                            "scripts/rabbitmq-latest.sh install)", _at_least_4_1)


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


@pytest.fixture(scope="session")
def management_node():
    """RabbitMQ 3.10 with its management plugin, on ports of its own (the shared 3.10 node has none),
    for the tests of what the daemon declares through its HTTP API (`upstream.management_url`); its
    directory is one the node's own user can reach (not under pytest's private temp dir)."""
    node = nodes.ManagementNode(Path(tempfile.mkdtemp(prefix="broker-filter-rabbitmq-")), free_port(), free_port(),
                                free_port())
    node.start()
    yield node
    node.stop()
