"""`broker-filter replay`: send an archive's matching messages, in arrival order, to an AMQP address."""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..filters import DIALECTS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay",
        help="send an archive's matching messages to an AMQP address (resumable)",
        description="Send the archived messages a selector matches, in arrival order, to an AMQP address. "
        "A message counts once the receiver accepts it; the position after the last confirmed message is "
        "kept in a state file, and running the same command again resumes there (docs/backtest.md).",
    )
    p.add_argument("--archive", required=True, metavar="PATH",
                   help="archive directory or Parquet file: a path or any Hadoop filesystem URI (hdfs://, s3a://, file://)")
    p.add_argument("--selector", required=True, metavar="S", help="selector ('' replays every message)")
    p.add_argument("--to", required=True, metavar="URL", help="amqp://host:port/address (amqps:// for TLS)")
    p.add_argument("--dialect", default="jms", choices=sorted(DIALECTS), help="selector dialect")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default: spark-submit's, else spark.master of Spark's configuration, else local[*])")
    p.add_argument("--state", metavar="FILE", help="state file, local (default: .replay-<id>.json in the archive directory when it is local, "
                   "else in the current directory)")
    p.add_argument("--restart", action="store_true", help="ignore a saved position and start from the beginning")
    p.add_argument("--window", type=int, default=200, help="most messages awaiting confirmation at once (default 200)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds without any confirmation before giving up")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..archive.parquet import ArchiveError
    from ..filters import SelectorError, compile_selector

    def fail(message: str, code: int = 2) -> int:
        print(f"broker-filter replay: {message}", file=sys.stderr)
        return code

    try:
        selector = compile_selector(args.selector, args.dialect)
    except SelectorError as e:
        return fail(f"{e.describe()}\n{e.caret()}")
    from ..spark.replay import ReplayError, ReplayState, archive_identity, default_state_path, parse_target

    try:
        target = parse_target(args.to)
    except ValueError as e:
        return fail(str(e))
    if args.window < 1 or args.timeout <= 0:
        return fail("--window and --timeout must be positive")
    identity = {
        "archive": archive_identity(args.archive),
        "selector": args.selector,
        "dialect": args.dialect,
        "to": args.to,
    }
    state_path = args.state or default_state_path(args.archive, identity)
    try:
        if args.restart and os.path.exists(state_path):
            os.remove(state_path)
        state = ReplayState.load(state_path, identity)
    except (ValueError, OSError) as e:
        return fail(str(e))
    if state.done:
        print(f"already complete: {state.sent} message(s) sent (state {state_path}; --restart to send again)")
        return 0

    from tqdm import tqdm

    from ..spark.compile import compile_selector as spark_selector
    from ..spark.replay import matching_rows, row_stream, send_all
    from ..spark.session import read_archive
    from .backtest import open_session

    spark = open_session(args, "replay")
    if spark is None:
        return 2
    try:
        frame = read_archive(spark, args.archive)
    except ArchiveError as e:
        return fail(str(e))
    rows = matching_rows(frame, spark_selector(selector.ast), state.position)
    remaining = rows.count()
    bar = tqdm(total=state.sent + remaining, initial=state.sent, unit="msg", disable=args.no_progress, file=sys.stderr)
    last_save = [time.monotonic()]

    def confirmed(position: list) -> None:
        state.sent += 1
        state.position = position
        bar.update(1)
        if time.monotonic() - last_save[0] >= 1.0:
            state.save()
            last_save[0] = time.monotonic()

    try:
        if remaining:
            send_all(target, row_stream(rows), confirmed, window=args.window, timeout=args.timeout)
    except ReplayError as e:
        state.save()
        bar.close()
        return fail(f"{e}; {state.sent} confirmed in total, position saved in {state_path} (run again to resume)", 1)
    except KeyboardInterrupt:
        state.save()
        bar.close()
        print(f"interrupted: {state.sent} confirmed, position saved in {state_path}", file=sys.stderr)
        return 130
    state.done = True
    state.save()
    bar.close()
    print(f"{state.sent} message(s) sent and accepted by {args.to}")
    return 0
