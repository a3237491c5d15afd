"""The Spark backend: selectors and filter-sets compiled to native Spark SQL Column expressions, run
over Parquet message archives (docs/archive.md) for backtests and replays, and the `broker-filter`
streaming data source and sink for live AMQP traffic (`register`).  Imports pyspark; the daemon never
imports this package."""


def register(spark):
    """Make `spark.readStream.format("broker-filter")` (and writeStream / write) known to `spark`.

    Spark runs the source and sink in Python workers started with the interpreter the SparkContext
    was created with (`PYSPARK_PYTHON`, else the first `python3` on PATH), which need not be this one.
    If that interpreter cannot import what the workers need, the data source's workers run this
    interpreter instead on a local master; on a cluster, RuntimeError says what to set
    `PYSPARK_PYTHON` to (`datasource.worker_python`)."""
    import pyspark

    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        raise RuntimeError(f"the broker-filter streaming data source needs PySpark 4.2 or later "
                           f"(installed: {pyspark.__version__})")
    from .datasource import register as _register

    _register(spark)
