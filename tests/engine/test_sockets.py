"""The engine's event loop on 127.0.0.1 with python-qpid-proton clients in their own processes."""

from __future__ import annotations

import socket
import ssl
import time

import pytest

from broker_filter.engine.loop import Limits
from broker_filter.engine.streams import ServerSasl
from broker_filter.security import UserDatabase, hash_password

from .apps import EchoServer
from .conftest import client_result, closed_at_once, run_client, start_client


def serve(loop_thread, echo=None, **kwargs):
    echo = echo or EchoServer()
    listener = loop_thread.call(lambda: loop_thread.loop.listen("127.0.0.1", 0, echo, **kwargs))
    return echo, listener, f"amqp://127.0.0.1:{listener.port}"


def test_send_and_receive_through_the_loop(loop_thread):
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("ANONYMOUS",)))
    assert run_client(url, "send", "q1", "50") == {"ok": True, "sent": 50}
    got = run_client(url, "receive", "q1", "50")
    assert got["ok"] and got["bodies"] == [f"m{i}" for i in range(50)]


def test_large_messages_cross_both_ways_unchanged(loop_thread):
    import hashlib

    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("ANONYMOUS",)))
    assert run_client(url, "send", "big", "3", "--size", str(1 << 20)) == {"ok": True, "sent": 3}
    got = run_client(url, "receive", "big", "3")
    assert got["ok"] and got["bodies"] == [hashlib.sha256(bytes(range(256)) * 4096).hexdigest()] * 3


def test_released_messages_come_back_with_the_modified_flags(loop_thread):
    seen = []

    class Requeue(EchoServer):
        def on_delivery_update(self, delivery):
            from broker_filter.engine import MODIFIED, RELEASED

            seen.append((delivery.remote_state, delivery.remote_failed))
            if delivery.remote_state in (RELEASED, MODIFIED):
                self.queues[delivery.link.context].appendleft(delivery.context)
            super().on_delivery_update(delivery)

    echo, listener, url = serve(loop_thread, Requeue(), sasl=ServerSasl(("ANONYMOUS",)))
    run_client(url, "send", "q2", "3")
    released = run_client(url, "receive", "q2", "1", "--release")
    assert released["bodies"] == ["m0"]
    got = run_client(url, "receive", "q2", "3")
    assert got["ok"], got
    assert sorted(got["bodies"]) == ["m0", "m1", "m2"]
    from broker_filter.engine import ACCEPTED, MODIFIED

    assert seen[0] == (MODIFIED, False)  # BlockingReceiver.release(): modified, no flags set
    assert [state for state in seen[1:] if state[0] == ACCEPTED] == [(ACCEPTED, False)] * 3


def test_sasl_plain_accepts_right_and_refuses_wrong_credentials(loop_thread):
    users = UserDatabase({"alice": hash_password("secret", algorithm="pbkdf2-sha256")})
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("PLAIN",), verify=users.authenticate))
    ok = run_client(url, "send", "q3", "1", "--user", "alice", "--password", "secret", "--mechs", "PLAIN")
    assert ok == {"ok": True, "sent": 1}
    bad = run_client(url, "send", "q3", "1", "--user", "alice", "--password", "wrong", "--mechs", "PLAIN")
    assert not bad["ok"] and "unauthorized-access" in bad["error"], bad
    assert loop_thread.call(lambda: listener.refused["unauthorized"]) == 1
    anonymous = run_client(url, "send", "q3", "1", "--mechs", "ANONYMOUS")  # not offered: the client gives up
    assert not anonymous["ok"]
    assert loop_thread.call(lambda: echo.queues["q3"]) == echo.queues["q3"] and len(echo.queues["q3"]) == 1


def test_tls_with_sasl_plain_and_external(loop_thread, pki):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
    context.load_verify_locations(str(pki / "ca.pem"))
    context.verify_mode = ssl.CERT_OPTIONAL
    users = UserDatabase({"bob": hash_password("pw", algorithm="pbkdf2-sha256")})
    seen = []

    class Identities(EchoServer):
        def on_connection_open(self, connection):
            seen.append(connection.identity)
            super().on_connection_open(connection)

    echo, listener, url = serve(loop_thread, Identities(), tls=context,
                                sasl=ServerSasl(("PLAIN", "EXTERNAL"), verify=users.authenticate))
    url = url.replace("amqp://", "amqps://")
    ca = str(pki / "ca.pem")
    assert run_client(url, "send", "t", "5", "--ca", ca, "--user", "bob", "--password", "pw", "--mechs", "PLAIN")["ok"]
    got = run_client(url, "receive", "t", "5", "--ca", ca, "--cert", str(pki / "client.pem"),
                     "--key", str(pki / "client.key"), "--mechs", "EXTERNAL")
    assert got["ok"] and got["bodies"] == [f"m{i}" for i in range(5)], got
    assert [(i.user, i.mechanism, i.tls) for i in seen] == [("bob", "PLAIN", True),
                                                          ("commonName=client-1", "EXTERNAL", True)]


def test_a_client_that_does_not_trust_the_server_is_refused_cleanly(loop_thread, pki):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
    echo, listener, url = serve(loop_thread, tls=context, sasl=ServerSasl(("ANONYMOUS",)))
    bad = run_client(url.replace("amqp://", "amqps://"), "send", "t", "1", "--ca", str(pki / "other.pem"))
    assert not bad["ok"]
    good = run_client(url.replace("amqp://", "amqps://"), "send", "t", "1", "--ca", str(pki / "ca.pem"))
    assert good["ok"], good


def test_heartbeats_keep_an_idle_client_connected(loop_thread):
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("ANONYMOUS",)), limits=Limits(idle_timeout=1.0))
    result = run_client(url, "idle", "3.5", "--heartbeat", "1")
    assert result == {"ok": True}
    assert echo.queues["ping"] and bytes(echo.queues["ping"][0]).endswith(b"after-idle")


def test_silent_peer_is_closed_by_the_idle_timeout(loop_thread):
    echo, listener, url = serve(loop_thread, limits=Limits(idle_timeout=1.0, handshake_timeout=0))
    started = time.monotonic()  # the idle clock runs from the accept, before anything is sent
    sock = socket.create_connection(("127.0.0.1", listener.port))
    sock.sendall(b"AMQP\x00\x01\x00\x00" + _open_frame(idle_ms=0))
    sock.settimeout(10)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert 1.0 <= time.monotonic() - started < 8
    assert b"amqp:resource-limit-exceeded" in data
    sock.close()


def _open_frame(idle_ms: int) -> bytes:
    from broker_filter.amqp import types as t
    from broker_filter.amqp import encode

    body = encode(t.Described(t.ulong(0x10), ["raw-client", None, None, None, t.uint(idle_ms) if idle_ms else None]))
    return (8 + len(body)).to_bytes(4, "big") + bytes((2, 0, 0, 0)) + body


def test_connections_beyond_the_limit_are_closed_at_once_and_counted(loop_thread):
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("ANONYMOUS",)), limits=Limits(max_connections=3))
    held = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(3)]
    time.sleep(0.3)
    assert closed_at_once(listener.port, 1) == 1
    assert loop_thread.call(lambda: listener.refused["limit"]) == 1
    for s in held:
        s.close()
    deadline = time.monotonic() + 5
    while loop_thread.call(lambda: listener.active) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run_client(url, "send", "q", "1")["ok"]  # room again


def test_half_a_frame_then_silence_is_closed_at_the_handshake_deadline(loop_thread):
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("ANONYMOUS",)), limits=Limits(handshake_timeout=0.5))
    silent = socket.create_connection(("127.0.0.1", listener.port))
    half = socket.create_connection(("127.0.0.1", listener.port))
    half.sendall(b"AMQP\x03\x01\x00\x00\x00\x00\x00\x30\x02\x01")
    for s in (silent, half):
        s.settimeout(5)
        received = b""
        while chunk := s.recv(4096):
            received += chunk
        s.close()
    assert loop_thread.call(lambda: listener.refused["handshake-timeout"]) == 2
    assert run_client(url, "send", "q", "1")["ok"]


def test_an_oversized_frame_is_refused_not_buffered(loop_thread):
    echo, listener, url = serve(loop_thread, limits=Limits(max_input=4096, handshake_timeout=0))
    sock = socket.create_connection(("127.0.0.1", listener.port))
    sock.sendall(b"AMQP\x00\x01\x00\x00" + _open_frame(0))
    # A frame header announcing 1 GiB: proton refuses it rather than buffering
    sock.sendall((1 << 30).to_bytes(4, "big") + bytes((2, 0, 0, 0)) + b"\0" * 65536)
    sock.settimeout(10)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    assert b"amqp:connection:framing-error" in data or b"framing" in data
    assert loop_thread.call(lambda: len(loop_thread.loop.connections)) == 0
    assert run_client(url, "send", "q", "1")["ok"]


@pytest.mark.parametrize("mechanism, tls", [("PLAIN", False), ("ANONYMOUS", True), ("PLAIN", True)])
def test_a_client_role_connection_through_the_loop(loop_thread, pki, mechanism, tls):
    """The engine's client role (SASL by proton, TLS on memory BIOs) against its own server role."""
    from broker_filter.engine import SaslClient, Terminus

    from .apps import Recorder

    users = UserDatabase({"carol": hash_password("pw", algorithm="pbkdf2-sha256")})
    server_tls = client_tls = None
    if tls:
        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
        client_tls = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    echo, listener, url = serve(loop_thread, tls=server_tls,
                                sasl=ServerSasl(("PLAIN", "ANONYMOUS"), verify=users.authenticate))
    client_handler = Recorder()
    sasl = SaslClient("PLAIN", "carol", "pw") if mechanism == "PLAIN" else SaslClient("ANONYMOUS")

    def open_client():
        loop = loop_thread.loop
        conn = loop.connect("127.0.0.1", listener.port, client_handler, sasl=sasl, tls=client_tls,
                            server_hostname="localhost")
        conn.open(hostname="localhost")
        session = conn.session()
        session.open()
        sender = session.sender("s", target=Terminus(address="cq"))
        sender.open()
        receiver = session.receiver("r", source=Terminus(address="cq"))
        receiver.open()
        receiver.flow(10)
        return conn, sender

    conn, sender = loop_thread.call(open_client)
    deadline = time.monotonic() + 10
    while loop_thread.call(lambda: sender.credit) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    loop_thread.call(lambda: [sender.send(b"\x00Sw\xa1\x03abc") for _ in range(3)])
    while len(client_handler.messages) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client_handler.messages == [b"\x00Sw\xa1\x03abc"] * 3
    identity = loop_thread.call(lambda: [c.identity for c in loop_thread.loop.connections.values() if c.server])
    assert [(i.user, i.mechanism, i.tls) for i in identity] == [
        ("carol" if mechanism == "PLAIN" else "anonymous", mechanism, tls)]
    loop_thread.call(lambda: conn.close())
    while not client_handler.disconnected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client_handler.disconnected == [None]


def test_a_client_role_connection_with_wrong_credentials_hears_why(loop_thread):
    from broker_filter.engine import SaslClient

    from .apps import Recorder

    users = UserDatabase({"carol": hash_password("pw", algorithm="pbkdf2-sha256")})
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("PLAIN",), verify=users.authenticate))
    handler = Recorder()
    loop_thread.call(lambda: loop_thread.loop.connect("127.0.0.1", listener.port, handler,
                                                      sasl=SaslClient("PLAIN", "carol", "nope")).open())
    deadline = time.monotonic() + 10
    while not handler.disconnected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handler.disconnected and handler.disconnected[0].name == "amqp:unauthorized-access"


def test_a_client_role_connection_that_cannot_connect_reports_why(loop_thread):
    from .apps import Recorder

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = Recorder()
    loop_thread.call(lambda: loop_thread.loop.connect("127.0.0.1", port, handler).open())
    deadline = time.monotonic() + 10
    while not handler.disconnected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handler.disconnected and "Connection refused" in handler.disconnected[0].description


def test_many_clients_at_once(loop_thread):
    echo, listener, url = serve(loop_thread, sasl=ServerSasl(("ANONYMOUS",)))
    senders = [start_client(url, "send", f"many{i}", "20") for i in range(8)]
    assert all(client_result(p)["ok"] for p in senders)
    receivers = [start_client(url, "receive", f"many{i}", "20") for i in range(8)]
    assert all(client_result(p)["bodies"] == [f"m{j}" for j in range(20)] for p in receivers)


def test_garbage_from_clients_closes_only_their_connections(loop_thread, pki):
    import random

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
    users = UserDatabase({"dan": hash_password("pw", algorithm="pbkdf2-sha256")})
    echo, plain, url = serve(loop_thread, sasl=ServerSasl(("PLAIN", "ANONYMOUS"), verify=users.authenticate))
    _, tls, _ = serve(loop_thread, tls=context, sasl=ServerSasl(("ANONYMOUS",)))
    _, raw, _ = serve(loop_thread)  # AMQP without SASL: the bytes go to proton at once
    rng = random.Random(7)
    sasl_init_huge = b"AMQP\x03\x01\x00\x00" + (1 << 20).to_bytes(4, "big") + b"\x02\x01\x00\x00" + b"\0" * 1024
    cases = [
        (plain.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        (plain.port, sasl_init_huge),
        (plain.port, b"AMQP\x03\x01\x00\x00" + bytes(rng.randrange(256) for _ in range(300))),
        (tls.port, bytes(rng.randrange(256) for _ in range(500))),
        (raw.port, b"AMQP\x00\x01\x00\x00" + bytes(rng.randrange(256) for _ in range(300))),
        (raw.port, b"AMQP\x00\x01\x00\x00\x00\x00\x00\x08\x02\x00\x00\x00" * 3),  # empty frames, then silence
    ]
    for port, data in cases:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
    deadline = time.monotonic() + 10
    while loop_thread.call(lambda: len(loop_thread.loop.connections)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop_thread.call(lambda: len(loop_thread.loop.connections)) == 0  # every one closed and freed
    assert loop_thread.thread.is_alive()
    assert run_client(url, "send", "after-garbage", "2", "--user", "dan", "--password", "pw", "--mechs", "PLAIN")["ok"]
