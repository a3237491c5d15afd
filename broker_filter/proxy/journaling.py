"""The daemon's journal at the upstream boundary.

Theory of operation: `JournalingUpstream` wraps any `Upstream` and hands every message a client
published through the daemon to the journal (`broker_filter.archive.journal.Journal`) when the upstream's
outcome is *accepted*: the journal then holds exactly what reached the broker, once each, with the
bytes as sent upstream (origin annotation included).  Messages the daemon delivers to clients, and
its own republishing of held queue messages, are not journaled again; pre-settled publishes have no
outcome and are not journaled.  Everything else passes through unchanged; the journal's `record` never raises
and never blocks the event loop.
"""

from __future__ import annotations

from typing import Any, Callable

from .forwarding import Outcome
from .sender import SenderLink


class JournalingPublisher:
    def __init__(self, publisher: Any, address: str | None, journal: Any):
        self._publisher = publisher
        self._address = address
        self._journal = journal

    def send(self, data: bytes, on_settled: Callable[[Outcome], None]) -> None:
        journal, address = self._journal, self._address

        def settled(outcome: Outcome) -> None:
            if outcome.kind == "accepted":
                journal.record(address, data)
            on_settled(outcome)

        self._publisher.send(data, settled)

    def __getattr__(self, name: str) -> Any:  # credit, close, ... of the wrapped publisher
        return getattr(self._publisher, name)


class JournalingUpstream:
    def __init__(self, upstream: Any, journal: Any):
        self._upstream = upstream
        self._journal = journal

    def open_publisher(self, address: str | None, handler: Any, capabilities: tuple[str, ...] = (),
                       durable: int | None = None) -> Any:
        publisher = self._upstream.open_publisher(address, handler, capabilities, durable=durable)
        if not isinstance(handler, SenderLink):  # the proxy's own republishing (queue recycling): not new traffic
            return publisher
        return JournalingPublisher(publisher, address, self._journal)

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped upstream's
        return getattr(self._upstream, name)
