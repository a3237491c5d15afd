"""Push-down: a proxy whose upstream is another broker-filter (which offers APACHE.ORG:SELECTOR in its
open frame) lets the upstream evaluate selectors; RabbitMQ, which offers nothing, never gets one."""

from __future__ import annotations

import time

import pytest
from proton import Message
from proton.reactor import Selector

from clients import connect, receive_n_and_extras
from launcher import Daemon, free_port, metric_value, scrape


def test_selector_pushed_down_to_an_upstream_that_filters():
    upstream = Daemon()  # broker-filter with its embedded broker
    mport = free_port()
    front = Daemon("--metrics", f"127.0.0.1:{mport}", upstream=upstream.url)
    c = connect(front.url)
    try:
        r = c.create_receiver("orders", credit=20, options=Selector("n > 5"))
        s = c.create_sender("orders")
        for i in range(10):
            s.send(Message(body=i, properties={"n": i}))
        assert [m.body for m in receive_n_and_extras(r, 4)] == [6, 7, 8, 9]
        deadline = time.monotonic() + 5
        while metric_value(scrape(mport), "broker_filter_messages_forwarded_total", address="orders") < 4:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        text = scrape(mport)
        # only the 4 matches crossed the upstream connection: the upstream evaluated the selector
        assert metric_value(text, "broker_filter_messages_received_total", address="orders") == 4
        assert metric_value(text, "broker_filter_messages_filtered_out_total", address="orders") == 0
        assert "connected (broker-filter)" in front.log()
    finally:
        c.close()
        front.stop()
        upstream.stop()


@pytest.mark.rabbitmq
def test_no_push_down_to_rabbitmq(rabbitmq, address):
    mport = free_port()
    front = Daemon("--metrics", f"127.0.0.1:{mport}", upstream=rabbitmq)
    c = connect(front.url)
    try:
        r = c.create_receiver(f"/topic/{address}", credit=20, options=Selector("n > 5"))
        s = c.create_sender(f"/topic/{address}")
        for i in range(10):
            s.send(Message(body=i, subject=address, properties={"n": i}))
        assert [m.body for m in receive_n_and_extras(r, 4)] == [6, 7, 8, 9]
        deadline = time.monotonic() + 5
        while metric_value(scrape(mport), "broker_filter_messages_filtered_out_total", address=f"/topic/{address}") < 6:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert metric_value(scrape(mport), "broker_filter_messages_received_total", address=f"/topic/{address}") == 10
    finally:
        c.close()
        front.stop()


def test_failover_to_the_next_upstream_url_and_tls(tmp_path):
    import shutil
    import socket
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    upstream = Daemon("--set", f"listener.tls.cert_file={cert}", "--set", f"listener.tls.key_file={key}")
    with socket.socket() as s:  # a port nobody listens on: the first URL fails
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    # verify=peer: proton's peer-name check does not match IP subjectAltNames, and tests use 127.0.0.1
    front = Daemon("--upstream", f"amqp://127.0.0.1:{dead}", "--set", f"upstream.tls.ca_file={cert}",
                  "--set", "upstream.tls.verify=peer",
                  "--set", "upstream.reconnect.initial_delay=0.05",
                  upstream=f"amqps://127.0.0.1:{upstream.port}")
    c = connect(front.url)
    try:
        r = c.create_receiver("tls-orders", credit=5, options=Selector("n = 2"))
        s = c.create_sender("tls-orders")
        for i in range(4):
            s.send(Message(body=i, properties={"n": i}))
        assert [m.body for m in receive_n_and_extras(r, 1)] == [2]
        assert "Connection refused" in front.log() and "connected (broker-filter)" in front.log()
    finally:
        c.close()
        front.stop()
        upstream.stop()
