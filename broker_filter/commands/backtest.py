"""`broker-filter backtest`: run filters over a message archive on Spark and report what they select."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..filters import DIALECTS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "backtest",
        help="evaluate filters over a Parquet message archive on Spark",
        description="Evaluate named filters over a message archive (docs/archive.md) on Spark and report, "
        "per filter, the messages matched, the selectivity and the counts per address and per hour. "
        "Filters compile to native Spark SQL expressions with the daemon's semantics (docs/backtest.md).",
    )
    p.add_argument("--archive", required=True, metavar="PATH",
                   help="archive directory or Parquet file: a path or any Hadoop filesystem URI (hdfs://, s3a://, file://)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--selector", metavar="S", help="one selector (reported as 'selector')")
    which.add_argument(
        "--filter-set",
        metavar="JSON",
        help='one filter-set in the JSON form, e.g. {"f": {"descriptor": "apache.org:selector-filter:string", '
        '"value": "a = 1"}} (reported as \'filter-set\')',
    )
    which.add_argument(
        "--filters",
        metavar="FILE",
        help="a JSON object of named filters: each value is selector text or a filter-set object",
    )
    p.add_argument("--dialect", default="jms", choices=sorted(DIALECTS), help="selector dialect (default jms)")
    p.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default: under spark-submit, the master it was given; else spark.master of "
        "Spark's configuration; else local[*])",
    )
    p.add_argument("--output", metavar="DIR",
                   help="write each filter's matching messages to DIR/<name>/ as Parquet (a path or a Hadoop URI)")
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by filter name")
    p.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML report: messages matched and total per hour, selectivity per filter",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the Spark tasks done)")
    p.set_defaults(func=run)


def load_filters(args: argparse.Namespace) -> dict[str, Any]:
    """name -> compiled core Filter (selector) or FilterSet; raises FilterError / ValueError."""
    from ..filters import compile_filter_set, compile_selector

    if args.selector is not None:
        return {"selector": compile_selector(args.selector, args.dialect)}
    if args.filter_set is not None:
        return {"filter-set": compile_filter_set(args.filter_set, args.dialect)}
    try:
        with open(args.filters, encoding="utf-8") as f:
            spec = json.load(f)
    except OSError as e:
        raise ValueError(f"{args.filters}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{args.filters}: not JSON: {e}") from None
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"{args.filters}: expected a JSON object of named filters")
    out = {}
    for name, value in spec.items():
        try:
            if isinstance(value, str):
                out[name] = compile_selector(value, args.dialect)
            elif isinstance(value, dict):
                out[name] = compile_filter_set(value, args.dialect)
            else:
                raise ValueError("a filter is selector text or a filter-set object")
        except ValueError as e:
            describe = getattr(e, "describe", None)
            raise ValueError(f"filter {name!r}: {describe() if describe else e}") from None
    return out


def spark_filters(filters: dict[str, Any], dialect: str) -> dict[str, Any]:
    from ..filters import FilterSet
    from ..spark.compile import compile_filter_set, compile_selector

    context: dict = {}
    out = {}
    for name, f in filters.items():
        if isinstance(f, FilterSet):
            out[name] = compile_filter_set(f, dialect, context)
        else:
            out[name] = compile_selector(f.ast, context)
    return out


def master_of(args: argparse.Namespace) -> str | None:
    """`--master`, else spark-submit's, else Spark's configuration's, else local[*] (spark.session)."""
    if args.master:
        return args.master
    from ..spark.session import default_master

    return default_master()


def open_session(args: argparse.Namespace, command: str) -> Any:
    """The Spark session of a command, or None after printing why it could not start (one line)."""
    from ..spark.session import SessionError, get_session

    try:
        return get_session(master_of(args), app_name=f"broker-filter {command}")
    except SessionError as e:
        print(f"broker-filter {command}: {e}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from ..archive.parquet import ArchiveError

    try:
        filters = load_filters(args)
    except ValueError as e:
        describe = getattr(e, "describe", None)
        print(f"broker-filter backtest: {describe() if describe else e}", file=sys.stderr)
        caret = getattr(e, "caret", None)
        if caret is not None and getattr(e, "position", None) is not None:
            print(caret(), file=sys.stderr)
        return 2
    if args.report:
        folder = os.path.dirname(os.path.abspath(args.report))  # refuse an unwritable path before the work
        problem = ("no such directory" if not os.path.isdir(folder) else
                   "is a directory" if os.path.isdir(args.report) else
                   "directory not writable" if not os.access(folder, os.W_OK) else None)
        if problem:
            print(f"broker-filter backtest: --report {args.report}: {problem}", file=sys.stderr)
            return 2
    from ..spark.backtest import run_backtest
    from ..spark.paths import check_directory
    from ..spark.session import read_archive
    from .progress import spark_tasks

    spark = open_session(args, "backtest")
    if spark is None:
        return 2
    try:  # the archive and the output are listed where Spark reads and writes them (any Hadoop filesystem)
        frame = read_archive(spark, args.archive)
        output = check_directory(spark, args.output, "--output") if args.output else None
    except ArchiveError as e:
        print(f"broker-filter backtest: {e}", file=sys.stderr)
        return 2
    with spark_tasks(spark, "backtest", disable=args.no_progress):
        reports = run_backtest(frame, spark_filters(filters, args.dialect), output)
    if args.report:
        from ..spark.report import render_html

        with open(args.report, "w", encoding="utf-8") as f:
            f.write(render_html({name: r.to_json() for name, r in reports.items()}, archive=args.archive))
    if args.json:
        print(json.dumps({name: r.to_json() for name, r in reports.items()}, indent=2))
        return 0
    for name, r in reports.items():
        print(f"{name}: {r.matched} of {r.total} matched ({100 * r.selectivity:.2f}%), {r.unknown} unknown")
        for address, n in sorted(r.by_address.items()):
            print(f"  address {address or '(none)'}: {n}")
        for hour, n in sorted(r.by_hour.items()):
            print(f"  hour {hour}: {n}")
    if args.output:
        print(f"matching messages written under {args.output}/")
    if args.report:
        print(f"report written to {args.report}")
    return 0
