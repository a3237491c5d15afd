"""`listener.workers`: several worker processes on one port (SO_REUSEPORT) under a supervisor, in
front of RabbitMQ 3.10.  Connections land on both workers, filtered consumers are served, SIGTERM to
the supervisor drains every worker (exit 0, nothing lost), a SIGKILLed worker is started again and
service goes on; the combinations that cannot work are refused at start naming the option."""

from __future__ import annotations

import argparse
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from proton import Message
from proton.reactor import Selector  # the test's clients only: the daemon is another process
from proton.utils import BlockingConnection

from broker_filter.config import ConfigError, add_serve_arguments, load
from clients import drain, receive_n_and_extras
from launcher import Daemon

CONNECTIONS = 12


def workers_of(pid: int) -> set[int]:
    """The live child processes of `pid`."""
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                children.add(int(entry.name))
    return children


def sockets_of(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start(rabbitmq: str) -> Daemon:
    daemon = Daemon("--workers", "2", upstream=rabbitmq)
    wait_until(lambda: daemon.log().count("connected (") >= 2, 30, "both workers' upstream connections")
    wait_until(lambda: len(workers_of(daemon.proc.pid)) == 2, 10, "two workers")
    return daemon


def serve_filtered(url: str, prefix: str) -> str:
    """On CONNECTIONS connections: a receiver with `color = 'red'` on its own queue, and a sender
    of two red and two blue messages; each receiver must get its two red ones.  Returns the queues'
    common name."""
    base = f"{prefix}-{uuid.uuid4().hex[:8]}"
    connections = [BlockingConnection(url, timeout=30) for _ in range(CONNECTIONS)]
    try:
        receivers = {}
        for i, conn in enumerate(connections):
            address = f"/queue/{base}-{i}"
            receivers[address] = conn.create_receiver(address, options=Selector("color = 'red'"), credit=10)
        for i, conn in enumerate(connections):
            sender = conn.create_sender(f"/queue/{base}-{i}")
            for n, color in enumerate(("red", "blue", "red", "blue")):
                sender.send(Message(body=f"{i}-{n}-{color}", properties={"color": color}))
        got = {a: sorted(m.body for m in receive_n_and_extras(r, 2, extra_wait=0.5, limit=30))
               for a, r in receivers.items()}
    finally:
        for conn in connections:
            conn.close()
    assert got == {f"/queue/{base}-{i}": [f"{i}-0-red", f"{i}-2-red"] for i in range(CONNECTIONS)}
    return base


def test_two_workers_share_the_port_serve_filtered_consumers_and_drain_on_sigterm(rabbitmq):
    daemon = start(rabbitmq)
    try:
        workers = workers_of(daemon.proc.pid)
        before = {pid: sockets_of(pid) for pid in workers}
        held = [BlockingConnection(daemon.url, timeout=30) for _ in range(CONNECTIONS)]
        after = {pid: sockets_of(pid) for pid in workers}
        landed = {pid: after[pid] - before[pid] for pid in workers}
        for conn in held:
            conn.close()
        assert sum(landed.values()) >= CONNECTIONS and all(n > 0 for n in landed.values()), landed

        base = serve_filtered(daemon.url, "workers")
    finally:
        status = daemon.stop()
    assert status == 0, daemon.log()
    assert "every worker stopped" in daemon.log()
    for i in range(CONNECTIONS):  # what the filters passed over is still in the queues
        left = drain(rabbitmq, f"/queue/{base}-{i}", idle=1.0, limit=30, key=lambda m: m.body)
        assert sorted(set(left)) == [f"{i}-1-blue", f"{i}-3-blue"], (i, left)


def test_a_killed_worker_is_started_again_and_service_goes_on(rabbitmq):
    daemon = start(rabbitmq)
    try:
        first = workers_of(daemon.proc.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: "exited with status -9; starting it again" in daemon.log(), 10, "the restart log line")
        replaced = wait_until(lambda: (lambda w: w if len(w) == 2 and victim not in w else None)(
            workers_of(daemon.proc.pid)), 30, "a new worker")
        assert replaced & first == first - {victim}
        wait_until(lambda: daemon.log().count("connected (") >= 3, 30, "the new worker's upstream connection")
        serve_filtered(daemon.url, "restarted")
    finally:
        status = daemon.stop()
    assert status == 0, daemon.log()


@pytest.mark.parametrize("settings, reason", [
    ([], "several workers need an upstream broker (upstream.urls): the embedded broker's addresses live in "
         "one process"),
    (["--upstream", "amqp://127.0.0.1:5672", "--set", "journal.enabled=true", "--set", "journal.directory=/tmp/j"],
     "several workers cannot share one journal (journal.enabled)"),
])
def test_combinations_that_cannot_work_are_refused_naming_the_option(settings, reason):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    with pytest.raises(ConfigError) as info:
        load(parser.parse_args(["--set", "listener.workers=2", *settings]), {})
    assert str(info.value) == f"listener.workers: {reason}"


def test_a_worker_that_cannot_start_ends_the_supervisor_with_status_1(rabbitmq):
    """Worker 0's metrics port is taken (worker 1's, the next one, is free): worker 0 fails at every
    start; after five quick failures in a row the supervisor drains worker 1 and exits 1."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = Daemon("--workers", "2", "--metrics", f"127.0.0.1:{port}", upstream=rabbitmq)
        try:
            assert daemon.proc.wait(90) == 1, daemon.log()
        finally:
            daemon.stop()
    log = daemon.log()
    assert "worker 0 failed 5 times in a row at its start; stopping every worker" in log
    assert log.count("worker 0 (pid") == 4  # four restarts before the fifth failure ends it
    assert "Traceback" not in log
