"""The client listener on the engine loop with real proton clients: PLAIN users, pass-through, ANONYMOUS
policy, TLS with certificates generated here, EXTERNAL with client certificates."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

from broker_filter.config import add_serve_arguments, load
from broker_filter.engine import Handler
from broker_filter.engine.container import EngineContainer, listen
from broker_filter.security import hash_password, identity_of

ALICE = hash_password("wonderland", algorithm="pbkdf2-sha256")


def listener_config(*settings: str, listen_on: str = "127.0.0.1:0"):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = ["--listen", listen_on]
    for item in settings:
        argv += ["--set", item]
    return load(parser.parse_args(argv), {}).listener


class Server(Handler):
    """An engine handler that accepts everything; remembers identities and messages; a receiver on
    `whoami` gets the user."""

    def __init__(self):
        super().__init__()
        self.identities = []
        self.received = []
        self.closed = threading.Event()

    def on_connection_open(self, connection):
        self.identities.append(identity_of(connection))
        connection.open()

    def on_link_open(self, link):
        if link.is_sender:
            link.copy_remote_source()
        else:
            link.copy_remote_target()
        link.open()
        if link.is_receiver:
            link.flow(10)

    def on_message(self, delivery, data):
        message = Message()
        message.decode(bytes(data))
        self.received.append(message.body)
        delivery.accept()

    def on_flow(self, link):
        if link.is_sender and link.remote_source.address == "whoami" and link.credit and link.context is None:
            link.context = "sent"
            identity = identity_of(link.connection)
            link.send(Message(body=f"{identity.user}/{identity.mechanism}/tls={identity.tls}").encode())

    def on_delivery_update(self, delivery):
        if delivery.remote_settled:
            delivery.settle()

    def on_connection_close(self, connection):
        self.closed.set()
        connection.close()


class Running:
    def __init__(self, listener, passthrough=None):
        self.server = Server()
        self.container = EngineContainer("listener-test")
        self.listening = listen(self.container, listener, self.server, passthrough=passthrough)
        self.port = self.listening.port
        self._thread = threading.Thread(target=self.container.run, daemon=True)
        self._thread.start()

    def _stop(self):
        self.listening.close()
        self.container.stop()

    def stop(self):
        self.container.loop.call_soon_threadsafe(self._stop)
        self._thread.join(timeout=20)
        assert not self._thread.is_alive()


@pytest.fixture
def running():
    started = []

    def start(listener, passthrough=None):
        r = Running(listener, passthrough)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def whoami(url: str, **kwargs) -> str:
    conn = BlockingConnection(url, timeout=20, **kwargs)
    try:
        sender = conn.create_sender("inbox")
        sender.send(Message(body="hello"))
        receiver = conn.create_receiver("whoami")
        message = receiver.receive(timeout=20)
        receiver.accept()
        return message.body
    finally:
        conn.close()


def test_plain_users(running):
    r = running(listener_config(f'listener.users={{alice = "{ALICE}"}}'))
    url = f"amqp://127.0.0.1:{r.port}"
    assert whoami(url, user="alice", password="wonderland", allowed_mechs="PLAIN") == "alice/PLAIN/tls=False"
    assert r.server.received == ["hello"]
    assert r.server.closed.wait(10)
    # ANONYMOUS stays available on a loopback listener
    assert whoami(url, allowed_mechs="ANONYMOUS") == "anonymous/ANONYMOUS/tls=False"
    with pytest.raises(Exception) as info:
        BlockingConnection(url, timeout=20, user="alice", password="nope", allowed_mechs="PLAIN")
    assert "amqp:unauthorized-access" in str(info.value)
    assert [i.user for i in r.server.identities] == ["alice", "anonymous"]
    assert all(i.password is None for i in r.server.identities)


def test_anonymous_refused_when_not_allowed(running):
    listener = listener_config(f'listener.users={{alice = "{ALICE}"}}', "listener.allow_anonymous=false")
    assert listener.effective_mechanisms == ("PLAIN",)
    r = running(listener)
    with pytest.raises(Exception) as info:
        BlockingConnection(f"amqp://127.0.0.1:{r.port}", timeout=20, allowed_mechs="ANONYMOUS")
    assert "amqp:unauthorized-access" in str(info.value)
    assert r.server.identities == []


def test_pass_through_keeps_the_password_for_the_upstream_connection(running):
    seen = []

    def upstream_accepts(user, password):
        seen.append(user)
        return (user, password) == ("bob", "builder")

    listener = listener_config("listener.allow_anonymous=false", "upstream.urls=amqp://127.0.0.1:1",
                               "upstream.credentials=pass-through")
    r = running(listener, passthrough=upstream_accepts)
    url = f"amqp://127.0.0.1:{r.port}"
    assert whoami(url, user="bob", password="builder", allowed_mechs="PLAIN") == "bob/PLAIN/tls=False"
    (identity,) = r.server.identities
    assert identity.password == "builder" and "builder" not in repr(identity)
    with pytest.raises(Exception) as info:
        BlockingConnection(url, timeout=20, user="bob", password="wrong", allowed_mechs="PLAIN")
    assert "amqp:unauthorized-access" in str(info.value)
    assert seen == ["bob", "bob"]


def test_anonymous_only(running):
    r = running(listener_config())
    assert whoami(f"amqp://127.0.0.1:{r.port}") == "anonymous/ANONYMOUS/tls=False"


# -------------------------------------------------------------------------------------------------
# TLS


def client_domain(pki: Path, ca: str = "ca.pem", cert: bool = False) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki / ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER, str(pki / ca))
    if cert:
        domain.set_credentials(str(pki / "client.pem"), str(pki / "client.key"), None)
    return domain


def tls_settings(pki: Path) -> list[str]:
    return [f"listener.tls.cert_file={pki / 'server.pem'}", f"listener.tls.key_file={pki / 'server.key'}"]


def test_tls_with_plain_users(running, pki):
    r = running(listener_config(*tls_settings(pki), f'listener.users={{alice = "{ALICE}"}}'))
    url = f"amqps://127.0.0.1:{r.port}"
    body = whoami(url, ssl_domain=client_domain(pki), user="alice", password="wonderland", allowed_mechs="PLAIN")
    assert body == "alice/PLAIN/tls=True"
    with pytest.raises(Exception):
        BlockingConnection(url, timeout=20, ssl_domain=client_domain(pki, ca="other.pem"), allowed_mechs="ANONYMOUS")
    with pytest.raises(Exception):  # plain TCP against a TLS listener
        BlockingConnection(f"amqp://127.0.0.1:{r.port}", timeout=20, allowed_mechs="ANONYMOUS")
    assert [i.user for i in r.server.identities] == ["alice"]


def test_tls_anonymous(running, pki):
    r = running(listener_config(*tls_settings(pki)))
    assert whoami(f"amqps://127.0.0.1:{r.port}", ssl_domain=client_domain(pki)) == "anonymous/ANONYMOUS/tls=True"


def test_external_with_a_client_certificate(running, pki):
    r = running(listener_config(
        *tls_settings(pki), f"listener.tls.ca_file={pki / 'ca.pem'}", "listener.tls.verify_client=true",
        "listener.sasl_mechanisms=EXTERNAL,PLAIN", "listener.allow_anonymous=false",
        'listener.certificate_users={"client-1" = "app"}',
    ))
    url = f"amqps://127.0.0.1:{r.port}"
    assert whoami(url, ssl_domain=client_domain(pki, cert=True), allowed_mechs="EXTERNAL") == (
        "app/EXTERNAL/tls=True"
    )
    assert r.server.identities[-1].subject == "CN=client-1"
    with pytest.raises(Exception):  # no client certificate: the TLS handshake fails
        BlockingConnection(url, timeout=20, ssl_domain=client_domain(pki), allowed_mechs="EXTERNAL")


def test_frames_pipelined_after_sasl_reach_proton(running):
    """A client may send its AMQP header and open right behind sasl-init, before the outcome: those
    bytes arrive with the SASL exchange and must reach proton's transport after it."""
    import socket
    import time

    from broker_filter.amqp import types as t
    from broker_filter.amqp import decode, encode
    from broker_filter.security import AMQP_HEADER, SASL_HEADER

    def frame(code: int, fields: list, frame_type: int) -> bytes:
        body = encode(t.Described(t.ulong(code), fields))
        return (8 + len(body)).to_bytes(4, "big") + bytes((2, frame_type, 0, 0)) + body

    r = running(listener_config(f'listener.users={{alice = "{ALICE}"}}'))
    init = frame(0x41, [t.symbol("PLAIN"), b"\0alice\0wonderland"], 1)
    open_frame = frame(0x10, ["raw-client"], 0)
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as sock:
        sock.sendall(SASL_HEADER + init + AMQP_HEADER + open_frame)
        received = b""
        deadline = time.monotonic() + 10
        while AMQP_HEADER not in received or len(received) < received.index(AMQP_HEADER) + 16:
            assert time.monotonic() < deadline, received
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        start = received.index(AMQP_HEADER) + 8
        while len(received) < start + int.from_bytes(received[start:start + 4], "big"):
            received += sock.recv(4096)
    size = int.from_bytes(received[start:start + 4], "big")
    performative, _ = decode(received[start + 4 * received[start + 4]:start + size], 0)
    assert performative.descriptor == 0x10  # proton answered our pipelined open with its own
    assert [i.user for i in r.server.identities] == ["alice"]


class _SilentUpstream:
    """An upstream that never comes up: a fault a real broker gives only by timing (it accepted the
    login check a moment before and refuses the connection now)."""

    stopped = False

    def stop(self):
        self.stopped = True


def test_pass_through_client_is_closed_when_its_upstream_never_comes_up():
    from broker_filter.proxy.passthrough import PassThrough

    upstreams = []

    def make_server(user, password, n, vhost=None):
        upstreams.append(_SilentUpstream())
        return Server(), upstreams[-1]

    default = Server()
    container = EngineContainer("listener-test")
    passthrough = PassThrough(default, make_server, lambda upstream, listener: None,
                              lambda delay, fn: container.loop.call_later(delay, fn), connect_timeout=0.5)
    listener = listener_config("listener.allow_anonymous=false", "upstream.urls=amqp://127.0.0.1:1",
                               "upstream.credentials=pass-through")
    listening = listen(container, listener, passthrough, passthrough=lambda user, password: True)

    def stop():
        listening.close()
        container.stop()

    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    try:
        with pytest.raises(Exception) as info:
            BlockingConnection(f"amqp://127.0.0.1:{listening.port}", timeout=20, user="carol", password="x",
                               allowed_mechs="PLAIN")
        assert "did not accept a connection" in str(info.value)
        assert len(upstreams) == 1 and upstreams[0].stopped
        assert default.identities == []  # never served by the default server either
    finally:
        container.loop.call_soon_threadsafe(stop)
        thread.join(20)
