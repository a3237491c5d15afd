"""Memory per link with maximal selectors, measured on a real daemon (issue 43): 1,000 receivers with
distinct 4 KB selectors cost at most ~128 KiB of the daemon's RSS each, and once every link is
closed the daemon's RSS is back within ~100 MiB of where it started (the compiled-selector cache is
bounded in bytes; before, it kept every compiled selector: +263 MiB)."""

from __future__ import annotations

import time

import pytest

from clients import connect, receiver
from launcher import Daemon

pytestmark = pytest.mark.timeout(900)

LINKS = 1000
PER_CONNECTION = 250  # under limits.links_per_connection (256)
BOUND_AFTER = 100 * 2**20  # RSS after every link closed, over where it started


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def maximal(i: int, limit: int = 4096) -> str:
    """A distinct selector at the daemon's length limit (arithmetic: among the largest compiled)."""
    parts: list[str] = []
    k = 0
    while len(" AND ".join(parts + [f"a{k}+{i}*b{k} > c{k}-{k}"])) <= limit:
        parts.append(f"a{k}+{i}*b{k} > c{k}-{k}")
        k += 1
    return " AND ".join(parts)


@pytest.fixture(scope="module")
def measured() -> dict:
    """The daemon's RSS before, with `LINKS` receivers holding distinct maximal selectors, and after
    every link and connection closed."""
    daemon = Daemon()
    try:
        warm = connect(daemon.url)
        receiver(warm, "filter-memory", selector=maximal(-1)).close()  # grammar, caches, first link
        warm.close()
        start = rss(daemon.proc.pid)
        conns = [connect(daemon.url) for _ in range(LINKS // PER_CONNECTION)]
        links = []
        for i in range(LINKS):
            links.append(receiver(conns[i // PER_CONNECTION], "filter-memory", credit=0, selector=maximal(i)))
        held = rss(daemon.proc.pid)
        for link in links:
            link.close()
        for conn in conns:
            conn.close()
        probe = connect(daemon.url)  # the daemon has handled every close once it answers a new attach
        receiver(probe, "filter-memory", selector="a = 1").close()
        probe.close()
        # freed by reference counting as each link closed; the pages go back to the system within a
        # second of the last close (engine/heap.py): bounded, the first reading within the bound
        deadline = time.monotonic() + 10
        after = rss(daemon.proc.pid)
        while after - start > BOUND_AFTER and time.monotonic() < deadline:
            time.sleep(0.2)
            after = rss(daemon.proc.pid)
    finally:
        daemon.stop()
    print(f"RSS start {start / 2**20:.1f} MiB, with {LINKS} links {held / 2**20:.1f} MiB "
          f"({(held - start) / LINKS / 1024:.0f} KiB a link), after closing {after / 2**20:.1f} MiB")
    return {"start": start, "held": held, "after": after}


def test_rss_per_link_with_a_maximal_selector(measured: dict) -> None:
    """269 KiB a link before (the selector alone compiled to ~430 KiB shared with the cache); now the
    compiled selector is ~58 KiB (its property names interned: these selectors share theirs, as
    real ones do; 72 KiB with distinct names) and the link's own state the rest."""
    per_link = (measured["held"] - measured["start"]) / LINKS
    assert per_link <= 128 * 1024, per_link  # measured 104 KiB on a loaded 2-core box (134 before interning)


def test_rss_after_every_link_closed(measured: dict) -> None:
    """+129 MiB before: each closed link's feed, consumer and filter sat in reference cycles until the
    collector's next full pass, and the allocator kept the pages; now +30-60 MiB (the cache's 16 MiB
    budget of compiled selectors among it)."""
    assert measured["after"] - measured["start"] <= BOUND_AFTER, measured
