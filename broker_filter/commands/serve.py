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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from .. import logs
    from ..app import App, StartError
    from ..config import load_for_cli
    from ..workers import Supervisor, worker_index

    config = load_for_cli(args)
    logs.configure_from(config)
    if config.listener.workers > 1 and worker_index() is None:
        return Supervisor(config).run()
    app = App(config, args=args)
    try:
        app.start()
    except StartError as e:
        print(f"broker-filter: {e}", file=sys.stderr)
        app.close()
        return 1
    return app.run()
