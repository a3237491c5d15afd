"""The Spark session the commands and tests use: loopback-bound when local, ANSI arithmetic off."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..archive import parquet as _archive


def get_session(master: str | None = "local[*]", app_name: str = "broker-filter", **conf: str) -> Any:
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
    spark = builder.getOrCreate()
    spark.conf.set("spark.sql.ansi.enabled", "false")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def read_archive(spark: Any, path: str) -> Any:
    """The archive at `path` (a Parquet file or a directory tree of them) as a DataFrame."""
    files = _archive.archive_files(path)
    if not files:
        raise _archive.ArchiveError(f"{path}: no Parquet files in the archive")
    return spark.read.schema(_spark_schema(spark)).parquet(*files)


def table_frame(spark: Any, table: Any) -> Any:
    """An in-memory archive table (pyarrow, `archive.SCHEMA`) as a DataFrame."""
    return spark.createDataFrame(table)


def _spark_schema(spark: Any) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_archive.SCHEMA)
