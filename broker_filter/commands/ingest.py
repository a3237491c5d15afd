"""`broker-filter ingest`: a streaming query from an AMQP address into a Parquet archive."""

from __future__ import annotations

import argparse
import sys

from ..filters import DIALECTS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="stream an AMQP address's matching messages into a Parquet archive (Spark)",
        description="Run a Spark Structured Streaming query that receives the messages a filter selects "
        "from an AMQP address and writes them to an archive (docs/archive.md) that backtest and replay "
        "read.  A message is accepted upstream only after the micro-batch holding it is committed, so a "
        "query stopped or killed and started again with the same checkpoint loses nothing "
        "(docs/streaming.md).",
    )
    p.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="amqp://[user:password@]host:port/address (amqps:// for TLS)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--selector", metavar="S", help="selector (default: every message)")
    which.add_argument("--filter-set", metavar="JSON", help="a filter-set in the JSON form (docs/filters.md)")
    p.add_argument("--dialect", default="jms", choices=sorted(DIALECTS), help="selector dialect")
    p.add_argument("--archive", required=True, metavar="DIR",
                   help="archive directory (created if missing): a path or any Hadoop filesystem URI")
    p.add_argument("--checkpoint", metavar="DIR", help="Spark checkpoint (default: DIR/_checkpoint)")
    p.add_argument("--max-messages-per-trigger", type=int, default=1000, metavar="N",
                   help="most messages per micro-batch (default 1000); at most 2N are held unsettled")
    p.add_argument("--trigger-seconds", type=float, default=5.0, metavar="S", help="micro-batch interval (default 5)")
    p.add_argument("--idle-stop", type=float, default=None, metavar="S",
                   help="stop after S seconds without a message (default: run until interrupted)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="AMQP connect/confirm timeout")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default: spark-submit's, else spark.master of Spark's configuration, else local[*])")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..spark.replay import parse_target
    from ..spark.streaming import OptionError, stream_filter

    def fail(message: str, code: int = 2) -> int:
        print(f"broker-filter ingest: {message}", file=sys.stderr)
        return code

    try:
        target = parse_target(args.source)
    except ValueError as e:
        return fail(f"--from: {e}")
    options = {"selector": args.selector, "filter": args.filter_set, "dialect": args.dialect,
               "maxMessagesPerTrigger": args.max_messages_per_trigger, "timeout": args.timeout}
    try:
        stream_filter({k: v for k, v in options.items() if v is not None}, "ingest")
    except OptionError as e:
        flag = {"selector": "--selector", "filter": "--filter-set"}.get(e.option, f"--{e.option}")
        return fail(f"{flag}: {e.problem}")
    for flag, value in (("--max-messages-per-trigger", args.max_messages_per_trigger),
                        ("--trigger-seconds", args.trigger_seconds), ("--timeout", args.timeout),
                        ("--idle-stop", 1 if args.idle_stop is None else args.idle_stop)):
        if not value > 0:
            return fail(f"{flag} must be positive, got {value}")

    from ..archive.parquet import ArchiveError
    from ..spark.ingest import run_until_idle, start_ingest
    from ..spark.paths import check_directory
    from ..spark.paths import java_reason
    from .backtest import open_session

    spark = open_session(args, "ingest")
    if spark is None:
        return 2
    try:  # where Spark writes: a path or any Hadoop filesystem URI
        archive = check_directory(spark, args.archive, "--archive")
        checkpoint = check_directory(spark, args.checkpoint, "--checkpoint") if args.checkpoint else None
    except ArchiveError as e:
        return fail(str(e))
    try:
        query = start_ingest(spark, url=target.url, address=target.address, archive=archive,
                             checkpoint=checkpoint, options=options, trigger_seconds=args.trigger_seconds)
    except RuntimeError as e:  # the data source cannot run (no PySpark 4.2, executors without broker-filter)
        return fail(str(e).removeprefix("broker-filter: "))
    except Exception as e:  # Spark refused the query (py4j's or PySpark's errors): one line, not a traceback
        return fail(f"the query could not start: {java_reason(e)}")
    print(f"ingesting {args.source} into {args.archive}", file=sys.stderr, flush=True)
    try:
        totals = run_until_idle(query, args.idle_stop)
    except KeyboardInterrupt:
        query.stop()
        print("interrupted: committed batches are in the archive; run again to continue", file=sys.stderr)
        return 130
    except RuntimeError as e:
        return fail(f"query failed: {java_reason(e)}", 1)
    print(f"{totals['messages']} message(s) ingested into {args.archive} in {totals['batches']} batch(es)")
    return 0
