"""rhea, an independent AMQP 1.0 implementation, against the embedded daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.node

JS = Path(__file__).resolve().parents[1] / "js"


def test_rhea_scenarios(daemon):
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "rhea").is_dir():
        pytest.fail("node and rhea are required (scripts/setup.sh installs them)")
    p = subprocess.run([node, str(JS / "embedded_scenarios.js"), str(daemon.port), "rhea"],
                       capture_output=True, text=True, timeout=60)
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    results = {r.get("scenario", "error"): r for r in lines}
    assert p.returncode == 0 and "error" not in results, (p.stdout, p.stderr)
    assert results["topic"]["a"] == ["t1", "t2"] and results["topic"]["b"] == ["t1", "t2"]
    assert results["wildcards"]["all"] == ["uk", "uk.sport", "news"]
    assert results["wildcards"]["sport"] == ["uk.sport"]
    assert results["selector"]["red"] == [1, 3, 5] and results["selector"]["rest"] == [0, 2, 4]
    assert results["selector"]["echo"] == ["jms-selector"]
    assert sorted(results["competing"]["a"] + results["competing"]["b"]) == [0, 1, 2, 3]
    assert len(results["competing"]["a"]) == 2 and len(results["competing"]["b"]) == 2
    assert results["fqqn"]["two"] == ["to-two"]
