"""rhea, an independent AMQP 1.0 implementation, as the client: publish, filtered receive, echo, refusal."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.rabbitmq, pytest.mark.node]

JS = Path(__file__).resolve().parents[1] / "js"


@pytest.fixture(scope="module")
def node():
    if shutil.which("node") is None or not (JS / "node_modules" / "rhea").is_dir():
        pytest.fail("node and rhea are required (scripts/setup.sh installs them)")
    return shutil.which("node")


def run(node, script: str, *args: str, timeout: float = 30) -> list[dict]:
    p = subprocess.run([node, str(JS / script), *args], capture_output=True, text=True, timeout=timeout)
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def test_rhea_publishes_and_receives_only_matches_with_echo(node, proxy, address):
    messages = [
        {"body": f"m{i}", "subject": "s", "application_properties": {"color": "red" if i % 3 == 0 else "blue", "i": i}}
        for i in range(12)
    ]
    sent = run(node, "send.js", str(proxy.port), f"/queue/{address}", json.dumps(messages))
    assert sent == [{"accepted": 12, "other": []}]
    lines = run(node, "receive.js", str(proxy.port), f"/queue/{address}", "color = 'red'", "4", "8000")
    attached = lines[0]["attached"]
    assert attached["filter_keys"] == ["jms-selector"]
    assert attached["selector"] == "color = 'red'"
    assert "APACHE.ORG:SELECTOR" in attached["capabilities"]
    bodies = [x["message"]["body"] for x in lines if "message" in x]
    assert bodies == ["m0", "m3", "m6", "m9"]
    assert all(x["message"]["properties"]["color"] == "red" for x in lines if "message" in x)


def test_rhea_sees_the_refusal_of_an_invalid_selector(node, proxy, address):
    lines = run(node, "receive.js", str(proxy.port), f"/queue/{address}", "color = 'red' OR", "1", "8000")
    detached = next(x["detached"] for x in lines if "detached" in x)
    assert detached["condition"] == "amqp:invalid-field"
    assert "column" in detached["description"]
    assert detached["info"] == {"field": "filter"}
    attached = next(x["attached"] for x in lines if "attached" in x)
    assert attached.get("address") is None
    assert attached["filter_keys"] == []
