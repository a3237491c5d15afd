"""The Spark backend: selectors and filter-sets compiled to native Spark SQL Column expressions, run
over Parquet message archives (docs/archive.md) for backtests and replays.  Imports pyspark; the
daemon never imports this package."""
