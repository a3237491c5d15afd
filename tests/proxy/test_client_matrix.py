"""docs/proxy.md's table of what each kind of client gets ("Clients: what they get") names, per row,
the test files that show it.  A cell that claims a behaviour on an upstream (anything but "—") must
be covered by a test of those files that runs on that upstream, so the table cannot claim what no
test checks.  Which upstream a test runs on comes from pytest's own collection: its parameter id
(`embedded`, `rabbitmq3`, `rabbitmq4`) or, for a test without one, the fixtures it uses
(`rabbitmq4`/`proxy4`: RabbitMQ 4.0; `rabbitmq3`: 3.10; none of them: the embedded broker)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "proxy.md"
COLUMNS = {1: "embedded", 2: "rabbitmq3", 3: "rabbitmq4"}

COLLECT = r"""
import json, sys
import pytest

class Upstreams:
    def __init__(self):
        self.items = []

    def pytest_collection_finish(self, session):
        for item in session.items:
            spec = getattr(item, "callspec", None)
            ids = spec.id if spec is not None else ""
            self.items.append({"file": item.path.name, "id": ids, "fixtures": list(item.fixturenames)})

plugin = Upstreams()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[plugin])
print("ITEMS" + json.dumps(plugin.items))
sys.exit(int(code))
"""


def table() -> list[tuple[str, list[str], list[str]]]:
    """(what the client does, the four upstream cells, the test files) for each row."""
    text = DOC.read_text()
    start = text.index("## Clients: what they get")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if line.startswith("## "):
            break
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| what the client does"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0], cells, re.findall(r"`(test_\w+\.py)`", cells[4])))
    return rows


def upstream_of(item: dict) -> str:
    for name in COLUMNS.values():
        if name in item["id"].split("-"):
            return name
    fixtures = set(item["fixtures"])
    if fixtures & {"rabbitmq4", "proxy4"}:
        return "rabbitmq4"
    if "rabbitmq3" in fixtures:
        return "rabbitmq3"
    return "embedded"


def collected(files: list[Path]) -> list[dict]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", COLLECT, *map(str, files)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ITEMS"))
    return json.loads(line[len("ITEMS"):])


def test_every_claim_of_the_client_table_is_covered_by_a_test_on_its_upstream():
    rows = table()
    assert len(rows) >= 10, "the table of docs/proxy.md was not found or lost its rows"
    paths = {p.name: p for p in (ROOT / "tests").rglob("test_*.py")}
    missing = [(what, f) for what, _, files in rows for f in files if f not in paths]
    assert not missing, f"rows name test files that do not exist: {missing}"
    assert all(files for _, _, files in rows), [what for what, _, files in rows if not files]
    items = collected(sorted({paths[f] for _, _, files in rows for f in files}))
    covered: dict[str, set[str]] = {}
    for item in items:
        covered.setdefault(item["file"], set()).add(upstream_of(item))
    gaps = []
    for what, cells, files in rows:
        runs_on = set().union(*(covered.get(f, set()) for f in files))
        for column, upstream in COLUMNS.items():
            if not cells[column].startswith("—") and upstream not in runs_on:
                gaps.append(f"{what!r} on {upstream}: {cells[column]!r} (tests run on {sorted(runs_on)})")
    assert not gaps, "claims no test checks:\n" + "\n".join(gaps)


def test_the_upstream_of_a_collected_test():
    assert upstream_of({"id": "rabbitmq4", "fixtures": ["daemon"]}) == "rabbitmq4"
    assert upstream_of({"id": "embedded-proton", "fixtures": ["daemon"]}) == "embedded"
    assert upstream_of({"id": "", "fixtures": ["rabbitmq4"]}) == "rabbitmq4"
    assert upstream_of({"id": "", "fixtures": ["embedded"]}) == "embedded"
    assert upstream_of({"id": "x", "fixtures": ["rabbitmq3"]}) == "rabbitmq3"
