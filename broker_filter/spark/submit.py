"""The file `spark-submit` runs: the `broker-filter` command line, for the Spark commands.

spark-submit runs a Python application only from a file whose name ends in `.py` (it opens anything
else, the `broker-filter` console script included, as a JAR), so the commands that run on Spark are
submitted through this module's file:

    spark-submit --master spark://host:7077 \\
        $(python -c 'import broker_filter.spark.submit as m; print(m.__file__)') \\
        backtest --archive hdfs:///archives/orders --selector "color = 'red'"

The session then takes its master and settings from spark-submit (docs/backtest.md, "Spark").  This
file only starts the package's own `__main__` (as `python -m broker_filter` does): a launcher, not a
part of the Spark library, which never imports the command line.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """Run the command line exactly as `python -m broker_filter` does (arguments from sys.argv)."""
    runpy.run_module("broker_filter", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # Run as a script, this file's own folder (broker_filter/spark) comes first on sys.path, where its
    # modules would shadow top-level ones of the same name; the package this file belongs to comes
    # there instead.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path.insert(0, os.path.dirname(os.path.dirname(here)))
    main()
