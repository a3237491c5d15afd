"""The Spark session the commands and tests use: loopback-bound when local, ANSI arithmetic off.

The master, when a command is not given `--master`: under spark-submit (or any process PySpark's
gateway started) the one spark-submit was given; else Spark's own configuration, as `spark-submit`
and `pyspark` read it (`--master` in `PYSPARK_SUBMIT_ARGS`, then `spark.master` in
`spark-defaults.conf` of `SPARK_CONF_DIR`, else of `SPARK_HOME/conf`, else of the installed
pyspark's `conf`); else `local[*]`.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Any

from ..archive import parquet as _archive
from .paths import java_reason, list_archive

LOCAL_MASTER = "local[*]"


def default_master(environ: Any = os.environ) -> str | None:
    """The master a command uses without `--master` (None: spark-submit's; see the module's doc)."""
    if environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    return configured_master(environ) or LOCAL_MASTER


def configured_master(environ: Any = os.environ) -> str | None:
    """The master Spark's configuration names for a new session, or None."""
    try:
        args = shlex.split(environ.get("PYSPARK_SUBMIT_ARGS", ""))
    except ValueError:
        args = []
    for i, arg in enumerate(args):
        if arg == "--master" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--master="):
            return arg.partition("=")[2]
    return spark_defaults(environ).get("spark.master")


def spark_defaults(environ: Any = os.environ) -> dict[str, str]:
    """The properties of the `spark-defaults.conf` spark-submit reads (empty when there is none)."""
    folder = environ.get("SPARK_CONF_DIR")
    if not folder:
        home = environ.get("SPARK_HOME")
        if not home:
            try:
                from pyspark.find_spark_home import _find_spark_home

                home = _find_spark_home()
            except (ImportError, SystemExit):  # no pyspark, or it cannot find its home (it exits)
                return {}
        folder = os.path.join(home, "conf")
    try:
        with open(os.path.join(folder, "spark-defaults.conf"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    properties = {}
    for line in lines:  # Java properties as spark-defaults.conf uses them: `key value` or `key=value`
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        found = re.match(r"([^\s=:]+)\s*[=:\s]?\s*(.*)", line)
        if found:
            properties[found[1]] = found[2].strip()
    return properties


class SessionError(RuntimeError):
    """Spark could not start a session (no Java, a master URL it cannot use): one line saying why."""


def get_session(master: str | None = LOCAL_MASTER, app_name: str = "broker-filter", **conf: str) -> Any:
    """A (possibly existing) SparkSession.  `master=None` leaves the master to spark-submit."""
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers (the streaming data source, UDFs) run this interpreter, not the first
        # `python3` on PATH, which may lack pyarrow or broker_filter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.sql.ansi.enabled": "false",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }
    if master is None or master.startswith("local"):
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # py4j's Py4JJavaError, PySpark's JAVA_GATEWAY_EXITED, ...: not ours to name
        where = master or "the master spark-submit was given"
        raise SessionError(f"Spark could not start a session on {where}: {java_reason(e)}") from None
    spark.conf.set("spark.sql.ansi.enabled", "false")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def read_archive(spark: Any, path: str) -> Any:
    """The archive at `path` (a Parquet file or a directory tree of them, a plain path or any Hadoop
    filesystem URI: broker_filter.spark.paths) as a DataFrame; ArchiveError when it is not there."""
    files = list_archive(spark, path)
    return spark.read.schema(_spark_schema(spark)).parquet(*files)


def table_frame(spark: Any, table: Any) -> Any:
    """An in-memory archive table (pyarrow, `archive.SCHEMA`) as a DataFrame."""
    return spark.createDataFrame(table)


def _spark_schema(spark: Any) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_archive.SCHEMA)
