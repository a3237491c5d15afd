"""Two engine connections joined in memory: no sockets, no threads, for tests that run in
milliseconds.  `pump()` moves each side's output into the other side's input and lets the engines
dispatch, until nothing moves.

    engine = Engine()
    server = engine.connection(EchoHandler(), server=True)
    client = engine.connection(MyHandler(), server=False)
    client.open(); pump(engine, client, server)
"""

from __future__ import annotations

from .endpoints import Connection, Engine


class _Pipe:
    """The `io` of a connection in memory."""

    __slots__ = ("closed", "eof_sent", "backlog")
    peer = "memory"  # (a socket channel's is the remote address)

    def __init__(self) -> None:
        self.closed = False
        self.eof_sent = False
        self.backlog = bytearray()  # output the other side's transport has not taken yet

    def transport_closed(self) -> None:
        self.closed = True


def pump(engine: Engine, a: Connection, b: Connection, other: Engine | None = None, *, rounds: int = 1000) -> int:
    """Move bytes between `a` and `b` until nothing moves; returns the number of bytes moved.  `a`
    and `b` may live in one engine or in two (`other`: the engine of `b`).  RuntimeError if they do
    not settle within `rounds`."""
    engines = (engine,) if other is None or other is engine else (engine, other)
    for side in (a, b):
        if side.io is None:
            side.io = _Pipe()
    moved = 0
    for _ in range(rounds):
        events = sum(e.process() for e in engines)
        step = _move(a, b) + _move(b, a)
        moved += step
        if not step and not events:
            return moved
    raise RuntimeError(f"the connections did not settle in {rounds} rounds")


def _move(source: Connection, target: Connection) -> int:
    if source.ptr is None:
        return 0
    backlog = source.io.backlog
    out = source.engine.take_output(source)
    if out is None:  # the source's output is closed: the target's input ends after the backlog
        if not backlog and not source.io.eof_sent:
            source.io.eof_sent = True
            target.engine.close_input(target)
            return 1
    elif len(out):
        backlog += out
    if not backlog or target.ptr is None:
        return 0
    taken = target.engine.push(target, bytes(backlog))
    if taken <= 0:
        return 0
    del backlog[:taken]
    return taken
