"""Real parts for the proxy tests: `broker-filter serve` subprocesses in front of the RabbitMQ node of
tests/conftest.py's `rabbitmq` fixture."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

# Tests here import the helper modules proxy_harness and proxy_clients (import-mode=importlib puts no
# test folder on the path; the names are unique so no other folder shadows them).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_harness import RUNNING, Proxy  # noqa: E402


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
