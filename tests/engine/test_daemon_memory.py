"""Memory that comes back: `broker-filter serve` (a subprocess, on its embedded broker) after rounds
of 1,000 receiver links with selectors attached and closed on one address (5 connections of 200
links, each link and then its connection closed).  Two rounds warm up (the interpreter, the filter
caches, the allocator's arenas: about +4 MiB); after them, each round leaves the daemon's RSS within
10% of where the warm-up left it.  A daemon that kept what a link or a connection used (about 9 KiB
per link) would grow past that within three rounds."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from proton.reactor import Selector  # the test's client only: the daemon is another process
from proton.utils import BlockingConnection

from launcher import Daemon

WARM_UP = 2
ROUNDS = int(os.environ.get("BROKER_FILTER_ROUNDS", "3"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def a_round(url: str, address: str, r: int) -> None:
    for k in range(5):  # limits.links_per_connection is 256 by default
        connection = BlockingConnection(url, timeout=30)
        try:
            links = [connection.create_receiver(address, name=f"r{r}-{k}-{i}", options=Selector(f"n = {i}"))
                     for i in range(200)]
            for link in links:
                link.close()
        finally:
            connection.close()


def test_rss_comes_back_after_rounds_of_a_thousand_links():
    daemon = Daemon()
    try:
        address = f"rounds-{uuid.uuid4().hex[:8]}"
        sizes = []
        for r in range(WARM_UP + ROUNDS):
            a_round(daemon.url, address, r)
            time.sleep(1)  # the last closes reach the daemon
            sizes.append(rss_kib(daemon.proc.pid))
        print(f"daemon RSS KiB after each round of 1,000 links: {sizes}")
        baseline = sizes[WARM_UP - 1]
        for after in sizes[WARM_UP:]:
            assert after <= baseline * 1.10, f"RSS grew past 10% of {baseline} KiB: {sizes}"
    finally:
        assert daemon.stop() == 0, daemon.log
