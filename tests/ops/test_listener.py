"""The client listener with real proton clients and a real Container: PLAIN users, pass-through,
ANONYMOUS policy, TLS with certificates generated here, EXTERNAL with client certificates."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest
from proton import Message, SSLDomain
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector
from proton.utils import BlockingConnection

from broker_filter.config import add_serve_arguments, load
from broker_filter.proxy.listener import identity_of, listen, needs_front_end
from broker_filter.security import hash_password

ALICE = hash_password("wonderland", algorithm="pbkdf2-sha256")


def listener_config(*settings: str, listen_on: str = "127.0.0.1:0"):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = ["--listen", listen_on]
    for item in settings:
        argv += ["--set", item]
    return load(parser.parse_args(argv), {}).listener


class Server(MessagingHandler):
    """Accepts everything; remembers identities and messages; a receiver on `whoami` gets the user."""

    def __init__(self):
        super().__init__()
        self.identities = []
        self.received = []
        self.closed = threading.Event()

    def on_connection_opening(self, event):
        self.identities.append(identity_of(event.connection))

    def on_link_opening(self, event):
        link = event.link
        if link.is_sender:
            link.source.copy(link.remote_source)
        else:
            link.target.copy(link.remote_target)

    def on_message(self, event):
        self.received.append(event.message.body)

    def on_sendable(self, event):
        if event.link.source.address == "whoami" and event.link.credit and not getattr(event.link, "sent", False):
            event.link.sent = True
            identity = identity_of(event.connection)
            event.link.send(Message(body=f"{identity.user}/{identity.mechanism}/tls={identity.tls}"))

    def on_connection_closed(self, event):
        self.closed.set()


class Running:
    def __init__(self, listener, passthrough=None):
        self.server = Server()
        self.container = Container(self.server)
        self.listening = listen(self.container, listener, self.server, passthrough=passthrough)
        self.port = self.listening.port
        self._injector = EventInjector()
        self.container.selectable(self._injector)
        self.server.on_stop_test = self._stop
        self._thread = threading.Thread(target=self.container.run, daemon=True)
        self._thread.start()

    def _stop(self, event):
        self.listening.close()
        self._injector.close()
        self.container.stop()

    def stop(self):
        self._injector.trigger(ApplicationEvent("stop_test"))
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


def test_plain_users_through_the_front_end(running):
    listener = listener_config(f'listener.users={{alice = "{ALICE}"}}')
    assert needs_front_end(listener)
    r = running(listener)
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


def test_anonymous_only_uses_protons_own_acceptor(running):
    listener = listener_config()
    assert not needs_front_end(listener)
    r = running(listener)
    assert not r.listening.front_end
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


def test_tls_anonymous_on_protons_acceptor(running, pki):
    listener = listener_config(*tls_settings(pki))
    assert not needs_front_end(listener)
    r = running(listener)
    assert whoami(f"amqps://127.0.0.1:{r.port}", ssl_domain=client_domain(pki)) == "anonymous/ANONYMOUS/tls=False"


def test_external_with_a_client_certificate(running, pki):
    r = running(listener_config(
        *tls_settings(pki), f"listener.tls.ca_file={pki / 'ca.pem'}", "listener.tls.verify_client=true",
        "listener.sasl_mechanisms=EXTERNAL,PLAIN", "listener.allow_anonymous=false",
    ))
    url = f"amqps://127.0.0.1:{r.port}"
    assert whoami(url, ssl_domain=client_domain(pki, cert=True), allowed_mechs="EXTERNAL") == (
        "commonName=client-1/EXTERNAL/tls=True"
    )
    with pytest.raises(Exception):  # no client certificate: the TLS handshake fails
        BlockingConnection(url, timeout=20, ssl_domain=client_domain(pki), allowed_mechs="EXTERNAL")


def upstream_tls(*settings: str):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = [x for setting in settings for x in ("--set", setting)]
    return load(parser.parse_args(argv), {}).upstream.tls


def test_upstream_tls_domain_from_configuration(running, pki):
    """What `[upstream.tls]` gives a proton client connecting to an amqps:// upstream."""
    from broker_filter.proxy.listener import proton_client_ssl_domain

    r = running(listener_config(*tls_settings(pki)))
    url = f"amqps://127.0.0.1:{r.port}"
    trusted = upstream_tls(f"upstream.tls.ca_file={pki / 'ca.pem'}", "upstream.tls.verify=peer")
    assert whoami(url, ssl_domain=proton_client_ssl_domain(trusted)).startswith("anonymous/")
    named = upstream_tls(f"upstream.tls.ca_file={pki / 'ca.pem'}")
    assert named.verify == "peer-name"
    # proton checks the peer name against DNS names: connect to 127.0.0.1, expect the name localhost
    domain = proton_client_ssl_domain(named)
    assert whoami(url, ssl_domain=domain, virtual_host="localhost").startswith("anonymous/")
    with pytest.raises(Exception):
        BlockingConnection(url, timeout=20, ssl_domain=domain, virtual_host="elsewhere.example")
    strangers = upstream_tls(f"upstream.tls.ca_file={pki / 'other.pem'}", "upstream.tls.verify=peer")
    with pytest.raises(Exception):
        BlockingConnection(url, timeout=20, ssl_domain=proton_client_ssl_domain(strangers))
    unverified = upstream_tls("upstream.tls.verify=none")
    assert whoami(url, ssl_domain=proton_client_ssl_domain(unverified)).startswith("anonymous/")


def test_pass_through_checks_credentials_against_the_upstream(running):
    """The upstream here is a listener with PLAIN users (it checks credentials the way a broker does)."""
    import socket

    from broker_filter.proxy.listener import upstream_login

    upstream = running(listener_config(f'listener.users={{alice = "{ALICE}"}}', "listener.allow_anonymous=false"))
    with socket.socket() as s:  # a port nobody listens on: the first failover URL is down
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    check = upstream_login([f"amqp://127.0.0.1:{dead}", f"amqp://ignored:creds@127.0.0.1:{upstream.port}"],
                           timeout=5)
    assert check("alice", "wonderland")
    assert not check("alice", "guess")
    assert not upstream_login([f"amqp://127.0.0.1:{dead}"], timeout=5)("alice", "wonderland")

    proxy = running(listener_config("listener.allow_anonymous=false", f"upstream.urls=amqp://127.0.0.1:{upstream.port}",
                                    "upstream.credentials=pass-through"), passthrough=check)
    url = f"amqp://127.0.0.1:{proxy.port}"
    assert whoami(url, user="alice", password="wonderland", allowed_mechs="PLAIN") == "alice/PLAIN/tls=False"
    with pytest.raises(Exception) as info:
        BlockingConnection(url, timeout=20, user="alice", password="guess", allowed_mechs="PLAIN")
    assert "amqp:unauthorized-access" in str(info.value)


def test_frames_pipelined_after_sasl_reach_proton(running):
    """A client may send its AMQP header and open right behind sasl-init, before the outcome: those
    bytes are read by the front end and must be handed to proton with the socket."""
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

    def make_server(user, password, n):
        upstreams.append(_SilentUpstream())
        return Server(), upstreams[-1]

    default = Server()
    container = Container(default)
    timers = []
    passthrough = PassThrough(default, make_server, lambda upstream, listener: None,
                              lambda delay, fn: timers.append(container.schedule(delay, _Call(fn))),
                              connect_timeout=0.5)
    listener = listener_config("listener.allow_anonymous=false", "upstream.urls=amqp://127.0.0.1:1",
                               "upstream.credentials=pass-through")
    listening = listen(container, listener, passthrough, passthrough=lambda user, password: True)
    injector = EventInjector()
    container.selectable(injector)

    def stop(event):
        listening.close()
        injector.close()
        container.stop()

    default.on_stop_test = stop
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
        injector.trigger(ApplicationEvent("stop_test"))
        thread.join(20)


class _Call:
    def __init__(self, fn):
        self.fn = fn

    def on_timer_task(self, event):
        self.fn()
