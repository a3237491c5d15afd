"""`broker-filter serve`: run the filtering proxy daemon."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..config import add_serve_arguments

    p = sub.add_parser(
        "serve",
        help="run the filtering AMQP 1.0 proxy",
        description="Accept AMQP 1.0 clients, apply the filters of their receiving links to messages "
        "from the upstream broker (or the embedded one) and forward only matching messages.",
    )
    add_serve_arguments(p)
    p.add_argument("--io", choices=("engine", "container"), default=None,
                   help="the I/O loop: the epoll engine (default; no descriptor ceiling) or proton's Container "
                   "(select: at most 1,024 descriptors); BROKER_FILTER_IO sets the default")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from .. import logs
    from ..app import IO_LOOPS, App, default_io
    from ..config import load_for_cli

    io = args.io or default_io()
    if io not in IO_LOOPS:
        print(f"broker-filter: BROKER_FILTER_IO: must be one of {', '.join(IO_LOOPS)}, got {io!r}", file=sys.stderr)
        return 2
    config = load_for_cli(args)
    logs.configure_from(config)
    return App(config, io=io).run()
