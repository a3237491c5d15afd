"""`broker-filter archive import FILE.jsonl -o DIR`: messages in the JSON form to the Parquet archive."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "archive",
        help="build Parquet message archives (see docs/archive.md)",
        description="Build Parquet message archives (layout: docs/archive.md).",
    )
    sub = p.add_subparsers(dest="archive_command", metavar="ACTION")
    sub.required = True
    imp = sub.add_parser(
        "import",
        help="convert JSON-lines messages to an archive",
        description="Convert JSON-lines messages (one message per line in the JSON form of "
        "docs/message-json.md, or an envelope {\"address\", \"arrival_time\", \"message\"}) into one "
        "Parquet file in DIR.  Lines that are not valid messages are reported with their line "
        "numbers; the exit code is 1 if there were any, and nothing is written unless --keep-going.",
    )
    imp.add_argument("file", metavar="FILE.jsonl", help="input file ('-' for standard input)")
    imp.add_argument("-o", "--output", required=True, metavar="DIR",
                     help="archive directory (created if missing): a local path or file:// URI")
    imp.add_argument("--address", help="address recorded for messages whose line does not name one")
    imp.add_argument(
        "--keep-going",
        action="store_true",
        help="write the valid messages even when some lines are bad (still exits 1)",
    )
    imp.add_argument("--no-progress", action="store_true", help="no progress bar (the bytes read)")
    imp.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    import os

    from ..archive.parquet import import_jsonl, rows_table, write_table
    from ..spark.paths import is_uri, local_path
    from .progress import read_lines

    output = local_path(args.output) if is_uri(args.output) else args.output
    if output is None:  # written here, with pyarrow: a local directory
        print(f"broker-filter archive import: -o {args.output}: a local directory or file:// URI; copy the "
              "archive to other filesystems with their own tools (e.g. hdfs dfs -put), where backtest and "
              "replay read it", file=sys.stderr)
        return 2

    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
        size = None if args.file == "-" else os.fstat(stream.fileno()).st_size
    except OSError as e:
        print(f"broker-filter archive import: {e.strerror}: {args.file}", file=sys.stderr)
        return 2
    with stream:
        try:
            lines = read_lines(stream, size if size else None, disable=args.no_progress, desc="import")
            rows, errors = import_jsonl(lines, address=args.address)
        except UnicodeDecodeError as e:
            print(f"broker-filter archive import: {args.file} is not UTF-8 text: {e}", file=sys.stderr)
            return 2
    name = "<stdin>" if args.file == "-" else args.file
    for number, problem in errors:
        print(f"{name}:{number}: {problem}", file=sys.stderr)
    if errors and not args.keep_going:
        print(
            f"broker-filter archive import: {len(errors)} bad line(s); nothing written (use --keep-going to "
            "write the valid ones)",
            file=sys.stderr,
        )
        return 1
    if rows:
        try:
            path = write_table(rows_table(rows), output)
        except OSError as e:
            print(f"broker-filter archive import: -o {args.output}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"{len(rows)} message(s) written to {path}")
    else:
        print("no messages to write")
    return 1 if errors else 0
