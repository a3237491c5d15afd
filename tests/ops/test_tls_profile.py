"""The listener's TLS against Mozilla's intermediate profile, as sslyze (from PyPI) checks it: a real
daemon on loopback with certificates generated here, scanned for versions, cipher suites, groups,
the known vulnerabilities and the certificate; and client certificates checked against a CRL."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from broker_filter.security import SASL_HEADER
from launcher import Daemon

sslyze = pytest.importorskip("sslyze", reason="sslyze is in the [test] extra")
from sslyze import (  # noqa: E402
    CertificateInfoExtraArgument,
    ScanCommand,
    ScanCommandsExtraArguments,
    Scanner,
    ServerNetworkConfiguration,
    ServerNetworkLocation,
    ServerScanRequest,
)
from sslyze.mozilla_tls_profile.tls_config_checker import (  # noqa: E402
    SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER,
    MozillaTlsConfiguration,
    ServerNotCompliantWithTlsConfiguration,
    TlsConfigurationEnum,
    check_server_against_tls_configuration,
)


# sslyze's own trust stores hold a certificate the cryptography package warns about (not ours).
pytestmark = pytest.mark.filterwarnings("ignore:Parsed a serial number which wasn't positive")


@pytest.fixture(scope="module")
def webpki(tmp_path_factory) -> Path:
    """A CA and a server certificate for localhost as public CAs make them (the extensions strict path
    validation asks for: key usages, key identifiers), P-256 keys, two days."""
    openssl = shutil.which("openssl")
    d = tmp_path_factory.mktemp("webpki")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    # (openssl's default configuration adds the CA's basic constraints and key identifiers)
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=broker-filter web CA",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nkeyUsage=critical,digitalSignature\n"
                                  "extendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\n"
                                  "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return d


def tls_daemon(pki: Path, *settings: str) -> Daemon:
    args = ["--metrics", "127.0.0.1:0", "--set", f"listener.tls.cert_file={pki / 'server.pem'}",
            "--set", f"listener.tls.key_file={pki / 'server.key'}"]
    for item in settings:
        args += ["--set", item]
    return Daemon(*args)


def scan(port: int, pki: Path, commands: set) -> object:
    request = ServerScanRequest(
        server_location=ServerNetworkLocation("localhost", port, ip_address="127.0.0.1"),
        network_configuration=ServerNetworkConfiguration("localhost"),
        scan_commands=commands,
        scan_commands_extra_arguments=ScanCommandsExtraArguments(
            certificate_info=CertificateInfoExtraArgument(custom_ca_file=pki / "ca.pem")),
    )
    scanner = Scanner()
    scanner.queue_scans([request])
    (result,) = list(scanner.get_results())
    return result


def test_sslyze_finds_nothing_outside_mozillas_intermediate_profile(webpki):
    d = tls_daemon(webpki)
    try:
        result = scan(d.port, webpki, set(SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER))
        # Raises ServerNotCompliantWithTlsConfiguration naming every issue found.
        check_server_against_tls_configuration(result, MozillaTlsConfiguration.get(TlsConfigurationEnum.MOZILLA_INTERMEDIATE))
        curves = {c.name for c in result.scan_result.elliptic_curves.result.supported_curves}
        assert curves == {"X25519", "secp256r1", "secp384r1"}, curves  # (prime256v1 by its SECG name)
        tls12 = {c.cipher_suite.name for c in result.scan_result.tls_1_2_cipher_suites.result.accepted_cipher_suites}
        assert tls12 and all("GCM" in c or "CHACHA20" in c for c in tls12), tls12
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_the_check_fails_a_listener_told_to_allow_cbc_and_other_groups(webpki):
    """The same check, on a listener configured outside the profile: it must say so."""
    d = tls_daemon(webpki, "listener.tls.ciphers=DEFAULT", "listener.tls.groups=X25519,X448,secp521r1")
    try:
        result = scan(d.port, webpki, set(SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER))
        with pytest.raises(ServerNotCompliantWithTlsConfiguration) as info:
            check_server_against_tls_configuration(
                result, MozillaTlsConfiguration.get(TlsConfigurationEnum.MOZILLA_INTERMEDIATE))
        assert set(info.value.issues) == {"ciphers", "tls_curves"}, info.value.issues
    finally:
        d.stop()


def test_tls13_only(pki):
    d = tls_daemon(pki, "listener.tls.min_version=TLSv1.3")
    try:
        result = scan(d.port, pki, {ScanCommand.TLS_1_2_CIPHER_SUITES, ScanCommand.TLS_1_3_CIPHER_SUITES,
                                    ScanCommand.CERTIFICATE_INFO})
        assert not result.scan_result.tls_1_2_cipher_suites.result.is_tls_version_supported
        assert result.scan_result.tls_1_3_cipher_suites.result.is_tls_version_supported
    finally:
        d.stop()


# -------------------------------------------------------------------------------------------------
# Certificate revocation


@pytest.fixture(scope="module")
def revoked(pki, tmp_path_factory) -> Path:
    """Two client certificates of the test CA, `kept` and `revoked`, and `crl.pem` revoking the second."""
    openssl = shutil.which("openssl")
    d = tmp_path_factory.mktemp("crl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for name in ("kept", "revoked"):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", str(pki / "ca.pem"), "-CAkey", str(pki / "ca.key"),
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2")
    (d / "index.txt").write_text("")
    (d / "crlnumber").write_text("01\n")
    (d / "ca.cnf").write_text("[ca]\ndefault_ca = here\n[here]\ndatabase = index.txt\ncrlnumber = crlnumber\n"
                              "default_md = sha256\ndefault_crl_days = 2\n")
    keys = ["-keyfile", str(pki / "ca.key"), "-cert", str(pki / "ca.pem")]
    run("ca", "-config", "ca.cnf", "-revoke", "revoked.pem", *keys)
    run("ca", "-config", "ca.cnf", "-gencrl", "-out", "crl.pem", *keys)
    return d


def sasl_answer(port: int, pki: Path, cert: Path, key: Path) -> bytes:
    """What the listener answers a SASL header with, over TLS with the client certificate `cert`."""
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    context.load_cert_chain(str(cert), str(key))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(SASL_HEADER)
            return tls.recv(8)


def test_a_revoked_client_certificate_is_refused(pki, revoked):
    d = tls_daemon(pki, f"listener.tls.ca_file={pki / 'ca.pem'}", "listener.tls.verify_client=true",
                   f"listener.tls.crl_file={revoked / 'crl.pem'}")
    try:
        assert sasl_answer(d.port, pki, revoked / "kept.pem", revoked / "kept.key") == SASL_HEADER
        try:  # the listener ends the connection after the handshake (TLS 1.3: the client has finished)
            answer = sasl_answer(d.port, pki, revoked / "revoked.pem", revoked / "revoked.key")
        except (ssl.SSLError, ConnectionResetError) as e:
            answer = str(e).encode()
        assert SASL_HEADER not in answer
        d.wait_for("certificate verify failed: certificate revoked", 10)
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_without_the_crl_the_same_certificate_is_accepted(pki, revoked):
    """(what the CRL changes: the revoked certificate is otherwise a good one)"""
    d = tls_daemon(pki, f"listener.tls.ca_file={pki / 'ca.pem'}", "listener.tls.verify_client=true")
    try:
        assert sasl_answer(d.port, pki, revoked / "revoked.pem", revoked / "revoked.key") == SASL_HEADER
    finally:
        d.stop()


# -------------------------------------------------------------------------------------------------
# Settings OpenSSL or the daemon cannot use: refused when the configuration is loaded


def config_error(*settings: str):
    import argparse

    from broker_filter.config import ConfigError, add_serve_arguments, load

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = []
    for item in settings:
        argv += ["--set", item]
    with pytest.raises(ConfigError) as info:
        load(parser.parse_args(argv), {})
    return info.value


def test_bad_tls_settings_name_the_key(pki):
    tls = [f"listener.tls.cert_file={pki / 'server.pem'}", f"listener.tls.key_file={pki / 'server.key'}"]
    for extra, key, reason in (
        (["listener.tls.ciphers=NO-SUCH-CIPHER"], "listener.tls.ciphers", "OpenSSL selects no cipher"),
        (["listener.tls.groups=X25519,no-such-group"], "listener.tls.groups", "does not know one of"),
        (["listener.tls.groups=X25519,a b"], "listener.tls.groups", "is not a group name"),
        (["listener.tls.min_version=TLSv1.1"], "listener.tls.min_version", "must be one of TLSv1.2, TLSv1.3"),
        ([f"listener.tls.crl_file={pki / 'ca.pem'}"], "listener.tls.crl_file", "needs listener.tls.verify_client"),
        ([f"listener.tls.ca_file={pki / 'ca.pem'}", "listener.tls.verify_client=true",
          f"listener.tls.crl_file={pki / 'server.key'}"], "listener.tls.crl_file", "holds no PEM certificate"),
        (["replicas.peers=a:1,b:1", "replicas.self=a:1", "upstream.urls=amqp://rabbit", "replicas.splice=true"],
         "replicas.splice", "cannot be combined with listener.tls"),
        (["replicas.peers=a:1,b:1", "replicas.self=a:1", "upstream.urls=amqp://rabbit",
          "replicas.tls.ciphers=NO-SUCH-CIPHER"], "replicas.tls.ciphers", "OpenSSL selects no cipher"),
    ):
        err = config_error(*tls, *extra)
        assert (err.key, reason in err.reason) == (key, True), (extra, str(err))


def test_replicas_take_the_listener_tls_and_its_profile(pki):
    """Replicas behind a TLS listener reach each other over TLS (they were refused once), hardened as
    the listener is: Mozilla's intermediate profile unless `replicas.tls` says otherwise."""
    import argparse

    from broker_filter.config import add_serve_arguments, load
    from broker_filter.security import INTERMEDIATE_CIPHERS, replica_ssl_context

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = []
    for item in (f"listener.tls.cert_file={pki / 'server.pem'}", f"listener.tls.key_file={pki / 'server.key'}",
                 f"listener.tls.ca_file={pki / 'ca.pem'}", "replicas.peers=a:1,b:1", "replicas.self=a:1",
                 "upstream.urls=amqp://rabbit"):
        argv += ["--set", item]
    config = load(parser.parse_args(argv), {})
    assert config.replicas.tls.ciphers == INTERMEDIATE_CIPHERS
    context = replica_ssl_context(config.replicas.tls, config.listener.tls)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    tls12 = {c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == set(INTERMEDIATE_CIPHERS.split(":"))


def test_the_groups_are_set_as_a_list_on_this_python():
    """The ctypes path finds the context's SSL_CTX here (else only the first group would be set)."""
    from broker_filter.security import _groups_setter

    setter = _groups_setter()
    assert setter is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert setter(context, "X25519:prime256v1:secp384r1") is True
    assert setter(context, "X25519:nonsense") is False


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> str | None:
    """A TLS handshake in memory between the two contexts: the cipher agreed, or None when it failed."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for side, out, peer_in in ((c, c_out, s_in), (s, s_out, c_in)):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return None
            peer_in.write(out.read())
        if done == 2:
            return c.cipher()[0]
    return None


def test_the_upstream_connection_offers_the_intermediate_profile_unless_told_otherwise(pki):
    """`[upstream.tls]` has the listener's `min_version`, `ciphers` and `groups`: a broker that offers
    only a CBC suite of TLS 1.2 is not reached with the defaults, and is once `upstream.tls.ciphers`
    names that suite; a bad value names its key."""
    import argparse

    from broker_filter.engine.container import client_ssl_context as upstream_ssl_context
    from broker_filter.config import add_serve_arguments, load
    from broker_filter.security import INTERMEDIATE_CIPHERS

    def upstream_tls(*items: str):
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        argv = ["--set", "upstream.urls=amqps://localhost", "--set", f"upstream.tls.ca_file={pki / 'ca.pem'}"]
        for item in items:
            argv += ["--set", item]
        return load(parser.parse_args(argv), {}).upstream.tls

    old_broker = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    old_broker.load_cert_chain(pki / "server.pem", pki / "server.key")
    old_broker.maximum_version = ssl.TLSVersion.TLSv1_2
    old_broker.set_ciphers("ECDHE-ECDSA-AES128-SHA")
    modern = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    modern.load_cert_chain(pki / "server.pem", pki / "server.key")

    default = upstream_ssl_context(upstream_tls())
    assert {c["name"] for c in default.get_ciphers() if c["protocol"] == "TLSv1.2"} == set(INTERMEDIATE_CIPHERS.split(":"))
    assert default.minimum_version == ssl.TLSVersion.TLSv1_2
    assert _handshake(default, modern) is not None
    tls12_only = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # a P-256 ECDSA certificate, TLS 1.2 (see `harden`)
    tls12_only.load_cert_chain(pki / "server.pem", pki / "server.key")
    tls12_only.maximum_version = ssl.TLSVersion.TLSv1_2
    assert _handshake(default, tls12_only) is not None
    assert _handshake(default, old_broker) is None
    widened = upstream_ssl_context(upstream_tls(f"upstream.tls.ciphers={INTERMEDIATE_CIPHERS}:ECDHE-ECDSA-AES128-SHA"))
    assert _handshake(widened, old_broker) == "ECDHE-ECDSA-AES128-SHA"
    err = config_error("upstream.urls=amqps://localhost", "upstream.tls.ciphers=NO-SUCH-CIPHER")
    assert (err.key, "OpenSSL selects no cipher" in err.reason) == ("upstream.tls.ciphers", True), str(err)
