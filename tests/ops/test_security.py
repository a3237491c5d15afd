"""Password hashes, the user database, redaction, and the SASL server against real proton clients."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from proton import Collector, Connection, Event, Transport
from proton.utils import BlockingConnection

from broker_filter.amqp import types as t
from broker_filter.amqp import decode, encode
from broker_filter.security import (
    AMQP_HEADER,
    SASL_HEADER,
    PasswordHashError,
    SaslClientExchange,
    SaslServer,
    UserDatabase,
    hash_password,
    parse_password_hash,
    redact_text,
    redact_url,
)

ALICE = hash_password("wonderland", algorithm="pbkdf2-sha256")


# -------------------------------------------------------------------------------------------------
# hashes


def test_hashes_are_salted_and_verify():
    first, second = hash_password("pw"), hash_password("pw")
    assert first != second and first.startswith("$scrypt$ln=15,r=8,p=1$")
    assert parse_password_hash(first).verify("pw")
    assert not parse_password_hash(first).verify("pW")
    assert parse_password_hash(ALICE).verify("wonderland")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("wonderland", "plain-text passwords are not accepted"),
        ("$argon2id$v=19$x$y", "unknown password hash algorithm"),
        ("$scrypt$ln=99,r=8,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", "out of range"),
        ("$scrypt$ln=15,r=8$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", "lacks parameter 'p'"),
        ("$pbkdf2-sha256$i=600000$!!$aGFzaA", "base64"),
        ("$pbkdf2-sha256$i=600000$c2FsdA$aGFzaA", "too short"),
    ],
)
def test_bad_hashes_say_why_without_echoing(text, reason):
    with pytest.raises(PasswordHashError) as info:
        parse_password_hash(text)
    assert reason in str(info.value)
    assert "aGFzaGhhc2hoYXNoaGFzaA" not in str(info.value)


def test_user_database_unknown_users_and_cache(monkeypatch):
    from broker_filter.security import PasswordHash

    hashed = []
    compute = PasswordHash.compute
    monkeypatch.setattr(PasswordHash, "compute", lambda self, pw: hashed.append(1) or compute(self, pw))
    db = UserDatabase({"alice": ALICE})
    hashed.clear()
    assert "alice" in db and len(db) == 1
    assert db.authenticate("alice", "wonderland")
    assert not db.authenticate("alice", "Wonderland")
    assert not db.authenticate("mallory", "wonderland")  # hashes against a dummy: same cost
    assert len(hashed) == 3
    for _ in range(20):
        assert db.authenticate("alice", "wonderland")  # remembered: no second hashing
    assert len(hashed) == 3
    for _ in range(2):
        assert not db.authenticate("alice", "Wonderland")  # failures are never remembered
    assert len(hashed) == 5
    uncached = UserDatabase({"alice": ALICE}, cache_size=0)
    assert uncached.authenticate("alice", "wonderland")
    assert not uncached.authenticate("alice", "nope")


def test_redaction():
    assert redact_url("amqp://guest:guest@localhost:5672/q") == "amqp://guest:***@localhost:5672/q"
    assert redact_url("amqps://host:5671") == "amqps://host:5671"
    assert redact_url("amqp://user@host") == "amqp://user@host"
    assert redact_url("amqp://u:p@h:bad") == "amqp://u:***@h:bad"
    assert redact_text("to amqp://a:b@h and amqps://c:d@e/x") == "to amqp://a:***@h and amqps://c:***@e/x"


def test_upstream_names_are_redacted_by_the_same_rule():
    from broker_filter.proxy.remote import RemoteUpstream

    urls = ["amqp://u:secret@[::1]:5672", "amqps://proxy:p%40ss@broker.example"]
    assert RemoteUpstream(urls).name == ", ".join(redact_url(u) for u in urls)
    assert RemoteUpstream(urls).name == "amqp://u:***@[::1]:5672, amqps://proxy:***@broker.example"
    with pytest.raises(ValueError, match=r"not 'http://u:\*\*\*@h'"):
        RemoteUpstream(["http://u:secret@h"])


# -------------------------------------------------------------------------------------------------
# SASL frames without a network


def frame(code: int, fields: list) -> bytes:
    body = encode(t.Described(t.ulong(code), fields))
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + body


def frames(data: bytes) -> list:
    out = []
    while data:
        size = int.from_bytes(data[:4], "big")
        out.append(decode(data[data[4] * 4 : size], 0)[0])
        data = data[size:]
    return out


def plain_init(user: str, password: str, authzid: str = "") -> bytes:
    response = f"{authzid}\0{user}\0{password}".encode()
    return frame(0x41, [t.symbol("PLAIN"), response])


def test_plain_exchange_in_pieces_with_pipelined_amqp_header():
    db = UserDatabase({"alice": ALICE})
    sasl = SaslServer(("PLAIN",), db.authenticate)
    stream = SASL_HEADER + plain_init("alice", "wonderland") + AMQP_HEADER + b"rest"
    for i in range(len(stream)):  # one byte at a time
        sasl.receive(stream[i : i + 1])
    out = sasl.data_to_send()
    assert out.startswith(SASL_HEADER)
    mechanisms, outcome = frames(out[8:])
    assert mechanisms.descriptor == 0x40 and list(mechanisms.value[0]) == ["PLAIN"]
    assert outcome.descriptor == 0x44 and outcome.value[0] == 0
    assert sasl.done and sasl.outcome.ok and sasl.outcome.user == "alice"
    assert sasl.outcome.password is None  # not kept unless pass-through asks
    assert sasl.leftover == AMQP_HEADER + b"rest"
    sasl.receive(b"more")
    assert sasl.leftover.endswith(b"restmore")


@pytest.mark.parametrize(
    "init, reason",
    [
        (plain_init("alice", "nope"), "wrong user name or password"),
        (plain_init("alice", "wonderland", authzid="root"), "authorization identity differs"),
        (frame(0x41, [t.symbol("PLAIN"), b"no-nul-bytes"]), "malformed PLAIN response"),
        (frame(0x41, [t.symbol("ANONYMOUS")]), "not offered"),
        (frame(0x41, [t.symbol("GSSAPI"), b""]), "not offered"),
        (frame(0x42, [b""]), "malformed SASL frame"),
        (b"\xff\xff\xff\xff\x02\x01\x00\x00", "malformed SASL frame"),
    ],
)
def test_refusals(init, reason):
    sasl = SaslServer(("PLAIN",), UserDatabase({"alice": ALICE}).authenticate)
    sasl.receive(SASL_HEADER + init)
    assert sasl.failed and not sasl.outcome.ok and reason in sasl.outcome.reason
    assert "wonderland" not in repr(sasl.outcome)
    outcome = frames(sasl.data_to_send()[8:])[-1]
    assert outcome.descriptor == 0x44 and outcome.value[0] in (1, 3)


def test_wrong_protocol_header_is_answered_with_ours():
    sasl = SaslServer(("ANONYMOUS",))
    sasl.receive(b"GET / HTTP/1.1\r\n")
    assert sasl.failed and sasl.data_to_send() == SASL_HEADER
    skipped = SaslServer(("ANONYMOUS",), allow_skip=False)
    skipped.receive(AMQP_HEADER)
    assert skipped.failed
    allowed = SaslServer(("ANONYMOUS",), allow_skip=True)
    allowed.receive(AMQP_HEADER + b"x")
    assert allowed.done and allowed.outcome.user == "anonymous" and allowed.leftover == AMQP_HEADER + b"x"


def test_deferred_verification_for_pass_through():
    seen = []
    sasl = SaslServer(("PLAIN",), lambda u, p: seen.append((u, p)), keep_password=True)
    sasl.receive(SASL_HEADER + plain_init("bob", "builder") + AMQP_HEADER)
    assert sasl.pending and seen == [("bob", "builder")]
    sasl.data_to_send()
    sasl.resolve(True)
    assert sasl.done and sasl.outcome.password == "builder" and sasl.leftover == AMQP_HEADER
    assert "builder" not in repr(sasl.outcome)
    assert frames(sasl.data_to_send())[0].value[0] == 0
    with pytest.raises(RuntimeError):
        sasl.resolve(True)
    refused = SaslServer(("PLAIN",), lambda u, p: None)
    refused.receive(SASL_HEADER + plain_init("bob", "x"))
    refused.resolve(False, "upstream refused the credentials")
    assert refused.failed and refused.outcome.reason == "upstream refused the credentials"


# -------------------------------------------------------------------------------------------------
# The client side (a splice's login to a queue's owner)


@pytest.mark.parametrize("login,mechanisms", [(("alice", "wonderland"), ("PLAIN",)), ((None, None), ("ANONYMOUS",))])
def test_client_exchange_against_our_server_byte_by_byte(login, mechanisms):
    client = SaslClientExchange(*login)
    server = SaslServer(mechanisms, UserDatabase({"alice": ALICE}).authenticate)
    server.receive(client.data_to_send() + AMQP_HEADER)
    assert server.done and server.outcome.user == (login[0] or "anonymous")
    assert server.leftover == AMQP_HEADER
    answer = server.data_to_send() + AMQP_HEADER + b"open"
    for i in range(len(answer)):  # however the answer is cut up
        client.receive(answer[i:i + 1])
        assert not client.failed
    assert client.done and client.leftover == AMQP_HEADER + b"open"
    client.receive(b"more")
    assert client.leftover == AMQP_HEADER + b"openmore"
    assert client.data_to_send() == b""  # the header and the init went at once, and only once


@pytest.mark.parametrize(
    "answer,reason",
    [
        (lambda: SaslServer(("PLAIN",), lambda u, p: False), "refused the PLAIN login (sasl-outcome code 1)"),
        (lambda: SaslServer(("ANONYMOUS",)), "refused the PLAIN login"),  # PLAIN not offered
        (b"AMQP\x00\x01\x00\x00", "answered with the header"),
        (SASL_HEADER + frame(0x42, [b"challenge"]), "not an outcome"),
        (SASL_HEADER + b"\xff\xff\xff\xff\x02\x01\x00\x00", "malformed SASL frame"),
    ],
)
def test_client_exchange_failures_say_why(answer, reason):
    client = SaslClientExchange("alice", "wonderland")
    sent = client.data_to_send()
    if callable(answer):
        server = answer()
        server.receive(sent)
        answer = server.data_to_send()
    client.receive(answer)
    assert client.failed and not client.done and reason in client.reason
    assert "wonderland" not in client.reason


# -------------------------------------------------------------------------------------------------
# Against real proton clients: SaslServer first, then a proton server Transport without SASL.


class SaslFrontedServer:
    """A one-connection AMQP server: our SASL exchange, then proton's engine for the AMQP part."""

    def __init__(self, make_sasl):
        self._make_sasl = make_sasl
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.outcome = None
        self.opened = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.listener.settimeout(20)
            sock, _ = self.listener.accept()
            with sock:
                sock.settimeout(20)
                sasl = self._make_sasl()
                while not (sasl.done or sasl.failed):
                    data = sock.recv(4096)
                    if not data:
                        return
                    sasl.receive(data)
                    sock.sendall(sasl.data_to_send())
                self.outcome = sasl.outcome
                if sasl.failed:
                    return
                self._serve_amqp(sock, sasl.leftover)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e
        finally:
            self.listener.close()

    def _serve_amqp(self, sock: socket.socket, leftover: bytes) -> None:
        transport = Transport(Transport.SERVER)
        connection = Connection()
        collector = Collector()
        connection.collect(collector)
        transport.bind(connection)
        if leftover:
            transport.push(leftover)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            event = collector.peek()
            while event is not None:
                if event.type == Event.CONNECTION_REMOTE_OPEN:
                    connection.open()
                    self.opened.set()
                elif event.type == Event.CONNECTION_REMOTE_CLOSE:
                    connection.close()
                collector.pop()
                event = collector.peek()
            pending = transport.pending()
            if pending > 0:
                sock.sendall(transport.peek(pending))
                transport.pop(pending)
            elif pending < 0 or transport.closed:
                return
            data = sock.recv(4096)
            if not data:
                return
            transport.push(data)

    def join(self) -> None:
        self._thread.join(timeout=30)
        if self.error is not None:
            raise self.error


def test_proton_client_logs_in_with_plain():
    db = UserDatabase({"alice": ALICE})
    server = SaslFrontedServer(lambda: SaslServer(("PLAIN", "ANONYMOUS"), db.authenticate))
    conn = BlockingConnection(
        f"amqp://127.0.0.1:{server.port}", timeout=20, user="alice", password="wonderland", allowed_mechs="PLAIN"
    )
    assert server.opened.wait(20)
    conn.close()
    server.join()
    assert server.outcome.ok and server.outcome.user == "alice" and server.outcome.mechanism == "PLAIN"


def test_proton_client_with_wrong_password_gets_unauthorized_access():
    db = UserDatabase({"alice": ALICE})
    server = SaslFrontedServer(lambda: SaslServer(("PLAIN",), db.authenticate))
    with pytest.raises(Exception) as info:
        BlockingConnection(
            f"amqp://127.0.0.1:{server.port}", timeout=20, user="alice", password="guess", allowed_mechs="PLAIN"
        )
    server.join()
    assert "amqp:unauthorized-access" in str(info.value)
    assert not server.outcome.ok and server.outcome.reason == "wrong user name or password"


def test_proton_client_anonymous():
    server = SaslFrontedServer(lambda: SaslServer(("ANONYMOUS",)))
    conn = BlockingConnection(f"amqp://127.0.0.1:{server.port}", timeout=20, allowed_mechs="ANONYMOUS")
    assert server.opened.wait(20)
    conn.close()
    server.join()
    assert server.outcome.ok and server.outcome.mechanism == "ANONYMOUS"


def test_proton_client_refused_anonymous_when_only_plain_is_offered():
    server = SaslFrontedServer(lambda: SaslServer(("PLAIN",), UserDatabase({"alice": ALICE}).authenticate))
    with pytest.raises(Exception) as info:
        BlockingConnection(f"amqp://127.0.0.1:{server.port}", timeout=20, allowed_mechs="ANONYMOUS")
    server.join()
    assert "amqp:unauthorized-access" in str(info.value)


# -------------------------------------------------------------------------------------------------
# Hash cost, remembered logins, EXTERNAL's certificate -> user mapping, refusals for now


def test_the_hash_cost_is_a_parameter_read_back_from_the_stored_hash():
    from broker_filter.security import check_cost

    cheap = hash_password("pw", cost=12)
    assert cheap.startswith("$scrypt$ln=12,r=8,p=1$") and parse_password_hash(cheap).verify("pw")
    costly = hash_password("pw", cost=16)  # 64 MiB of scrypt memory: past hashlib's default cap
    assert parse_password_hash(costly).verify("pw") and not parse_password_hash(costly).verify("pW")
    assert hash_password("pw", algorithm="pbkdf2-sha256", cost=20_000).startswith("$pbkdf2-sha256$i=20000$")
    with pytest.raises(ValueError, match=r"scrypt cost \(log2 of N\) must be within 10\.\.22, not 9"):
        check_cost("scrypt", 9)
    with pytest.raises(ValueError, match="iterations"):
        hash_password("pw", algorithm="pbkdf2-sha256", cost=5)


def test_unknown_users_cost_what_the_costliest_stored_hash_costs(monkeypatch):
    from broker_filter.security import PasswordHash

    db = UserDatabase({"alice": ALICE, "bob": hash_password("b", algorithm="pbkdf2-sha256", cost=10_000)})
    computed = []
    compute = PasswordHash.compute
    monkeypatch.setattr(PasswordHash, "compute", lambda self, pw: computed.append(dict(self.params)) or compute(self, pw))
    assert not db.authenticate("mallory", "x")
    assert computed == [{"i": 600_000}]


def test_remembered_credentials_answer_without_hashing():
    db = UserDatabase({"alice": ALICE})
    assert not db.remembered("alice", "wonderland")
    assert db.authenticate("alice", "wonderland")
    assert db.remembered("alice", "wonderland")
    assert not db.remembered("alice", "Wonderland") and not db.remembered("mallory", "wonderland")
    assert not UserDatabase({"alice": ALICE}, cache_size=0).remembered("alice", "wonderland")


CERT = {"subject": ((("countryName", "DE"),), (("organizationName", "Acme"),), (("commonName", "billing-app"),))}


def test_certificate_users_by_subject_common_name_or_configured_user():
    from broker_filter.security import CertificateUsers, normalize_subject

    assert normalize_subject("C=DE, O=Acme, CN=billing-app") == "C=DE,O=Acme,CN=billing-app"
    assert normalize_subject("/C=DE/O=Acme/CN=billing-app") == "C=DE,O=Acme,CN=billing-app"
    assert normalize_subject("commonName = x") == "CN=x"
    with pytest.raises(ValueError, match="not an attribute"):
        normalize_subject("CN=x,garbage")
    subject = "C=DE,O=Acme,CN=billing-app"
    assert CertificateUsers({"C=DE, O=Acme, CN=billing-app": "billing"})(CERT) == (subject, "billing")
    assert CertificateUsers({"CN=billing-app,O=Acme,C=DE": "billing"})(CERT) == (subject, "billing")  # RFC 4514
    assert CertificateUsers({"billing-app": "billing"})(CERT) == (subject, "billing")
    assert CertificateUsers({}, users={"billing-app"})(CERT) == (subject, "billing-app")
    assert CertificateUsers({"other": "billing-app"})(CERT) == (subject, "billing-app")  # a configured user
    assert CertificateUsers({"CN=billing-app": "billing"})(CERT) == (subject, None)  # not the whole subject
    assert CertificateUsers({}, users={"alice"})(CERT) == (subject, None)
    assert CertificateUsers({}, users={"alice"})(None) == (None, None)


def test_external_refused_when_the_certificate_maps_to_no_user():
    sasl = SaslServer(("EXTERNAL",), external_identity=None, external_subject="CN=stranger")
    sasl.receive(SASL_HEADER)
    assert list(frames(sasl.data_to_send()[8:])[0].value[0]) == ["EXTERNAL"]  # offered: a certificate came
    sasl.receive(frame(0x41, [t.symbol("EXTERNAL"), b""]))
    assert sasl.failed and sasl.outcome.category == "unknown-certificate"
    assert sasl.outcome.reason == "the client certificate CN=stranger maps to no configured user"
    assert frames(sasl.data_to_send())[0].value[0] == 1
    mapped = SaslServer(("EXTERNAL",), external_identity="billing", external_subject="CN=billing-app")
    mapped.receive(SASL_HEADER + frame(0x41, [t.symbol("EXTERNAL"), b""]))
    assert mapped.done and (mapped.outcome.user, mapped.outcome.subject) == ("billing", "CN=billing-app")
    assert SaslServer(("EXTERNAL", "PLAIN")).mechanisms == ("PLAIN",)  # no certificate: not offered


def test_a_login_refused_for_now_is_sys_temp():
    sasl = SaslServer(("PLAIN",), lambda u, p: None)
    sasl.receive(SASL_HEADER + plain_init("bob", "x"))
    sasl.data_to_send()
    sasl.resolve(False, "too many logins wait", temporary=True, category="queue-full")
    assert sasl.failed and sasl.outcome.category == "queue-full"
    assert frames(sasl.data_to_send())[0].value[0] == 4  # sys-temp
