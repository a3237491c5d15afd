"""The README's streaming example runs as written, as `.venv/bin/python script.py` with no activated
virtualenv: the first `python3` on PATH lacks pyarrow and broker_filter, and PySpark would start the
data source's Python workers with it (issue 27, item 3).  `register(spark)` gives the workers the
driver's interpreter on a local master, and on a cluster fails at once saying what to set."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients import drain  # noqa: E402
from streamkit import properties, publish  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
SOURCE_URL, SINK_URL = "amqp://127.0.0.1:5672", "amqp://127.0.0.1:5673"

# Run after the snippet: wait until its query has moved `want` rows, then stop.
EPILOGUE = """
import os as _os, time as _time
_want = int(_os.environ["README_TEST_ROWS"])
_query = spark.streams.active[0]
_deadline = _time.monotonic() + 90
while (sum(p["numInputRows"] for p in _query.recentProgress) < _want and _query.exception() is None
       and _time.monotonic() < _deadline):
    _time.sleep(0.2)
if _query.exception() is not None:
    raise SystemExit(f"the query failed: {_query.exception()}")
_query.stop()
spark.stop()
print("README snippet done")
"""


def readme_snippet() -> str:
    """The Python block of README.md's streaming paragraph."""
    text = README.read_text()
    match = re.search(r"Live traffic goes through the `broker-filter` Structured Streaming source.*?"
                      r"```python\n(.*?)```", text, re.S)
    assert match, "README.md lacks the streaming example"
    return match.group(1)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A directory whose `python3` is this Python without any installed package (a fresh virtualenv
    without pip): what a PATH without the project's activated virtualenv offers."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True,
                   capture_output=True, timeout=120)
    python3 = venv / "bin" / "python3"
    lacks = subprocess.run([str(python3), "-c", "import pyarrow"], capture_output=True, timeout=60)
    assert lacks.returncode != 0, f"{python3} imports pyarrow: not a bare interpreter"
    return venv / "bin"


@pytest.mark.spark
def test_readme_streaming_example_runs_with_an_unactivated_virtualenv(daemon, bare_python, tmp_path):
    snippet = readme_snippet()
    assert SOURCE_URL in snippet and SINK_URL in snippet  # both ends go to the test daemon below
    script = tmp_path / "script.py"
    script.write_text(snippet.replace(SOURCE_URL, daemon.url).replace(SINK_URL, daemon.url) + EPILOGUE)
    numbers = range(60)
    publish(daemon.url, "orders", numbers)
    want = {i for i in numbers if properties(i)["region"] == "eu" and properties(i)["total"] > 100}

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(
        PATH=f"{bare_python}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        SPARK_LOCAL_IP="127.0.0.1",
        # The README's builder takes its master and settings from here, as under spark-submit.
        PYSPARK_SUBMIT_ARGS="--master local[2] --conf spark.ui.enabled=false "
                            "--conf spark.sql.shuffle.partitions=2 pyspark-shell",
        README_TEST_ROWS=str(len(want)),
    )
    started = time.monotonic()
    # Its own process group, so that a run past the limit is ended with its JVM and Python workers.
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    took = time.monotonic() - started
    errors = "\n".join(line for line in err.splitlines() if not line.startswith("\tat "))[-4000:]
    assert proc.returncode == 0 and "README snippet done" in out, (
        f"the README's streaming example failed (exit {proc.returncode} after {took:.0f} s):\n{errors}")
    # The query moved exactly the selected messages from `orders` to `eu-orders`.
    got = sorted(int(m.properties["i"]) for m in drain(daemon.url, "eu-orders"))
    assert got == sorted(want)


def test_a_worker_python_that_is_the_driver_s_own_is_kept():
    from broker_filter.spark.datasource import worker_python

    assert worker_python(SimpleNamespace(pythonExec=sys.executable, master="local[2]")) == sys.executable
    assert worker_python(SimpleNamespace(pythonExec=sys.executable, master="yarn")) == sys.executable


def test_a_worker_python_without_the_package_is_replaced_on_a_local_master(bare_python):
    from broker_filter.spark.datasource import worker_python

    sc = SimpleNamespace(pythonExec=str(bare_python / "python3"), master="local[*]")
    assert worker_python(sc) == sys.executable


def test_a_worker_python_without_the_package_on_a_cluster_fails_saying_what_to_set(bare_python):
    from broker_filter.spark.datasource import worker_python

    sc = SimpleNamespace(pythonExec=str(bare_python / "python3"), master="spark://cluster.example:7077")
    with pytest.raises(RuntimeError) as e:
        worker_python(sc)
    message = str(e.value)
    assert f"'{bare_python / 'python3'}'" in message and "cannot import pyarrow" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message
    assert "Error" not in message  # what to do, not a Python exception's name
    sc = SimpleNamespace(pythonExec="no-such-python-here", master="yarn")
    with pytest.raises(RuntimeError, match=r"'no-such-python-here' \(not on PATH\), which does not exist"):
        worker_python(sc)
