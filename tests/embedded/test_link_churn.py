"""Attaching and detaching links many times leaves nothing behind: no dead proton links or sessions
on either side of the proxy, no feeds, upstream endpoints or broker consumers."""

from __future__ import annotations

import threading
import time

from proton import Message

from clients import bodies, connect, receive_n, receiver
from launcher import InProcessDaemon

CYCLES = 150


def on_loop(daemon: InProcessDaemon, fn):
    """Run fn on the daemon's event-loop thread (proton objects are not thread-safe) and return its
    result.  A throw-away connection wakes the loop."""
    out: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            out["value"] = fn()
        finally:
            done.set()

    daemon.app.loop.call_soon(run)
    for _ in range(20):
        connect(daemon.url).close()
        if done.wait(0.5):
            return out["value"]
    raise AssertionError("the daemon's loop did not run the probe")


def endpoints(conn) -> tuple[int, int]:
    """(links, sessions) proton still keeps on a connection (the engine's or proton's wrapper of one),
    whatever their state."""
    from broker_filter.engine._cproton import lib

    pointer = getattr(conn, "_impl", None) or conn.ptr
    links = sessions = 0
    link = lib.pn_link_head(pointer, 0)
    while link:
        links += 1
        link = lib.pn_link_next(link, 0)
    ssn = lib.pn_session_head(pointer, 0)
    while ssn:
        sessions += 1
        ssn = lib.pn_session_next(ssn, 0)
    return links, sessions


def test_attach_detach_cycles_leave_no_dead_links_or_sessions():
    upstream = InProcessDaemon()
    front = InProcessDaemon("--upstream", upstream.url)
    conn = connect(front.url)
    try:
        for _ in range(100):
            if on_loop(front, lambda: front.app.upstream.connected):
                break
        snd = conn.create_sender("churn", name="producer")
        for i in range(CYCLES):
            r = receiver(conn, "churn", selector=f"n = {i}" if i % 3 else None, credit=5)
            snd.send(Message(body=i, properties={"n": i}))
            assert bodies(receive_n(r, 1)) == [i]
            if i % 2:
                r.close()  # detach with closed=true
            else:
                r.link.detach()  # detach without close (what JMS does for a durable consumer)
            if i % 10 == 0:
                extra = conn.create_sender("churn-side", name=f"side-{i}")
                extra.close()

        def front_state():
            server = front.app.server
            up = front.app.upstream
            clients = [endpoints(c) for c in front.app.registry.connections if c.remote_container == conn.conn.container]
            return {
                "feeds": len(server.registry.feeds),
                "client": clients,
                "upstream_connection": endpoints(up.connection),
                "upstream_endpoints": len(up._endpoints),
                "tracked_links": sum(len(c.links) for c in server.connections.values()),
            }

        # Only the producer link (and its session) remain towards the client; towards the upstream
        # only the producer's publisher and its own session.  (The last detach may still be on its
        # way upstream: look again for a few seconds.)
        want = {"feeds": 0, "client": [(1, 1)], "upstream_connection": (1, 1), "upstream_endpoints": 1,
                "tracked_links": 1}
        deadline = time.monotonic() + 10
        state = on_loop(front, front_state)
        while state != want and time.monotonic() < deadline:
            time.sleep(0.2)
            state = on_loop(front, front_state)
        assert state["feeds"] == 0, state
        assert state["client"] == [(1, 1)], state
        assert state["upstream_connection"] == (1, 1), state
        assert state["upstream_endpoints"] == 1, state
        assert state["tracked_links"] == 1, state

        def upstream_state():
            broker = upstream.app.upstream.broker
            consumers = sum(len(q.consumers) for q in broker.queues.values())
            return consumers, sorted(endpoints(c) for c in upstream.app.registry.connections)

        consumers, conns = on_loop(upstream, upstream_state)
        while consumers and time.monotonic() < deadline:
            time.sleep(0.2)
            consumers, conns = on_loop(upstream, upstream_state)
        assert consumers == 0
        assert (1, 1) in conns and all(links <= 1 and sessions <= 1 for links, sessions in conns), conns
    finally:
        conn.close()
        front.stop()
        upstream.stop()
