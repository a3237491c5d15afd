"""The proxy's shape (docs/proxy.md "How the proxy is built"): no file over 800 lines, no class over
500, and optional parts of an upstream, a feed or a consumer declared rather than probed with
getattr/hasattr.  The files and classes not there yet are listed with the most they may have: a
ratchet, lowered as they are split, never raised."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[2] / "broker_filter" / "proxy"
MAX_FILE, MAX_CLASS = 800, 500
NOT_YET_FILES: dict[str, int] = {}  # (none left)
NOT_YET_CLASSES: dict[str, int] = {}
MAX_PROBES = 9  # getattr/hasattr calls under proxy/: by name (pass-through dispatch, journaling wrappers), a
# reason on any exception, and the tests' default handlers' vhost (101 at the start of this work; the aim was 15)


def _trees():
    for path in sorted(PROXY.glob("*.py")):
        source = path.read_text()
        yield path, source, ast.parse(source)


def test_no_proxy_file_over_800_lines():
    over = {p.name: len(s.splitlines()) for p, s, _ in _trees()
            if len(s.splitlines()) > NOT_YET_FILES.get(p.name, MAX_FILE)}
    assert not over, over


def test_no_proxy_class_over_500_lines():
    over = {}
    for path, _, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > NOT_YET_CLASSES.get(node.name, MAX_CLASS):
                    over[f"{path.name}:{node.name}"] = size
    assert not over, over


def test_getattr_probes_are_not_growing():
    probes = [f"{path.name}:{node.lineno}" for path, _, tree in _trees() for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")]
    assert len(probes) <= MAX_PROBES, probes
