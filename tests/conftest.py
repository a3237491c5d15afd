"""Fixtures shared by several test folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# tests/support holds what every folder shares: the daemon launcher, the AMQP clients, the RabbitMQ
# nodes (import-mode=importlib puts no test folder on the path; these module names are unique).
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from launcher import Daemon, port_open, stop_all, wait_port  # noqa: E402
from rabbitmq_nodes import RABBIT_ENV, RABBITMQ3, amqp10_ready  # noqa: E402

# Under CI (CI=true) every hypothesis test draws the same examples each run, so a red run replays and
# a green one stays green; elsewhere each run explores new examples.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    _hypothesis_settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    """Scale runs (`@pytest.mark.scale`: the deepest queues, the longest runs) only when asked for
    with `-m scale`; the suite keeps a bounded variant of each.  A module marked `broker_agnostic`
    tests the daemon's own logic (the replicas' ownership), the same whichever RabbitMQ is behind
    it: the suite runs it on RabbitMQ 3.10, and `-m broker_agnostic` (or `-m scale`) on 4.0 too."""
    marks = config.getoption("-m") or ""
    if "scale" in marks or "broker_agnostic" in marks:
        return
    skip = pytest.mark.skip(reason="a scale run: pytest -m scale (the suite runs its bounded variant)")
    skip4 = pytest.mark.skip(reason="broker-agnostic: the suite runs it on RabbitMQ 3.10 (pytest -m broker_agnostic: on 4.0 too)")
    for item in items:
        if item.get_closest_marker("scale") is not None:
            item.add_marker(skip)
        elif item.get_closest_marker("broker_agnostic") is not None and "rabbitmq4" in item.keywords:
            item.add_marker(skip4)


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
            # the conformance tables and the differential test of four dialects share this session
            "spark.driver.memory": "2g",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def rabbitmq3():
    """The system's RabbitMQ 3.10 with AMQP 1.0 on 127.0.0.1:5672 (started here unless one already
    listens, and then stopped at the end of the session unless BROKER_FILTER_KEEP_RABBITMQ is set, as
    on a machine where other test sessions share the node)."""
    started = False
    if not port_open(RABBITMQ3.port):
        if shutil.which("rabbitmq-server") is None:
            pytest.fail("rabbitmq-server is not installed (scripts/setup.sh installs it)")
        env = {**os.environ, **RABBIT_ENV}
        subprocess.run(["rabbitmq-plugins", "enable", "--offline", "rabbitmq_amqp1_0"], env=env,
                       capture_output=True, timeout=60)
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, timeout=60)
        started = True
        wait_port(RABBITMQ3.port, 60)
    amqp10_ready(60, RABBITMQ3)
    yield RABBITMQ3
    if started and not os.environ.get("BROKER_FILTER_KEEP_RABBITMQ"):
        RABBITMQ3.ctl("stop", timeout=60)
        subprocess.run(["epmd", "-kill"], capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def rabbitmq(rabbitmq3):
    """The RabbitMQ node's connection URL (tests/proxy runs its tests against RabbitMQ 3.10 and 4.0)."""
    return rabbitmq3.url


@pytest.fixture(scope="module")
def daemon():
    """One `broker-filter serve` with the embedded broker (no upstream), for a test module."""
    d = Daemon()
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


@pytest.fixture(scope="session", autouse=True)
def no_daemon_left_behind():
    """Stop any daemon a failed test did not stop."""
    yield
    stop_all()


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Path:
    """A test CA, a server certificate for 127.0.0.1/localhost, a client certificate (CN=client-1)
    and a certificate of another CA."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the openssl command is needed to generate test certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=broker-filter test CA")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=client-1")):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        extra = ["-extfile", "server.ext"] if name == "server" else []
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", *extra)
    run("req", "-x509", *ec, "-keyout", "other.key", "-out", "other.pem", "-days", "2", "-subj", "/CN=other CA")
    return d
