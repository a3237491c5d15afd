"""`broker-filter check SELECTOR`: print the canonical form, or the error with a caret (exit 2)."""

from __future__ import annotations

import argparse
import sys

from ..filters import DIALECTS, SelectorError, parse_selector, render_selector


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="check a selector and print its canonical form",
        description="Parse and type-check a selector. Prints its canonical form, or the error with a "
        "caret under its position (exit status 2).",
    )
    p.add_argument("selector", metavar="SELECTOR")
    p.add_argument("--dialect", choices=sorted(DIALECTS), default="jms", help="selector dialect (default: jms)")
    p.set_defaults(func=run)


def report(error: SelectorError, stream=None) -> None:
    stream = stream or sys.stderr
    print(f"broker-filter: invalid selector: {error}", file=stream)
    if error.position is not None:
        for line in error.caret().split("\n"):
            print(f"  {line}", file=stream)


def run(args: argparse.Namespace) -> int:
    try:
        selector = parse_selector(args.selector, args.dialect)
    except SelectorError as e:
        report(e)
        return 2
    print(render_selector(selector) or "(empty selector: selects every message)")
    return 0
