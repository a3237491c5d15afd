"""`broker-filter ingest` killed mid-stream (SIGKILL to its process group: the Python driver, its JVM
and the source's Python worker) and started again from the same checkpoint: nothing lost, and only
messages of a batch whose commit had not reached the broker appear twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker_filter.archive.parquet import archive_files
from broker_filter.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients import drain  # noqa: E402
from streamkit import archived_numbers, fresh, properties, publish, wait_for  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.rabbitmq]

ROOT = Path(__file__).resolve().parents[2]
TOTAL, BATCH = 600, 100


def batch_dirs_with_files(archive: Path) -> int:
    return len({Path(f).parent for f in archive_files(archive)}) if archive.exists() else 0


def log_ids(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.exists() else set()


def test_killed_ingest_restarts_from_its_checkpoint_and_loses_nothing(spark, rabbitmq, tmp_path, capsys):
    address = f"/queue/{fresh('killed')}"
    publish(rabbitmq, address, range(TOTAL))
    archive = tmp_path / "archive"
    command = ["ingest", "--from", f"{rabbitmq}/{address}", "--archive", str(archive),
               "--max-messages-per-trigger", str(BATCH), "--trigger-seconds", "0.1"]
    log = open(tmp_path / "ingest.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "broker_filter", *command, "--master", "local[2]"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        # Kill as soon as a third batch has files: a later batch may be running, its commit not logged.
        wait_for(lambda: batch_dirs_with_files(archive) >= 3 or proc.poll() is not None, 120, "three batches",
                 poll=0.05)
        assert proc.poll() is None, (tmp_path / "ingest.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()
    assert proc.returncode == -signal.SIGKILL
    checkpoint = archive / "_checkpoint"
    logged, committed = log_ids(checkpoint / "offsets"), log_ids(checkpoint / "commits")
    before = archived_numbers(archive)
    assert len(set(before)) < TOTAL  # killed mid-stream

    # Same command, same checkpoint, in this process (the shared session), until the queue is idle.
    assert main(command + ["--idle-stop", "3"]) == 0
    assert "message(s) ingested" in capsys.readouterr().out
    numbers = archived_numbers(archive)
    assert set(numbers) == set(range(TOTAL))  # nothing lost
    duplicates = len(numbers) - TOTAL
    assert 0 <= duplicates <= BATCH  # at most the one batch whose commit had not reached the broker
    assert drain(rabbitmq, address, idle=0.5) == []  # every ingested message was accepted upstream
    # backtest reads what was ingested.
    assert main(["backtest", "--archive", str(archive), "--selector", "total > 100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["selector"]
    assert report["total"] == len(numbers)
    assert report["matched"] == sum(1 for i in numbers if properties(i)["total"] > 100)
    print(f"killed with batches logged {sorted(logged)}, committed {sorted(committed)}; "
          f"{len(before)} rows before the kill, {duplicates} duplicate(s) after the restart")

