"""rhea-promise 3 (the promise API under Azure's JavaScript SDKs) through the daemon, in its own
process, on the embedded broker and in front of RabbitMQ 3.10 and 4.0: a selector, drain, the
anonymous relay and request/response over a dynamic receiver (tests/js/rhea_promise_conformance.js).
Each scenario's result is exact: the messages selected, drained, relayed, and the request answered
on the dynamic receiver's address (in front of RabbitMQ one the daemon holds itself)."""

from __future__ import annotations

import uuid

from clients import run_js


def test_rhea_promise_conformance(daemon):
    names = [daemon.forms[1].format(f"rp-{k}-{uuid.uuid4().hex[:8]}") for k in "abc"]
    lines = run_js("rhea_promise_conformance.js", str(daemon.port), *names, timeout=60)
    results = {line.get("scenario", "failure"): line for line in lines}
    assert "failure" not in results and "timeout" not in str(lines), lines
    assert results["selector"] == {"scenario": "selector", "got": ["m3", "m4", "m5"], "echoed": ["jms-selector"]}
    assert results["drain"] == {"scenario": "drain", "got": ["m1", "m3", "m5"], "credit": 0}
    assert results["relay"] == {"scenario": "relay", "outcomes": ["accepted", "refused: amqp:invalid-field", "accepted"],
                                "got": ["to-c", "to-c-2"]}
    rr = results["request_response"]
    # (in front of RabbitMQ the daemon holds the reply address itself: proxy/replies.py)
    prefix = "/queues/broker-filter.reply-to." if daemon.forms[1].startswith("/queue/") else "temp."
    assert rr["address"].startswith(prefix), rr
    assert (rr["body"], rr["reply_to"]) == ("request", rr["address"]), rr
