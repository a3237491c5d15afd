"""Splicing a client connection to another server (`EventLoop.splice`, engine/splice.py), with
python-qpid-proton clients in their own processes: the front listener keeps each connection's first
input and its handler splices the connection to a second listener (an echo server) when its open
comes, before answering anything; the client then talks to the echo server through the splice,
unchanged.  A target that refuses the login or cannot be reached closes the client's connection,
and the loop keeps no socket of it."""

from __future__ import annotations

import hashlib
import time

import pytest

from broker_filter.engine import Handler
from broker_filter.engine.loop import Limits
from broker_filter.engine.streams import ServerSasl
from broker_filter.security import SaslClientExchange, UserDatabase, hash_password

from .apps import EchoServer
from .conftest import run_client


class Splicer(Handler):
    """Splices every connection, at its open, to `target` logged in with `login`."""

    def __init__(self, target: tuple[str, int], login: tuple[str | None, str | None] = (None, None)):
        self.target = target
        self.login = login
        self.spliced: list[bool] = []

    def on_connection_open(self, connection) -> None:
        loop = connection.engine
        self.spliced.append(loop.splice(connection, self.target, SaslClientExchange(*self.login)))


def front(loop_thread, splicer: Splicer, keep: int = 64 * 1024):
    listener = loop_thread.call(lambda: loop_thread.loop.listen(
        "127.0.0.1", 0, splicer, sasl=ServerSasl(("ANONYMOUS",), allow_skip=True),
        limits=Limits(keep_first_input=keep)))
    return listener, f"amqp://127.0.0.1:{listener.port}"


def settled(loop_thread, listener, timeout: float = 10) -> None:
    """Until the loop holds no splice and the front listener counts no connection."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if loop_thread.call(lambda: not loop_thread.loop.splices and listener.active == 0):
            return
        time.sleep(0.05)
    raise AssertionError("a splice or its sockets outlived the connection")


def test_a_spliced_client_talks_to_the_target_unchanged(loop_thread):
    users = UserDatabase({"replica": hash_password("secret", algorithm="pbkdf2-sha256")})
    echo = EchoServer()
    target = loop_thread.call(lambda: loop_thread.loop.listen(
        "127.0.0.1", 0, echo, sasl=ServerSasl(("PLAIN",), verify=users.authenticate)))
    splicer = Splicer(("127.0.0.1", target.port), ("replica", "secret"))
    listener, url = front(loop_thread, splicer)
    assert run_client(url, "send", "big", "3", "--size", str(1 << 20)) == {"ok": True, "sent": 3}
    got = run_client(url, "receive", "big", "3")
    assert got["ok"] and got["bodies"] == [hashlib.sha256(bytes(range(256)) * 4096).hexdigest()] * 3
    assert splicer.spliced == [True, True]
    # the echo server saw the client's own connections (its links, its messages), not ours
    assert [s.address for s in echo.sources] == ["big"]
    settled(loop_thread, listener)


@pytest.mark.parametrize("why", ["refused", "unreachable"])
def test_a_target_that_refuses_or_is_not_there_closes_the_client_connection(loop_thread, why):
    users = UserDatabase({"replica": hash_password("secret", algorithm="pbkdf2-sha256")})
    target = loop_thread.call(lambda: loop_thread.loop.listen(
        "127.0.0.1", 0, EchoServer(), sasl=ServerSasl(("PLAIN",), verify=users.authenticate)))
    port = target.port
    if why == "unreachable":
        loop_thread.call(target.close)
    splicer = Splicer(("127.0.0.1", port), ("replica", "wrong"))
    listener, url = front(loop_thread, splicer)
    got = run_client(url, "send", "q", "1", timeout=60)
    assert not got["ok"]  # its connection was closed before its open was answered
    assert splicer.spliced == [True]
    settled(loop_thread, listener)


def test_a_connection_answered_already_is_not_spliced(loop_thread):
    target = loop_thread.call(lambda: loop_thread.loop.listen("127.0.0.1", 0, EchoServer()))

    class Late(EchoServer):
        """Answers the open, then tries to splice at the first link: too late."""

        def __init__(self):
            super().__init__()
            self.spliced: list[bool] = []

        def on_link_open(self, link) -> None:
            self.spliced.append(link.connection.engine.splice(link.connection, ("127.0.0.1", target.port),
                                                              SaslClientExchange()))
            super().on_link_open(link)

    late = Late()
    listener = loop_thread.call(lambda: loop_thread.loop.listen(
        "127.0.0.1", 0, late, sasl=ServerSasl(("ANONYMOUS",), allow_skip=True),
        limits=Limits(keep_first_input=64 * 1024)))
    url = f"amqp://127.0.0.1:{listener.port}"
    # BlockingConnection waits for the open's answer before it attaches: answered by then
    assert run_client(url, "send", "q", "2") == {"ok": True, "sent": 2}
    assert late.spliced == [False]
