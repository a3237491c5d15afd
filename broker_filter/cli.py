"""Command line: `broker-filter <command>`.  Each command lives in `broker_filter.commands.<name>` and
exposes `add_parser(subparsers)`, which registers its arguments and sets `func(args) -> exit code`.
Heavy imports (proton, pyspark) happen inside the commands, so `broker-filter check` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

# Optional dependencies and the extra that brings each (commands import them when they run).
EXTRA_OF = {"pyarrow": "spark", "pyspark": "spark", "py4j": "spark", "tqdm": "spark"}

# Order is the order of `broker-filter --help`.
COMMAND_MODULES = [
    "serve",
    "check",
    "match",
    "archive",
    "backtest",
    "replay",
    "ingest",
    "hash_password",
    "links",
]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="broker-filter",
        description="Server-side message filtering for AMQP 1.0.",
    )
    parser.add_argument("--version", action="version", version=f"broker-filter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"broker_filter.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"broker_filter.commands.{name}":
                continue  # command not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        extra = EXTRA_OF.get(missing)
        if extra is None:
            raise
        print(f"broker-filter {args.command}: needs the [{extra}] extra (pip install 'broker-filter[{extra}]'): "
              f"{missing} is not installed", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output closed early (e.g. piped into `head`): not an error of ours.
        sys.stderr.close()
        return 0
