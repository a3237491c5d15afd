"""What the daemon's links are doing, for people and for the metrics: each client link's filters and
their cost (`GET /links`, `broker-filter links`), and the filter counters by address and kind.

Read on the daemon's own thread (the HTTP thread asks the loop and waits: `LinksEndpoint`); every
figure comes from plain counters the message path keeps on each `Outlet` (`evaluated`, `matched`,
`eval_ns`: one evaluation in `EVAL_SAMPLE` timed and scaled)."""

from __future__ import annotations

import hashlib
import heapq
import threading
from typing import Callable

from .forwarding import Outlet

# The kinds a link's filter counts under in the metrics' `kind` label (a filter of several entries: "and").
FILTER_KINDS = frozenset({"selector", "sql", "direct", "topic", "headers", "no-local", "or", "and", "not",
                          "properties", "application-properties", "xquery", "other"})
LINKS_LIMIT = 10_000  # records in one /links answer (then `truncated`)


def local_kind(outlet: Outlet) -> str | None:
    """The kind the link's filter evaluated here counts under; None for a link without one."""
    return entries_kind(outlet.filter.entries)


def filter_text(outlet: Outlet) -> str:
    return " AND ".join(e.filter.description for e in outlet.filter.entries) or "TRUE"


def short_text(text: str, width: int = 60) -> str:
    """A filter's text for a label: at most `width` characters and a short hash of the whole."""
    digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
    return f"{text[:width]}{'…' if len(text) > width else ''} #{digest}"


class FilterTotals:
    """Counts of links that are gone, so the counters stay monotonic: (address, kind) -> [evaluated,
    matched, ns]."""

    def __init__(self) -> None:
        self.retired: dict[tuple[str, str], list[int]] = {}

    def retire(self, address: str | None, outlet: Outlet) -> None:
        kind = local_kind(outlet)
        if kind is None:
            return
        t = self.retired.setdefault((address or "", kind), [0, 0, 0])
        t[0] += outlet.evaluated
        t[1] += outlet.matched
        t[2] += outlet.eval_ns

    def retire_feed(self, address: str | None, kind: str | None, counts: tuple[int, int]) -> None:
        """A feed's upstream consumer that evaluated pushed-down filters in process is gone."""
        if kind is None:
            return
        t = self.retired.setdefault((address or "", kind), [0, 0, 0])
        t[0] += counts[0]
        t[1] += counts[1]

    def totals(self, live: list[tuple[str | None, Outlet]],
               feeds: list[tuple[str | None, str, tuple[int, int]]] = ()) -> dict[tuple[str, str], tuple[int, int, float]]:
        out = {k: list(v) for k, v in self.retired.items()}
        for address, kind, (e, m) in feeds:
            t = out.setdefault((address or "", kind), [0, 0, 0])
            t[0] += e
            t[1] += m
        for address, o in live:
            kind = local_kind(o)
            if kind is None:
                continue
            t = out.setdefault((address or "", kind), [0, 0, 0])
            t[0] += o.evaluated
            t[1] += o.matched
            t[2] += o.eval_ns
        return {k: (e, m, ns / 1e9) for k, (e, m, ns) in out.items()}


def entries_kind(entries: tuple) -> str | None:
    """The kind filter entries count under (several: "and"); None for none."""
    if not entries:
        return None
    kind = entries[0].kind if len(entries) == 1 else "and"
    return kind if kind in FILTER_KINDS else "other"


def costliest(live: list[tuple[str | None, Outlet]], n: int) -> list[tuple[str, str, str]]:
    """(address, kind, label text) of the `n` live links whose filters took the most time."""
    timed = [(o.eval_ns, i, a, o) for i, (a, o) in enumerate(live) if o.eval_ns and local_kind(o)]
    return [(a or "", local_kind(o) or "other", short_text(filter_text(o)))
            for _, _, a, o in heapq.nlargest(n, timed)]


class LinksEndpoint:
    """`GET /links` from the HTTP thread: the report is made on the daemon's loop (`call`: the
    loop's thread-safe call) and handed back; None if the loop does not answer within `timeout`."""

    def __init__(self, call: Callable[[Callable[[], None]], None], report: Callable[[], dict],
                 timeout: float = 5.0):
        self._call = call
        self._report = report
        self._timeout = timeout

    def __call__(self) -> dict | None:
        done = threading.Event()
        box: list = []

        def make() -> None:
            try:
                box.append(self._report())
            finally:
                done.set()

        self._call(make)
        if not done.wait(self._timeout) or not box:
            return None
        return box[0]


__all__ = ["FILTER_KINDS", "FilterTotals", "LINKS_LIMIT", "LinksEndpoint", "costliest", "filter_text",
           "local_kind", "short_text"]
