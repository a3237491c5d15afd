"""Helpers for the streaming tests: publishing numbered messages, reading them back, waiting."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from proton import Message
from proton.utils import BlockingConnection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))
from proxy_clients import receive  # noqa: E402

REGIONS = ("eu", "us", "asia")


def fresh(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def properties(i: int) -> dict:
    """The application properties of message i: a region and a total that selectors test."""
    return {"i": i, "region": REGIONS[i % 3], "total": (i * 37) % 250}


def publish(url: str, address: str, numbers) -> None:
    """Send message i (body "m<i>", properties(i)) for each i, each confirmed by the broker."""
    conn = BlockingConnection(url, timeout=20)
    try:
        snd = conn.create_sender(address)
        for i in numbers:
            snd.send(Message(body=f"m{i}", properties=properties(i), subject=f"s{i}"))
    finally:
        conn.close()


def drain(url: str, address: str, idle: float = 1.0, limit: float = 30.0) -> list[Message]:
    """Every message the address delivers until none comes for `idle` seconds (accepted)."""
    conn = BlockingConnection(url, timeout=20)
    try:
        return receive(conn.create_receiver(address, credit=100), idle=idle, limit=limit)
    finally:
        conn.close()


def wait_for(condition, limit: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")


def archived_numbers(archive) -> list[int]:
    """The `i` of every message in an archive directory, one entry per row (duplicates kept)."""
    from broker_filter.archive.parquet import read_messages

    return [int(m.application_properties["i"]) for _row, m in read_messages(archive)]
