"""`broker-filter serve` as a user runs it (embedded upstream, no RabbitMQ): configuration errors,
PLAIN users, metrics and health endpoints, JSON logs, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Described, Message, symbol
from proton.reactor import Filter
from proton.utils import BlockingConnection

from broker_filter.security import hash_password
from clients import bodies, receive_n_and_extras
from launcher import ROOT, Daemon, free_port, http_get

ALICE = hash_password("wonderland", algorithm="pbkdf2-sha256")


@pytest.fixture
def daemon():
    started = []

    def start(*args: str, env: dict | None = None) -> Daemon:
        d = Daemon(*args, env=env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def roundtrip(url: str, address: str, **kwargs) -> str:
    conn = BlockingConnection(url, timeout=20, **kwargs)
    try:
        conn.create_sender(address).send(Message(body="ping", properties={"color": "red"}))
        receiver = conn.create_receiver(address)
        message = receiver.receive(timeout=20)
        receiver.accept()
        return message.body
    finally:
        conn.close()


def test_bad_configuration_exits_2_before_listening(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nselector_length = -1\n")
    result = subprocess.run(
        [sys.executable, "-m", "broker_filter", "serve", "--config", str(bad), "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "broker-filter: config error: limits.selector_length: must be a positive integer, got -1"
    )
    assert "listening" not in result.stdout + result.stderr


def test_plain_users_metrics_and_json_logs(daemon, tmp_path):
    config = tmp_path / "broker-filter.toml"
    config.write_text(f'[listener]\nallow_anonymous = false\n[listener.users]\nalice = "{ALICE}"\n')
    d = daemon("--config", str(config), "--metrics", "127.0.0.1:0", "--log-format", "json")
    metrics_url = d.wait_for(r"metrics and health endpoints on (http://[^ ]+?) ")
    assert roundtrip(d.url, "ops-q1", user="alice", password="wonderland", allowed_mechs="PLAIN") == "ping"
    with pytest.raises(Exception) as info:
        BlockingConnection(d.url, timeout=20, user="alice", password="guess", allowed_mechs="PLAIN")
    assert "amqp:unauthorized-access" in str(info.value)
    with pytest.raises(Exception) as info:
        BlockingConnection(d.url, timeout=20, allowed_mechs="ANONYMOUS")
    assert "amqp:unauthorized-access" in str(info.value)

    assert http_get(metrics_url + "/healthz")[0] == 200
    deadline = time.monotonic() + 10
    while http_get(metrics_url + "/readyz")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)  # the first state snapshot is published after about a second
    assert http_get(metrics_url + "/readyz") == (200, "ok\n")
    status, text = http_get(metrics_url + "/metrics")
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"broker_filter_connections", "broker_filter_upstream_connected", "broker_filter_messages_received"} <= names
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("broker_filter_authentication_failures_total", (("mechanism", "PLAIN"),))] == 1
    # (the ANONYMOUS client gives up by itself: PLAIN is all the listener offers)
    assert samples[("broker_filter_connections_refused_total", (("reason", "unauthorized"),))] == 1

    conn = BlockingConnection(d.url, timeout=20, user="alice", password="wonderland", allowed_mechs="PLAIN")
    bad = Filter({symbol("sel"): Described(symbol("apache.org:selector-filter:string"), "color = ")})
    with pytest.raises(Exception):
        conn.create_receiver("ops-q1", name="bad-selector", options=bad)
    conn.close()
    lines = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    refused = [line for line in lines if line["msg"].startswith("refused link")]
    assert refused and refused[0]["link"] == "bad-selector" and refused[0]["conn"].count("/") == 1
    assert "wonderland" not in d.log() and ALICE not in d.log()


def test_sigterm_with_nothing_in_flight_exits_0(daemon):
    d = daemon()
    assert roundtrip(d.url, "ops-q2") == "ping"
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
    assert "Traceback" not in d.log()


def test_sigterm_drains_in_flight_then_detaches_clients(daemon):
    from proton import Endpoint

    d = daemon("--metrics", "127.0.0.1:0", "--set", "shutdown.grace_period=20")
    metrics_url = d.wait_for(r"metrics and health endpoints on (http://[^ ]+?) ")
    conn = BlockingConnection(d.url, timeout=20)
    conn.create_sender("ops-q3").send(Message(body="held by the client"))
    receiver = conn.create_receiver("ops-q3")
    assert receiver.receive(timeout=20).body == "held by the client"  # not settled yet
    d.proc.send_signal(signal.SIGTERM)
    d.wait_for(r"(shutdown requested)")
    time.sleep(0.5)
    assert d.proc.poll() is None, "the daemon must wait for the unsettled delivery"
    assert http_get(metrics_url + "/readyz") == (503, "shutting down\n")
    with pytest.raises(Exception):
        BlockingConnection(d.url, timeout=5)  # no new connections
    receiver.accept()
    with pytest.raises(Exception) as info:
        conn.wait(lambda: conn.conn.state & Endpoint.REMOTE_CLOSED, timeout=20)
    assert "amqp:connection:forced" in str(info.value) or (
        conn.conn.remote_condition is not None and conn.conn.remote_condition.name == "amqp:connection:forced")
    assert d.proc.wait(20) == 0
    assert "Traceback" not in d.log()
    conn.close()


def test_second_signal_forces(daemon):
    d = daemon("--set", "shutdown.grace_period=60")
    conn = BlockingConnection(d.url, timeout=20)
    conn.create_sender("ops-q4").send(Message(body="x"))
    receiver = conn.create_receiver("ops-q4")
    receiver.receive(timeout=20)
    d.proc.send_signal(signal.SIGTERM)
    d.wait_for(r"(shutdown requested)")
    assert d.proc.poll() is None
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 128 + signal.SIGTERM
    assert "second signal" in d.log()


ROUTING = """
[[address_rules]]
pattern = "orders.#"
routing_type = "anycast"
upstream = "tenant-a.{address}"

[virtual_addresses."orders.red"]
upstream = "orders.all"
selector = "color = 'red'"
"""


def test_address_rules_rewrite_publishes_and_consumers(daemon, tmp_path):
    config = tmp_path / "routing.toml"
    config.write_text(ROUTING)
    d = daemon("--config", str(config))
    conn = BlockingConnection(d.url, timeout=20)
    try:
        conn.create_sender("orders.eu").send(Message(body="via the rule"))
        direct = conn.create_receiver("tenant-a.orders.eu")  # no rule matches: the upstream name itself
        assert direct.receive(timeout=20).body == "via the rule"
        direct.accept()
        conn.create_sender("tenant-a.orders.eu").send(Message(body="direct"))
        via_rule = conn.create_receiver("orders.eu")
        assert via_rule.receive(timeout=20).body == "direct"
        via_rule.accept()
    finally:
        conn.close()


def test_virtual_filtered_address(daemon, tmp_path):
    config = tmp_path / "routing.toml"
    config.write_text(ROUTING)
    d = daemon("--config", str(config))
    conn = BlockingConnection(d.url, timeout=20)
    try:
        sender = conn.create_sender("orders.all")
        for i, (color, size) in enumerate([("red", "L"), ("blue", "L"), ("red", "S"), ("red", "L")]):
            sender.send(Message(body=i, properties={"color": color, "size": size}))
        selector = Filter({symbol("sel"): Described(symbol("apache.org:selector-filter:string"), "size = 'L'")})
        large_red = conn.create_receiver("orders.red", name="large-red", options=selector)
        assert bodies(receive_n_and_extras(large_red, 2)) == [0, 3]  # the virtual filter AND the client's own
        large_red.close()  # what its upstream consumer held unmatched goes back to the queue
        red = conn.create_receiver("orders.red", name="red")
        assert bodies(receive_n_and_extras(red, 1)) == [2]  # no filter of its own: every red message left
        red.close()
        everything = conn.create_receiver("orders.all", name="all")
        assert bodies(receive_n_and_extras(everything, 1)) == [1]  # the blue one stayed in the queue for others
    finally:
        conn.close()


def test_chained_upstream_with_credentials_from_the_environment(daemon):
    """One upstream URL, user and password from BROKER_FILTER_UPSTREAM_* (the upstream checks them:
    PLAIN users, no anonymous)."""
    upstream = daemon("--set", f'listener.users={{svc = "{ALICE}"}}', "--set", "listener.allow_anonymous=false")
    proxy = daemon("--upstream", upstream.url,
                   env={"BROKER_FILTER_UPSTREAM_USER": "svc", "BROKER_FILTER_UPSTREAM_PASSWORD": "wonderland"})
    proxy.wait_for(r": (connected) \(", timeout=8)
    assert roundtrip(proxy.url, "ops-chain") == "ping"
    assert "wonderland" not in proxy.log()


def test_upstream_failover_to_the_next_url(daemon):
    upstream = daemon()  # a second instance with its embedded broker is a fine upstream
    proxy = daemon("--upstream", f"amqp://127.0.0.1:{free_port()}", "--upstream", upstream.url,
                   "--metrics", "127.0.0.1:0")
    proxy.wait_for(r": (connected) \(", timeout=8)
    assert roundtrip(proxy.url, "ops-failover") == "ping"


def test_upstream_tls_with_the_configured_ca(daemon, pki):
    upstream = daemon("--set", f"listener.tls.cert_file={pki / 'server.pem'}",
                      "--set", f"listener.tls.key_file={pki / 'server.key'}")
    proxy = daemon("--upstream", f"amqps://127.0.0.1:{upstream.port}",
                   "--set", f"upstream.tls.ca_file={pki / 'ca.pem'}", "--set", "upstream.tls.verify=peer")
    proxy.wait_for(r": (connected) \(", timeout=8)
    assert roundtrip(proxy.url, "ops-tls") == "ping"
    stranger = daemon("--upstream", f"amqps://127.0.0.1:{upstream.port}", "--metrics", "127.0.0.1:0",
                      "--set", f"upstream.tls.ca_file={pki / 'other.pem'}", "--set", "upstream.tls.verify=peer")
    metrics_url = stranger.wait_for(r"metrics and health endpoints on (http://[^ ]+?) ")
    stranger.wait_for(r"(certificate verify failed)", timeout=8)
    time.sleep(1.5)  # past the first state snapshot
    assert http_get(metrics_url + "/readyz")[0] == 503
    assert ": connected (" not in stranger.log()


def test_sigterm_through_the_tls_and_sasl_front_end(daemon, pki):
    from proton import Endpoint, SSLDomain

    d = daemon("--set", f'listener.users={{alice = "{ALICE}"}}', "--set", "listener.allow_anonymous=false",
               "--set", f"listener.tls.cert_file={pki / 'server.pem'}",
               "--set", f"listener.tls.key_file={pki / 'server.key'}")
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER, str(pki / "ca.pem"))
    url = f"amqps://127.0.0.1:{d.port}"
    conn = BlockingConnection(url, timeout=20, ssl_domain=domain, user="alice", password="wonderland",
                              allowed_mechs="PLAIN")
    conn.create_sender("ops-tls-q").send(Message(body="over TLS"))
    receiver = conn.create_receiver("ops-tls-q")
    assert receiver.receive(timeout=20).body == "over TLS"
    receiver.accept()
    d.proc.send_signal(signal.SIGTERM)
    with pytest.raises(Exception) as info:
        conn.wait(lambda: conn.conn.state & Endpoint.REMOTE_CLOSED, timeout=20)
    assert "amqp:connection:forced" in str(info.value) or (
        conn.conn.remote_condition is not None and conn.conn.remote_condition.name == "amqp:connection:forced")
    assert d.proc.wait(20) == 0
    assert "Traceback" not in d.log()
    conn.close()


def test_pass_through_credentials_open_each_clients_own_upstream_connection(daemon):
    """The upstream refuses ANONYMOUS and knows alice and bob: messages flow through the proxy only
    because each client's own credentials log the proxy in upstream."""
    bob = hash_password("builder", algorithm="pbkdf2-sha256")
    upstream = daemon("--set", f'listener.users={{alice = "{ALICE}", bob = "{bob}"}}',
                      "--set", "listener.allow_anonymous=false")
    proxy = daemon("--upstream", upstream.url, "--set", "upstream.credentials=pass-through",
                   "--set", "listener.allow_anonymous=false")
    assert roundtrip(proxy.url, "ops-pt-a", user="alice", password="wonderland", allowed_mechs="PLAIN") == "ping"
    assert roundtrip(proxy.url, "ops-pt-b", user="bob", password="builder", allowed_mechs="PLAIN") == "ping"
    with pytest.raises(Exception) as info:
        BlockingConnection(proxy.url, timeout=20, user="alice", password="builder", allowed_mechs="PLAIN")
    assert "amqp:unauthorized-access" in str(info.value)
    with pytest.raises(Exception) as info:
        BlockingConnection(proxy.url, timeout=20, allowed_mechs="ANONYMOUS")
    assert "amqp:unauthorized-access" in str(info.value)
    assert "pass-through: opening an upstream connection" in proxy.log()
    assert "wonderland" not in proxy.log() and "builder" not in proxy.log()
    assert "Traceback" not in proxy.log()
