"""The file `spark-submit` runs: the `broker-filter` command line, for the Spark commands.

spark-submit runs a Python application only from a file whose name ends in `.py` (it opens anything
else, the `broker-filter` console script included, as a JAR), so the commands that run on Spark are
submitted through this module's file:

    spark-submit --master spark://host:7077 \\
        $(python -c 'import broker_filter.spark.submit as m; print(m.__file__)') \\
        backtest --archive hdfs:///archives/orders --selector "color = 'red'"

The session then takes its master and settings from spark-submit (docs/backtest.md, "Spark").
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from broker_filter.cli import main as cli_main

    return cli_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    # Run as a script, this file's own folder (broker_filter/spark) comes first on sys.path, where its
    # modules would shadow top-level ones of the same name; the package this file belongs to comes
    # there instead.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path.insert(0, os.path.dirname(os.path.dirname(here)))
    sys.exit(main())
