"""The daemon's metrics as an operator scrapes them: counters of a filtered stream and the held /
stalled state of a queue nobody matches."""

from __future__ import annotations

import time

import pytest
from proton import Message
from proton.reactor import Selector

from clients import connect, receive_until_quiet
from launcher import Daemon, free_port, metric_value, scrape

pytestmark = pytest.mark.rabbitmq


def test_counters_and_held_gauge(rabbitmq, address):
    mport = free_port()
    p = Daemon("--metrics", f"127.0.0.1:{mport}", "--set", "limits.upstream_window=5", upstream=rabbitmq)
    c = connect(p.url)
    try:
        topic = f"/topic/{address}"
        r = c.create_receiver(topic, credit=20, options=Selector("n < 3"))
        s = c.create_sender(topic)
        for i in range(10):
            s.send(Message(body=i, subject=address, properties={"n": i}))
        assert [m.body for m in receive_until_quiet(r, at_most=3)] == [0, 1, 2]
        q = f"/queue/{address}"
        qr = c.create_receiver(q, name="q", credit=5, options=Selector("n = 99"))
        qs = c.create_sender(q, name="qs")
        for i in range(8):
            qs.send(Message(body=i, properties={"n": i}))
        deadline = time.monotonic() + 10
        while True:
            text = scrape(mport)
            held = metric_value(text, "broker_filter_messages_held", address=q)
            stalled = metric_value(text, "broker_filter_address_stalled", address=q)
            if (held >= 5 and stalled == 1) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert metric_value(text, "broker_filter_messages_received_total", address=topic) == 10
        assert metric_value(text, "broker_filter_messages_forwarded_total", address=topic) == 3
        assert metric_value(text, "broker_filter_messages_filtered_out_total", address=topic) == 7
        assert metric_value(text, "broker_filter_outcomes_total", address=topic, outcome="accepted") == 3
        assert metric_value(text, "broker_filter_messages_published_total", address=q) == 8
        assert held >= 5 and stalled == 1  # nobody matches: window full, the waiting link is starved
        assert metric_value(text, "broker_filter_links", kind="consumer") == 2
        assert qr is not None
    finally:
        c.close()
        p.stop()
