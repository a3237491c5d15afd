"""A TCP forwarder that copies bytes between each client and the upstream broker and does nothing
else: no AMQP, no parsing, one epoll loop (`selectors`), non-blocking sockets, as the daemon's loop
reads and writes.  It is the floor of any Python process put in the path: `paced_cost_bench.py`
runs it beside the relay and the daemon (its `bytes` column), the consumer selecting for itself as
it does direct.

    python bench/byte_forwarder.py [--upstream 127.0.0.1:5672]   (prints {"port": N}, serves until killed)
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket


class Pipe:
    """One direction of one connection: what `src` sends goes to `dst`."""

    __slots__ = ("src", "dst", "pending", "peer")

    def __init__(self, src: socket.socket, dst: socket.socket):
        self.src, self.dst = src, dst
        self.pending = bytearray()  # what `dst` has not taken yet
        self.peer: Pipe | None = None  # the other direction


def serve(upstream: tuple[str, int]) -> None:
    sel = selectors.EpollSelector()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)

    def close(pipe: Pipe) -> None:
        for s in (pipe.src, pipe.dst):
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def watch(pipe: Pipe) -> None:
        # a socket is read while its peer has taken everything, and written while it is behind
        for p in (pipe, pipe.peer):
            events = (0 if p.pending else selectors.EVENT_READ) | (selectors.EVENT_WRITE if p.peer.pending else 0)
            registered = p.src in sel.get_map()
            if not events:
                if registered:
                    sel.unregister(p.src)
            elif registered:
                sel.modify(p.src, events, p)
            else:
                sel.register(p.src, events, p)

    while True:
        for key, mask in sel.select():
            if key.data is None:
                client, _ = listener.accept()
                up = socket.create_connection(upstream)
                for s in (client, up):
                    s.setblocking(False)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                there, back = Pipe(client, up), Pipe(up, client)
                there.peer, back.peer = back, there
                sel.register(client, selectors.EVENT_READ, there)
                sel.register(up, selectors.EVENT_READ, back)
                continue
            pipe: Pipe = key.data
            if mask & selectors.EVENT_WRITE and pipe.peer.pending:
                out = pipe.peer
                try:
                    sent = out.dst.send(out.pending)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    close(pipe)
                    continue
                del out.pending[:sent]
                watch(pipe)
            if mask & selectors.EVENT_READ and not pipe.pending:
                try:
                    data = pipe.src.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    close(pipe)
                    continue
                try:
                    sent = pipe.dst.send(data)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    close(pipe)
                    continue
                if sent < len(data):
                    pipe.pending += data[sent:]
                    watch(pipe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", default="127.0.0.1:5672")
    a = ap.parse_args()
    host, _, port = a.upstream.rpartition(":")
    serve((host, int(port)))


if __name__ == "__main__":
    main()
