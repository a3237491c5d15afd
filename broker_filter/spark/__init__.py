"""The Spark backend: selectors and filter-sets compiled to native Spark SQL Column expressions, run
over Parquet message archives (docs/archive.md) for backtests and replays, and the `broker-filter`
streaming data source and sink for live AMQP traffic (`register`).  Imports pyspark; the daemon never
imports this package."""


def register(spark):
    """Make `spark.readStream.format("broker-filter")` (and writeStream / write) known to `spark`."""
    import pyspark

    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        raise RuntimeError(f"the broker-filter streaming data source needs PySpark 4.2 or later "
                           f"(installed: {pyspark.__version__})")
    from .datasource import register as _register

    _register(spark)
