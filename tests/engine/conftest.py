"""Fixtures of the engine tests: an engine event loop serving on 127.0.0.1 in a thread."""

from __future__ import annotations

import contextlib
import json
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from broker_filter.engine.loop import EventLoop

CLIENT = Path(__file__).with_name("amqp_client.py")


class LoopThread:
    """An EventLoop running on a thread of its own; `call(fn)` runs fn on it and returns its result."""

    def __init__(self) -> None:
        self.loop = EventLoop()
        self.thread = threading.Thread(target=self.loop.run, kwargs={"poll": 0.2}, name="engine-loop", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        done = threading.Event()
        box: list = []

        def run() -> None:
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.append((False, e))
            done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(timeout), "the engine loop did not answer"
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        self.loop.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the engine loop did not stop"
        self.loop.close()


@pytest.fixture
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.stop()


def run_client(url: str, *args: str, timeout: float = 40) -> dict:
    """Run amqp_client.py in its own process; its JSON answer."""
    done = subprocess.run([sys.executable, str(CLIENT), url, *args], capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert lines, f"client printed nothing; stderr: {done.stderr[-2000:]}"
    return json.loads(lines[-1])


def start_client(url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CLIENT), url, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_attached(process: subprocess.Popen) -> None:
    """Until a `receive` client's attach is answered (its first line; bounded by the client's own
    time-outs: it prints its result and exits if the attach fails)."""
    line = process.stdout.readline()
    assert json.loads(line) == {"attached": True}, line


def client_result(process: subprocess.Popen, timeout: float = 40) -> dict:
    out, err = process.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    assert lines, f"client printed nothing; stderr: {err[-2000:]}"
    return json.loads(lines[-1])


def closed_at_once(port: int, count: int) -> int:
    """Connect `count` times; how many connections the server closed without sending a byte."""
    import socket

    closed = 0
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(10)
            try:
                closed += extra.recv(10) == b""
            except ConnectionResetError:
                closed += 1
    return closed


@contextlib.contextmanager
def descriptors(need: int):
    """Raise this process's descriptor limit to `need` (subprocesses started meanwhile inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.fail(f"this test needs {need} file descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def end_many(many: subprocess.Popen | None) -> None:
    """Close the connections of a running `many_connections.js` (its stdin ends) and wait for it."""
    if many is None or many.poll() is not None:
        return
    many.stdin.close()
    try:
        many.wait(30)
    except subprocess.TimeoutExpired:
        many.kill()


def rss_kib(pid: int | str = "self") -> int:
    """Resident memory of a process (this one by default), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
