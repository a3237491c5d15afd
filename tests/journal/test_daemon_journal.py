"""The journal through `broker-filter serve`: a real daemon process, a real proton client, real files.

Accepted client publishes to journaled addresses are in the archive once each with their types; other
addresses and messages delivered to consumers are not; SIGTERM publishes the last file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from proton import Message as ProtonMessage
from proton import int32, symbol
from proton.utils import BlockingConnection

from broker_filter.amqp import types as t
from broker_filter.archive.parquet import read_messages
from launcher import Daemon

BIN = Path(sys.executable).with_name("broker-filter")


def start(journal_dir: Path) -> Daemon:
    return Daemon("--set", "journal.enabled=true", "--set", f"journal.directory={journal_dir}",
                  "--set", "journal.addresses=orders.#,audit",
                  program=[str(BIN), "serve"], start_timeout=20)


def test_accepted_publishes_to_journaled_addresses_are_archived_once(tmp_path):
    journal_dir = tmp_path / "journal"
    daemon = start(journal_dir)
    try:
        conn = BlockingConnection(f"127.0.0.1:{daemon.port}", timeout=10)
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
        status = daemon.stop(timeout=60)
    assert status == 0, daemon.log()

    files = sorted(journal_dir.glob("*.parquet"))
    assert files and not list(journal_dir.glob(".*")), os.listdir(journal_dir)  # published, nothing half-written
    rows = [(meta, m) for f in files for meta, m in read_messages(f)]
    got = sorted((meta["address"], m.properties.subject) for meta, m in rows)
    assert got == sorted([("orders.eu", f"orders.eu-{i}") for i in range(3)] + [("audit", f"audit-{i}") for i in range(3)])
    for _, m in rows:
        assert type(m.application_properties["n"]) is t.int32 and type(m.application_properties["k"]) is t.symbol
        assert "x-opt-broker-filter-origin" in m.message_annotations  # the bytes that reached the broker
