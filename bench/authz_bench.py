"""Permission checks: the cost of `Permissions.allows` against 100 security settings.

Run: .venv/bin/python bench/authz_bench.py  (prints a Markdown table; a few seconds)

The settings are a site's: 40 teams with a queue space each (`team-N.#`) and a private part
(`team-N.private.#`), 10 topic key spaces (`/topic/news-N.#`), 9 single-word patterns (`*.audit-N`)
and a catch-all `#`: 100 settings.  The addresses are spelled as clients spell them in front of
RabbitMQ (v1, v2 percent-encoded, bare).  Measured per check, best of several repeats:

* `first`: an address not seen before (canonicalised, the trie walked, the decision cached): what the
  first attach on an address costs;
* `cached`: an address seen before (a dictionary hit and a role-set test per deciding setting): every
  later attach on it;
* `wildcard`: a subscription with wildcard words (`/topic/#`, `team-3.*`), first seen: the covering
  and intersecting settings are searched linearly;
* `open`: no settings (the daemon without `[security]`).

The daemon checks once per attach (and per message only on the anonymous relay), so the figure to
relate is `first` or `cached` against the cost of one attach.  `--attach` measures that too: the
daemon's CPU per receiver attach and detach (proton's BlockingConnection, 300 links one after the
other on a topic and on a queue) in front of RabbitMQ on 127.0.0.1:5672 (guest/guest), the daemon
without `[security]`; the queue it declares is deleted afterwards.

    python bench/authz_bench.py [--attach]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_filter.authorization import OPERATIONS, Grant, Permissions  # noqa: E402

TEAMS = 40


def site() -> tuple[list[Grant], dict[str, list[str]]]:
    rows: list[tuple[str, dict[str, list[str]]]] = [("#", {"browse": ["auditor"]})]
    for n in range(TEAMS):
        team = f"team-{n}"
        rows.append((f"{team}.#", {"send": [team], "consume": [team], "browse": [team, "auditor"],
                                   "manage": [f"{team}-admin"]}))
        rows.append((f"{team}.private.#", {"send": [team], "consume": [team]}))
    for n in range(10):
        rows.append((f"/topic/news-{n}.#", {"send": ["staff"], "consume": ["staff", "auditor"], "durable": ["staff"]}))
    for n in range(9):
        rows.append((f"*.audit-{n}", {"browse": ["auditor"]}))
    assert len(rows) == 100
    grants = [Grant(i, m, {op: frozenset(g.get(op, ())) for op in OPERATIONS}) for i, (m, g) in enumerate(rows)]
    users = {f"user-{n}": [f"team-{n}", "staff"] for n in range(TEAMS)}
    users["audit"] = ["auditor"]
    return grants, users


def addresses(count: int) -> list[str]:
    out = []
    forms = ("/queue/{}", "/queues/{}", "{}", "/amq/queue/{}")
    for i in range(count):
        team = f"team-{i % TEAMS}"
        name = f"{team}.orders-{i}" if i % 3 else f"{team}.private.q{i}"
        form = forms[i % len(forms)]
        if form == "/queues/{}":
            name = name.replace(".", "%2E", 1)
        out.append(form.format(name) if i % 5 else f"/topic/news-{i % 10}.item-{i}")
    return out


def per_check(run, checks: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()  # CPU time: the machine's other load does not count
        run()
        best = min(best, time.process_time() - start)
    return best / checks * 1e6


def attach_cost(links: int = 300) -> list[tuple[str, float]]:
    """The daemon's CPU (µs) per receiver attach and detach, by address."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpu_usage import cpu_seconds
    from engine_relay_bench import delete_queue, start_daemon
    from proton.utils import BlockingConnection

    proc, port, _ = start_daemon("engine", "127.0.0.1:5672")
    out = []
    try:
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=30)
        for address in ("/topic/bench.authz.attach", "/queue/bench.authz.attach"):
            for _ in range(20):  # warm up
                conn.create_receiver(address, credit=0).close()
            start = cpu_seconds(proc.pid)
            for _ in range(links):
                conn.create_receiver(address, credit=0).close()
            out.append((address, (cpu_seconds(proc.pid) - start) / links * 1e6))
        conn.close()
    finally:
        proc.terminate()
        proc.wait(10)
        delete_queue("bench.authz.attach")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attach", action="store_true", help="also measure the daemon's CPU per attach")
    args = parser.parse_args()
    grants, users = site()
    names = addresses(20_000)
    roles = frozenset({"team-7", "staff"})

    def first() -> None:
        decide = Permissions(grants, users, "rabbitmq", cache_size=len(names))
        allows = decide.allows
        for address in names:
            allows("user-7", roles, "consume", address)

    decide = Permissions(grants, users, "rabbitmq", cache_size=len(names))
    warm = names[:1000]
    for address in warm:
        decide.allows("user-7", roles, "consume", address)

    def cached() -> None:
        allows = decide.allows
        for _ in range(20):
            for address in warm:
                allows("user-7", roles, "consume", address)

    wild = ([f"/topic/news-{i % 10}.#" for i in range(200)] + [f"team-{i % TEAMS}.*" for i in range(200)]
            + ["/topic/#"] * 100)

    uncached = Permissions(grants, users, "rabbitmq", cache_size=0)

    def wildcard() -> None:
        allows = uncached.allows
        for address in wild:
            allows("user-7", roles, "consume", address)

    opened = Permissions.open()

    def open_() -> None:
        allows = opened.allows
        for _ in range(20):
            for address in warm:
                allows("user-7", roles, "consume", address)

    compile_us = per_check(lambda: Permissions(grants, users, "rabbitmq"), 1)

    rows = [
        ("first (address not seen before)", per_check(first, len(names))),
        ("cached (address seen before)", per_check(cached, 20 * len(warm))),
        ("wildcard subscription, first seen", per_check(wildcard, len(wild))),
        ("open (no settings)", per_check(open_, 20 * len(warm))),
    ]
    print(f"100 settings, compiled in {compile_us:.0f} µs (Python {sys.version.split()[0]})\n")
    print("| check | µs per check |")
    print("|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")
    if args.attach:
        first_us = rows[0][1]
        print("\n| attach and detach, daemon without [security] | daemon CPU µs | a first check in % of it |")
        print("|---|---|---|")
        for address, us in attach_cost():
            print(f"| receiver on `{address}` | {us:.0f} | {100 * first_us / us:.2f} % |")


if __name__ == "__main__":
    main()
