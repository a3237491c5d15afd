"""Push-down: a proxy whose upstream is another broker-filter (which offers APACHE.ORG:SELECTOR in its
open frame) lets the upstream evaluate selectors; RabbitMQ, which offers nothing, never gets one."""

from __future__ import annotations

import time

import pytest
from proton import Message
from proton.reactor import Selector

from proxy_harness import Proxy
from proxy_clients import connect, free_port, receive, scrape, value


def test_selector_pushed_down_to_an_upstream_that_filters():
    upstream = Proxy(upstream=None)  # broker-filter with its embedded broker
    mport = free_port()
    front = Proxy("--metrics", f"127.0.0.1:{mport}", upstream=upstream.url)
    c = connect(front.url)
    try:
        r = c.create_receiver("orders", credit=20, options=Selector("n > 5"))
        s = c.create_sender("orders")
        for i in range(10):
            s.send(Message(body=i, properties={"n": i}))
        assert [m.body for m in receive(r, idle=1.0)] == [6, 7, 8, 9]
        deadline = time.monotonic() + 5
        while value(scrape(mport), "broker_filter_messages_forwarded_total", address="orders") < 4:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        text = scrape(mport)
        # only the 4 matches crossed the upstream connection: the upstream evaluated the selector
        assert value(text, "broker_filter_messages_received_total", address="orders") == 4
        assert value(text, "broker_filter_messages_filtered_out_total", address="orders") == 0
        assert "connected (broker-filter)" in front.log()
    finally:
        c.close()
        front.stop()
        upstream.stop()


@pytest.mark.rabbitmq
def test_no_push_down_to_rabbitmq(rabbitmq, address):
    mport = free_port()
    front = Proxy("--metrics", f"127.0.0.1:{mport}")
    c = connect(front.url)
    try:
        r = c.create_receiver(f"/topic/{address}", credit=20, options=Selector("n > 5"))
        s = c.create_sender(f"/topic/{address}")
        for i in range(10):
            s.send(Message(body=i, subject=address, properties={"n": i}))
        assert [m.body for m in receive(r, idle=1.0)] == [6, 7, 8, 9]
        deadline = time.monotonic() + 5
        while value(scrape(mport), "broker_filter_messages_filtered_out_total", address=f"/topic/{address}") < 6:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert value(scrape(mport), "broker_filter_messages_received_total", address=f"/topic/{address}") == 10
    finally:
        c.close()
        front.stop()
