"""Fixtures shared by several test folders."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (local[2]) for every test that needs one: starting one costs ~10 s."""
    from broker_filter.spark.session import get_session

    # Test frames are tiny: interpreted expressions beat compiling Java for every projection.
    session = get_session(
        "local[2]",
        app_name="broker-filter-tests",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
