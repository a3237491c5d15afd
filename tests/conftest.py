"""Fixtures shared by several test folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (local[2]) for every test that needs one: starting one costs ~10 s."""
    from broker_filter.spark.session import get_session

    # Test frames are tiny: interpreted expressions beat compiling Java for every projection.
    session = get_session(
        "local[2]",
        app_name="broker-filter-tests",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def rabbitmq():
    """A RabbitMQ node with AMQP 1.0 on 127.0.0.1:5672 (started here unless one already listens, and
    then stopped at the end of the session unless BROKER_FILTER_KEEP_RABBITMQ is set, as on a machine
    where other test sessions share the node); its connection URL."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "proxy"))
    from proxy_harness import RABBIT_ENV, UPSTREAM, amqp10_ready, port_open, rabbitmqctl, wait_port

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
    if started and not os.environ.get("BROKER_FILTER_KEEP_RABBITMQ"):
        rabbitmqctl("stop", timeout=60)
        subprocess.run(["epmd", "-kill"], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def daemon():
    """One `broker-filter serve` with the embedded broker (no upstream), for a test module."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "embedded"))
    from embedkit import Daemon

    d = Daemon()
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()
