"""`broker-filter replay` against a real proton receiver on a free loopback port."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from broker_filter.cli import main
from broker_filter.spark.replay import parse_target
from launcher import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streamkit import receivers  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture
def receiver():
    """start(reject=()) -> a Receiver on a free loopback port; all stopped at the end."""
    with receivers() as start:
        yield start


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    lines = []
    for i in range(30):
        # arrival order differs from line order: the replay must sort by arrival time
        minute = (i * 7) % 30
        lines.append({
            "address": "in",
            "arrival_time": f"2026-01-01T10:{minute:02d}:00Z",
            "message": {"application_properties": {"i": {"type": "int", "value": minute}, "even": minute % 2 == 0},
                        "properties": {"subject": f"s{minute}"}, "body": {"type": "binary", "value": "00ff"}},
        })
    src = d / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    assert main(["archive", "import", str(src), "-o", str(d / "archive")]) == 0
    return d


def test_replay_sends_matches_in_order_and_resumes_after_a_rejection(archive, receiver, spark, capsys):
    r = receiver(reject={10})
    state = archive / "state.json"
    args = ["replay", "--archive", str(archive / "archive"), "--selector", "even", "--to",
            f"amqp://127.0.0.1:{r.port}/backfill", "--state", str(state), "--no-progress", "--window", "3"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "rejected" in err and "run again to resume" in err
    saved = json.loads(state.read_text())
    assert saved["sent"] == 5 and not saved["done"]  # 0, 2, 4, 6, 8 confirmed before 10 was refused
    assert [m.properties["i"] for m in r.accepted] == [0, 2, 4, 6, 8]
    assert main(args) == 0
    assert [m.properties["i"] for m in r.accepted] == list(range(0, 30, 2))
    m = r.accepted[0]
    assert m.subject == "s0" and bytes(m.body) == b"\x00\xff" and type(m.properties["i"]).__name__ == "int32"
    assert set(r.addresses) == {"backfill"}
    assert json.loads(state.read_text())["done"] is True
    assert main(args) == 0  # nothing more to send
    assert "already complete: 15" in capsys.readouterr().out
    assert len(r.accepted) == 15


def test_replay_refuses_bad_targets_and_unreachable_receivers(archive, capsys, spark):
    base = ["replay", "--archive", str(archive / "archive"), "--selector", "i > 25", "--no-progress"]
    assert main(base + ["--to", "http://x/y"]) == 2
    assert main(base + ["--to", "amqp://127.0.0.1:5"]) == 2
    assert "no address" in capsys.readouterr().err
    state = archive / "unreachable.json"
    assert main(base + ["--to", f"amqp://127.0.0.1:{free_port()}/q", "--state", str(state), "--timeout", "5"]) == 1
    assert "confirmed" in capsys.readouterr().err
    assert json.loads(state.read_text())["sent"] == 0


def test_parse_target():
    t = parse_target("amqp://guest:pw@localhost:5673//queue/q1")
    assert (t.url, t.address) == ("amqp://guest:pw@localhost:5673", "/queue/q1")
    assert parse_target("amqps://h/a").url == "amqps://h:5671"


def test_replay_takes_the_amqp_sql_dialect(archive, receiver, spark, capsys):
    """`--dialect amqp-sql`: `%` is modulo and `p.subject` the properties section's subject, which
    the JMS dialect reads neither way."""
    r = receiver()
    args = ["replay", "--archive", str(archive / "archive"), "--dialect", "amqp-sql",
            "--selector", "i % 5 = 0 AND p.subject <> 's10'", "--to", f"amqp://127.0.0.1:{r.port}/sql",
            "--state", str(archive / "sql-state.json"), "--no-progress"]
    assert main(args) == 0
    assert "5 message(s) sent" in capsys.readouterr().out
    assert [m.properties["i"] for m in r.accepted] == [0, 5, 15, 20, 25]
    assert main(args + ["--dialect", "jms", "--restart"]) == 2  # not a JMS selector
    assert "broker-filter replay: " in capsys.readouterr().err
    assert len(r.accepted) == 5
