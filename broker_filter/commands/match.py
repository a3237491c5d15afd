"""`broker-filter match`: grep for messages.  Reads JSON-lines messages (the JSON form of
docs/message-json.md) from FILE or standard input and prints the lines whose message the selector or
filter-set selects.

Exit status, like grep: 0 when a line was selected, 1 when none was, 2 when the filter is invalid or a
line was not a valid message (each such line is reported on standard error with its number and
skipped).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..filters import DIALECTS, FilterError, SelectorError, compile_filter_set, compile_selector
from ..amqp.message import Message, MessageFormatError
from .check import report

_NAMES = {True: "TRUE", False: "FALSE", None: "UNKNOWN"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "match",
        help="print the JSON-lines messages a selector or filter-set selects",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--selector", "-s", metavar="S", help="a selector")
    what.add_argument(
        "--filter-set",
        "-f",
        metavar="JSON",
        help='a filter-set in JSON form, e.g. \'{"k": {"descriptor": "apache.org:selector-filter:string", '
        '"value": "a = 1"}}\'; @FILE reads it from a file',
    )
    p.add_argument("--dialect", choices=sorted(DIALECTS), default="jms", help="selector dialect (default: jms)")
    p.add_argument("-v", "--invert-match", action="store_true", help="print the lines NOT selected")
    p.add_argument("-c", "--count", action="store_true", help="print only the number of lines selected")
    p.add_argument(
        "--explain", action="store_true", help="print every line prefixed with TRUE, FALSE or UNKNOWN and a tab"
    )
    p.add_argument("file", nargs="?", metavar="FILE", help="JSON-lines file (default: standard input)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.selector is not None:
            flt = compile_selector(args.selector, args.dialect)
        else:
            text = args.filter_set
            if text.startswith("@"):
                with open(text[1:], encoding="utf-8") as fh:
                    text = fh.read()
            flt = compile_filter_set(text, args.dialect)
    except SelectorError as e:
        report(e)
        return 2
    except FilterError as e:
        print(f"broker-filter: invalid filter: {e.describe()}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"broker-filter: {e}", file=sys.stderr)
        return 2

    name = args.file or "<stdin>"
    try:
        stream = open(args.file, encoding="utf-8") if args.file else sys.stdin
    except OSError as e:
        print(f"broker-filter: {e}", file=sys.stderr)
        return 2
    selected = bad = 0
    out = sys.stdout
    with stream:
        for number, line in enumerate(stream, 1):
            text = line.rstrip("\n")
            if not text.strip():
                continue
            try:
                message = Message.from_json(json.loads(text))
            except (ValueError, MessageFormatError) as e:
                bad += 1
                print(f"broker-filter: {name}:{number}: not a valid message: {e}", file=sys.stderr)
                continue
            result = flt.evaluate(message)
            chosen = (result is True) != args.invert_match
            if chosen:
                selected += 1
            if args.explain:
                out.write(f"{_NAMES[result]}\t{text}\n")
            elif chosen and not args.count:
                out.write(text + "\n")
    if args.count:
        out.write(f"{selected}\n")
    if bad:
        return 2
    return 0 if selected else 1
