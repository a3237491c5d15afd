"""Small blocking proton clients for the proxy tests."""

from __future__ import annotations

import time

from proton import Message
from proton.reactor import Filter
from proton.utils import BlockingConnection


def connect(url: str) -> BlockingConnection:
    return BlockingConnection(url, timeout=10)


def receive(receiver, count: int | None = None, idle: float = 1.0, limit: float = 20.0, accept: bool = True) -> list:
    """Messages until `count` arrived, or none came for `idle` seconds, or `limit` passed."""
    out = []
    deadline = time.monotonic() + limit
    while (count is None or len(out) < count) and time.monotonic() < deadline:
        try:
            m = receiver.receive(timeout=idle)
        except Exception as e:
            if type(e).__name__ == "Timeout":
                break
            raise
        out.append(m)
        if accept:
            receiver.accept()
    return out


def send(sender, messages) -> None:
    for m in messages:
        sender.send(m if isinstance(m, Message) else Message(**m))


def filter_option(filters: dict) -> Filter:
    """A receiver option putting `filters` (key -> proton Described) in the source filter-set."""
    return Filter(filters)
