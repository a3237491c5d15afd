"""Helpers for the streaming tests: publishing numbered messages, waiting, reading the archive."""

from __future__ import annotations

import time
import uuid

from proton import Message
from proton.utils import BlockingConnection

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
