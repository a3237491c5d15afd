"""Replicas behind a TLS listener (`listener.tls` with `[replicas.tls]`): two `broker-filter serve`
processes in front of RabbitMQ 3.10 reach each other over TLS, the client certificate they present
being the listener's own (`listener.tls.verify_client` asks for one).  A TLS client on one replica
gets exactly its selector's messages of a queue the other owns, through the peer connection; a
replica that trusts another CA never sees its peer live and says why, once; bad settings name the key."""

from __future__ import annotations

import argparse
import re
import ssl
import uuid

import pytest

from clients import receive_n_and_extras, receiver
from launcher import Daemon, free_port, metric_value, scrape
from replicas import expected, publish_parts, replica_config, wait_consumers

from broker_filter.config import ConfigError, add_serve_arguments, load
from broker_filter.proxy.replicas import owner_of

pytestmark = pytest.mark.rabbitmq


def tls_config(pki, ca: str = "ca.pem") -> str:
    """The listener's TLS (client certificates required, from the test CA) and the replicas' CA."""
    return (f'[listener.tls]\ncert_file = "{pki / "server.pem"}"\nkey_file = "{pki / "server.key"}"\n'
            f'ca_file = "{pki / "ca.pem"}"\nverify_client = true\n'
            f'[replicas.tls]\nca_file = "{pki / ca}"\n')


def start(rabbitmq_url: str, peers: list[str], i: int, pki, metrics: int, ca: str = "ca.pem") -> Daemon:
    return Daemon(upstream=rabbitmq_url, listen=peers[i],
                  config=replica_config(peers, peers[i], f"127.0.0.1:{metrics}", heartbeat=10.0) + tls_config(pki, ca))


@pytest.fixture(scope="module")
def pair(rabbitmq3, pki):
    ports = [free_port(), free_port()]
    peers = [f"127.0.0.1:{p}" for p in ports]
    metrics = [free_port(), free_port()]
    daemons = []
    try:
        for i in range(2):
            daemons.append(start(rabbitmq3.url, peers, i, pki, metrics[i]))
        for i, d in enumerate(daemons):
            d.wait_for(re.escape(f"replica {peers[1 - i]} is up"), 30)
        yield peers, daemons, metrics
    finally:
        logs = []
        for d in daemons:
            d.stop()
            logs.append(d.log())
        for text in logs:
            assert "Traceback" not in text, text


def client_domain(pki):
    from proton import SSLDomain

    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER, str(pki / "ca.pem"))
    domain.set_credentials(str(pki / "client.pem"), str(pki / "client.key"), None)
    return domain


def test_a_tls_client_gets_its_matches_of_a_queue_the_other_replica_owns(rabbitmq3, pki, pair):
    from proton.utils import BlockingConnection

    peers, daemons, metrics = pair
    while True:  # a queue the second replica owns; the client attaches on the first
        name = f"replicas-tls-{uuid.uuid4().hex[:10]}"
        q = f"/queue/{name}"
        if owner_of(q, peers) == peers[1]:
            break
    conn = BlockingConnection(f"amqps://{peers[0]}", timeout=20,
                              ssl_domain=client_domain(pki), allowed_mechs="ANONYMOUS")
    try:
        rcv = receiver(conn, q, credit=50, selector="part = 1")
        publish_parts(rabbitmq3.url, q, 0, 90)
        got = receive_n_and_extras(rcv, 30)
        assert sorted(m.body for m in got) == sorted(expected(1, 0, 90))
        # only the owner consumes from the queue: the first replica's link goes through it, over TLS,
        # and only the matching messages cross
        assert wait_consumers(name, 1, broker=rabbitmq3) == 1  # (3.10's: the runs' node may be 4.0 by now)
        assert metric_value(scrape(metrics[0]), "broker_filter_messages_received_total", address=q) == 30
        assert metric_value(scrape(metrics[1]), "broker_filter_messages_received_total", address=q) >= 90
    finally:
        conn.close()
    for d in daemons:
        assert "is not live" not in d.log() and "TLS with" not in d.log(), d.log()


def test_a_replica_trusting_another_ca_never_sees_its_peer_live_and_says_why_once(rabbitmq3, pki, pair):
    peers, _, _ = pair
    lone = f"127.0.0.1:{free_port()}"
    d = Daemon(upstream=rabbitmq3.url, listen=lone,
               config=replica_config([peers[0], lone], lone, heartbeat=10.0) + tls_config(pki, ca="other.pem"))
    try:
        d.wait_for(re.escape(f"replica {peers[0]} is not live: its TLS certificate does not verify") +
                   r" \(TLS failed: certificate verify failed", 30)
        attempts = re.escape(f"upstream amqps://127.0.0.1:{peers[0].rsplit(':', 1)[1]}: reconnecting in")
        d.wait_for(rf"(?s)(?:{attempts}.*){{4}}", 30)  # it kept trying, once a second
        text = d.log()
        assert f"replica {peers[0]} is up" not in text, text
        assert text.count(f"replica {peers[0]} is not live") == 1, text  # rate-limited
        assert "Traceback" not in text, text
    finally:
        d.stop()


def test_the_peer_name_is_checked_unless_verify_is_peer(pki):
    """`replicas.tls.verify`: with `peer-name`, a certificate without the peer's name (or
    `server_name`) does not verify; with `peer`, the chain alone is checked."""
    from broker_filter.config import ReplicasTLS, ListenerTLS
    from broker_filter.security import replica_ssl_context, server_ssl_context

    listener = ListenerTLS(cert_file=str(pki / "server.pem"), key_file=str(pki / "server.key"),
                           ca_file=str(pki / "ca.pem"))
    server = server_ssl_context(listener)

    def handshake(tls: ReplicasTLS, name: str) -> str:
        """A replica's TLS handshake (as a client, for `name`) with the listener's context, in memory."""
        c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
        client = replica_ssl_context(tls, listener).wrap_bio(c_in, c_out, server_hostname=name)
        serving = server.wrap_bio(s_in, s_out, server_side=True)
        done = set()
        for _ in range(10):
            for side, own_out, peer_in in ((client, c_out, s_in), (serving, s_out, c_in)):
                try:
                    side.do_handshake()
                    done.add(id(side))
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError as e:
                    return e.reason or str(e)
                peer_in.write(own_out.read())
            if len(done) == 2:
                return "ok"
        return "no end"

    assert handshake(ReplicasTLS(), "127.0.0.1") == "ok"
    assert handshake(ReplicasTLS(), "localhost") == "ok"
    assert handshake(ReplicasTLS(), "elsewhere.example") == "CERTIFICATE_VERIFY_FAILED"
    assert handshake(ReplicasTLS(verify="peer"), "elsewhere.example") == "ok"
    assert handshake(ReplicasTLS(ca_file=str(pki / "other.pem"), verify="peer"), "localhost") == \
        "CERTIFICATE_VERIFY_FAILED"


def config_error(pki, *settings: str) -> ConfigError:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = []
    for item in (f"listener.tls.cert_file={pki / 'server.pem'}", f"listener.tls.key_file={pki / 'server.key'}",
                 "replicas.peers=127.0.0.1:1,127.0.0.1:2", "replicas.self=127.0.0.1:1",
                 "upstream.urls=amqp://127.0.0.1", *settings):
        argv += ["--set", item]
    with pytest.raises(ConfigError) as info:
        load(parser.parse_args(argv), {})
    return info.value


@pytest.mark.parametrize("settings,key,reason", [
    (["replicas.tls.ca_file=/nonexistent/ca.pem"], "replicas.tls.ca_file", "file not found: /nonexistent/ca.pem"),
    (["replicas.tls.ca_file={pki}/server.key"], "replicas.tls.ca_file", "holds no PEM CA certificate"),
    (["listener.tls.ca_file={pki}/client.key"], "listener.tls.ca_file", "holds no PEM CA certificate"),
    (["replicas.tls.cert_file={pki}/client.pem"], "replicas.tls.key_file", "is required"),
    (["replicas.tls.key_file={pki}/client.key"], "replicas.tls.cert_file", "is required"),
    (["replicas.tls.cert_file=/nonexistent/c.pem", "replicas.tls.key_file={pki}/client.key"],
     "replicas.tls.cert_file", "file not found"),
    (["replicas.tls.cert_file={pki}/client.key", "replicas.tls.key_file={pki}/client.key"],
     "replicas.tls.cert_file", "holds no PEM certificate"),
    (["replicas.tls.cert_file={pki}/client.pem", "replicas.tls.key_file={pki}/server.key"],
     "replicas.tls.key_file", "does not hold the private key of"),
    (["replicas.tls.ciphers=NO-SUCH-CIPHER"], "replicas.tls.ciphers", "OpenSSL selects no cipher"),
    (["replicas.tls.min_version=TLSv1.1"], "replicas.tls.min_version", "must be one of TLSv1.2, TLSv1.3"),
    (["replicas.tls.verify=none"], "replicas.tls.verify", "must be one of peer-name, peer"),
    (["replicas.tls.verify=peer", "replicas.tls.server_name=bf"], "replicas.tls.server_name", "is not checked"),
    (["replicas.splice=true"], "replicas.splice", "cannot be combined with listener.tls"),
])
def test_bad_replica_tls_settings_name_the_key(pki, settings, key, reason):
    err = config_error(pki, *(s.replace("{pki}", str(pki)) for s in settings))
    assert (err.key, reason in err.reason) == (key, True), str(err)


def test_replica_tls_settings_without_listener_tls_are_refused(pki):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = []
    for item in ("replicas.peers=127.0.0.1:1,127.0.0.1:2", "replicas.self=127.0.0.1:1",
                 "upstream.urls=amqp://127.0.0.1", f"replicas.tls.ca_file={pki / 'ca.pem'}"):
        argv += ["--set", item]
    with pytest.raises(ConfigError) as info:
        load(parser.parse_args(argv), {})
    assert info.value.key == "replicas.tls.ca_file" and "needs listener.tls" in info.value.reason


def test_good_replica_tls_settings_load(pki):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = []
    for item in (f"listener.tls.cert_file={pki / 'server.pem'}", f"listener.tls.key_file={pki / 'server.key'}",
                 "replicas.peers=127.0.0.1:1,127.0.0.1:2", "replicas.self=127.0.0.1:1",
                 "upstream.urls=amqp://127.0.0.1", f"replicas.tls.cert_file={pki / 'client.pem'}",
                 f"replicas.tls.key_file={pki / 'client.key'}", f"replicas.tls.ca_file={pki / 'ca.pem'}",
                 "replicas.tls.min_version=TLSv1.3"):
        argv += ["--set", item]
    config = load(parser.parse_args(argv), {})
    assert config.replicas.tls.min_version == "TLSv1.3" and config.replicas.tls.verify == "peer-name"
