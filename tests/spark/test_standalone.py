"""The pipeline on a real standalone Spark cluster: a master and a worker started from pyspark's own
launcher on 127.0.0.1, `backtest` and `replay` submitted with spark-submit (the archive as a `file://`
URI), and `backtest` picking the cluster from `spark-defaults.conf`, each answering exactly what the
shared `local[2]` session answers."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from broker_filter.cli import main
from launcher import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streamkit import receivers  # noqa: E402

# Three drivers and their executors on a fresh cluster: well under 2 minutes on an idle 2-core machine,
# but each JVM start takes far longer on a loaded one.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

LINES = [
    {"address": "orders", "arrival_time": f"2026-01-01T{10 + i % 3}:{(i * 7) % 60:02d}:00Z",
     "message": {"application_properties": {"i": {"type": "int", "value": i}, "color": ["red", "blue"][i % 2]}}}
    for i in range(12)
] + [{"address": "audit", "arrival_time": "2026-01-01T12:30:00Z", "message": {"header": {"priority": 9}}}]
FILTERS = {"red": "color = 'red'", "late": "i > 6", "urgent": "JMSPriority >= 7"}
SPARK_HOME = Path(__import__("pyspark").__file__).parent
SUBMIT_FILE = __import__("broker_filter.spark.submit").spark.submit.__file__
# The test's frames are tiny: interpreted expressions beat compiling Java for every projection, and
# short-lived JVMs start faster with the client compiler only.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN", "spark.executor.memory": "512m",
        "spark.driver.extraJavaOptions": QUICK_JVM, "spark.executor.extraJavaOptions": QUICK_JVM}


def _master_state(ui: str) -> dict | None:
    """The master's state (its web UI's /json/), None while it does not answer it yet (while starting,
    the UI answers every path with its HTML page)."""
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=5) as reply:
            return json.load(reply)
    except (OSError, ValueError):
        return None


def _wait(what: str, ready, processes: dict, log: Path, timeout: float = 120.0):
    """Poll `ready()` until it answers (bounded); fail at once, with the log, if a daemon exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = ready()
        if answer:
            return answer
        for name, process in processes.items():
            if process.poll() is not None:
                pytest.fail(f"the Spark {name} exited ({process.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)  # polling a bounded condition, not waiting for time to pass
    pytest.fail(f"no {what} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """spark://127.0.0.1:PORT with one worker (1 core), stopped (with its executors) at the end."""
    root = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_DAEMON_MEMORY": "512m", "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM, "PYSPARK_PYTHON": sys.executable}
    port, ui_port = free_port(), free_port()
    url, ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
    log = root / "cluster.log"
    processes: dict[str, subprocess.Popen] = {}

    def start(name: str, *args: str) -> None:
        with open(log, "ab") as out:  # each daemon in its own process group: the worker's executors too
            processes[name] = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env, cwd=root,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui_port))
        _wait("master answering on its web UI", lambda: _master_state(ui), processes, log)
        start("worker", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
              "--memory", "1g", "--work-dir", str(root / "work"), "--webui-port", str(free_port()))
        _wait("worker registered", lambda: (_master_state(ui) or {}).get("aliveworkers"), processes, log)
        yield {"url": url, "ui": ui, "env": env, "root": root}
    finally:
        for process in reversed(processes.values()):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """An archive of two Parquet files, with what readers must skip beside them."""
    d = tmp_path_factory.mktemp("standalone-archive")
    for part, lines in enumerate((LINES[:7], LINES[7:])):
        src = d / f"in{part}.jsonl"
        src.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
        assert main(["archive", "import", str(src), "-o", str(d / "archive" / f"day{part}"), "--no-progress"]) == 0
    (d / "archive" / "_temporary").mkdir()
    (d / "archive" / "_temporary" / "half.parquet").write_bytes(b"not parquet")
    (d / "archive" / ".hidden.parquet").write_bytes(b"not parquet")
    (d / "filters.json").write_text(json.dumps(FILTERS), encoding="utf-8")
    return d


def submit(cluster, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    conf = [item for key, value in CONF.items() for item in ("--conf", f"{key}={value}")]
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster["url"], "--driver-memory", "1g", *conf,
               SUBMIT_FILE, *args]
    return subprocess.run(command, env=env or cluster["env"], cwd=cluster["root"], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def local_report(archive, spark):
    """The backtest's report on the shared local[2] session."""
    argv = ["backtest", "--archive", str(archive / "archive"), "--filters", str(archive / "filters.json"), "--json",
            "--no-progress"]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    report = json.loads(buffer.getvalue())
    assert (report["red"]["matched"], report["red"]["total"], report["urgent"]["matched"]) == (6, 13, 1)
    return report


def test_backtest_submitted_with_a_file_uri_counts_as_local(cluster, archive, local_report):
    uri = (archive / "archive").as_uri()
    assert uri.startswith("file:///")
    done = submit(cluster, "backtest", "--archive", uri, "--filters", str(archive / "filters.json"), "--json",
                  "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == local_report


def test_replay_submitted_with_a_file_uri_sends_what_local_sends(cluster, archive, spark):
    argv = ["replay", "--selector", "i >= 3", "--no-progress", "--window", "4"]
    with receivers() as start:
        here, there = start(), start()
        assert main([*argv, "--archive", str(archive / "archive"), "--state", str(archive / "local-state.json"),
                     "--to", f"amqp://127.0.0.1:{here.port}/backfill"]) == 0
        done = submit(cluster, *argv, "--archive", (archive / "archive").as_uri(), "--state",
                      str(archive / "cluster-state.json"), "--to", f"amqp://127.0.0.1:{there.port}/backfill")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "9 message(s) sent" in done.stdout
    sent = [m.properties["i"] for m in here.accepted]
    assert sorted(sent) == list(range(3, 12)) and [m.properties["i"] for m in there.accepted] == sent


def test_backtest_takes_the_master_of_spark_defaults(cluster, archive, local_report):
    conf = cluster["root"] / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "spark-defaults.conf").write_text(
        f"# the cluster, as an operator configures it\nspark.master  {cluster['url']}\n"
        + "".join(f"{key} {value}\n" for key, value in CONF.items()))
    def runs() -> int:
        return [a["name"] for a in _master_state(cluster["ui"])["completedapps"]].count("broker-filter backtest")

    before = runs()
    done = subprocess.run(
        [sys.executable, "-m", "broker_filter", "backtest", "--archive", (archive / "archive").as_uri(), "--filters",
         str(archive / "filters.json"), "--json", "--no-progress"],
        env={**cluster["env"], "SPARK_CONF_DIR": str(conf)}, cwd=cluster["root"], capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == local_report
    assert runs() == before + 1  # it ran on the cluster, not on local[*]
