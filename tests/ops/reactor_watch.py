"""Runs `broker-filter <args>` (the console entry point) and, when the process exits, writes to the
file named by BROKER_FILTER_TEST_REACTOR_REPORT every proton reactor module it imported, each with
the stack that imported it.  BROKER_FILTER_TEST_PRELOAD names a module to import first (the test's
control: a module known to pull the reactor in)."""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import traceback

WATCHED = ("proton.reactor", "proton._reactor")
seen: dict[str, str] = {}


class Watch:
    """A meta-path finder that finds nothing: it only notes who imports a watched module."""

    def find_spec(self, name, path=None, target=None):
        if name in WATCHED and name not in seen:
            seen[name] = "".join(traceback.format_stack(limit=12)[:-1])
        return None


def report() -> None:
    loaded = {name: seen.get(name, "(loaded before the watch)") for name in WATCHED if name in sys.modules}
    with open(os.environ["BROKER_FILTER_TEST_REACTOR_REPORT"], "w", encoding="utf-8") as f:
        json.dump(loaded, f)


if __name__ == "__main__":
    sys.meta_path.insert(0, Watch())
    atexit.register(report)
    if os.environ.get("BROKER_FILTER_TEST_PRELOAD"):
        importlib.import_module(os.environ["BROKER_FILTER_TEST_PRELOAD"])
    from broker_filter.cli import main

    raise SystemExit(main(sys.argv[1:]))
