"""The journal through `broker-filter serve`: a real daemon process, a real proton client, real files.

Accepted client publishes to journaled addresses are in the archive once each with their types; other
addresses and messages delivered to consumers are not; SIGTERM publishes the last file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from proton import Message as ProtonMessage
from proton import int32, symbol
from proton.utils import BlockingConnection

from broker_filter.amqp import types as t
from broker_filter.archive.parquet import read_messages

BIN = Path(sys.executable).with_name("broker-filter")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(journal_dir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN), "serve", "--listen", f"127.0.0.1:{port}",
         "--set", "journal.enabled=true", "--set", f"journal.directory={journal_dir}",
         "--set", "journal.addresses=orders.#,audit"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited: {proc.communicate()[0]}")
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("daemon did not listen")


def test_accepted_publishes_to_journaled_addresses_are_archived_once(tmp_path):
    journal_dir = tmp_path / "journal"
    proc, port = start(journal_dir)
    try:
        conn = BlockingConnection(f"127.0.0.1:{port}", timeout=10)
        try:
            receiver = conn.create_receiver("orders.eu", name="consumer")  # delivered messages: not journaled again
            for address in ("orders.eu", "audit", "other"):
                sender = conn.create_sender(address, name=f"p-{address}")
                for i in range(3):
                    sender.send(ProtonMessage(subject=f"{address}-{i}", properties={"n": int32(i), "k": symbol("s")},
                                              body=f"{address} {i}"))
                sender.close()
            for _ in range(3):
                receiver.receive(timeout=5)
                receiver.accept()
        finally:
            conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out

    files = sorted(journal_dir.glob("*.parquet"))
    assert files and not list(journal_dir.glob(".*")), os.listdir(journal_dir)  # published, nothing half-written
    rows = [(meta, m) for f in files for meta, m in read_messages(f)]
    got = sorted((meta["address"], m.properties.subject) for meta, m in rows)
    assert got == sorted([("orders.eu", f"orders.eu-{i}") for i in range(3)] + [("audit", f"audit-{i}") for i in range(3)])
    for _, m in rows:
        assert type(m.application_properties["n"]) is t.int32 and type(m.application_properties["k"]) is t.symbol
        assert "x-opt-broker-filter-origin" in m.message_annotations  # the bytes that reached the broker
