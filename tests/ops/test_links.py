"""Introspection (`GET /links`, `broker-filter links`) and the per-filter metrics, against real
daemons: in front of RabbitMQ 3.10 a selector on a queue and two filtered subscribers of one topic
(the address's shared subscription) are evaluated by the daemon; on the embedded broker the filters
are pushed down into the in-process broker.  Counts are exact after a known set of messages; the
test waits for them (the metrics are published once a second), never sleeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.reactor import Selector

from broker_filter.proxy.introspect import short_text
from clients import connect, receive_n
from launcher import ROOT, Daemon


TOKEN = "links-" + uuid.uuid4().hex  # the daemons' metrics.token: /links shows filter texts with it


def get_json(url: str) -> dict:
    request = urllib.request.Request(f"{url}/links", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.load(r)


def samples(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for(what, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {timeout:.0f} s")
        time.sleep(0.1)


def publish(conn, address: str, n: int) -> None:
    snd = conn.create_sender(address)
    for i in range(n):
        snd.send(Message(body=f"m{i}", properties={"n": i}))
    snd.close()


def run_links(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BROKER_FILTER_METRICS_TOKEN"}
    if token is not None:
        env["BROKER_FILTER_METRICS_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "broker_filter", "links", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.rabbitmq
def test_links_and_filter_metrics_in_front_of_rabbitmq(rabbitmq3):
    d = Daemon("--metrics", "127.0.0.1:0", upstream=rabbitmq3.url, env={"BROKER_FILTER_METRICS_TOKEN": TOKEN})
    try:
        url = d.metrics_url()
        queue, topic = f"/queue/links-{uuid.uuid4().hex[:8]}", f"/topic/links-{uuid.uuid4().hex[:8]}"
        conn = connect(d.url)
        try:
            q = conn.create_receiver(queue, name="on-queue", credit=20, options=Selector("n >= 7"))
            t1 = conn.create_receiver(topic, name="sub-low", credit=20, options=Selector("n < 2"))
            t2 = conn.create_receiver(topic, name="sub-odd", credit=20, options=Selector("n = 1 OR n = 3"))
            publish(conn, queue, 10)
            publish(conn, topic, 10)
            assert sorted(m.body for m in receive_n(q, 3)) == ["m7", "m8", "m9"]
            assert sorted(m.body for m in receive_n(t1, 2)) == ["m0", "m1"]
            assert sorted(m.body for m in receive_n(t2, 2)) == ["m1", "m3"]

            def settled():
                report = get_json(url)
                by_name = {r["link"]: r for r in report["links"] if r["direction"] == "consumer"}
                # (a queue's held messages are evaluated again as credit comes: at least once each)
                return by_name if by_name.get("on-queue", {}).get("evaluated", 0) >= 10 and \
                    by_name.get("sub-low", {}).get("evaluated") == 10 else None

            links = wait_for("/links counts", settled)
            on_queue, low, odd = links["on-queue"], links["sub-low"], links["sub-odd"]
            assert on_queue["matched"] == 3 and on_queue["delivered"] == 3 and on_queue["address"] == queue
            assert on_queue["filters"] == [{"key": "selector", "kind": "selector", "text": "n >= 7",
                                            "evaluated": "here"}]
            assert on_queue["feed"]["kind"] == "queue"
            assert on_queue["state"] == low["state"] == odd["state"] == "attached"
            assert (low["matched"], odd["evaluated"], odd["matched"]) == (2, 10, 2)
            assert low["feed"]["kind"] == odd["feed"]["kind"] == "shared subscription"
            assert low["feed"]["links"] == 2  # one upstream subscription for both
            assert low["credit"] > 0 and low["unsettled"] == 2
            assert not get_json(url)["truncated"]

            def metrics():
                s = samples(url)
                key = lambda name, address: (name, (("address", address), ("kind", "selector")))  # noqa: E731
                got = (s.get(key("broker_filter_filter_evaluations_total", queue)),
                       s.get(key("broker_filter_filter_matches_total", queue)),
                       s.get(key("broker_filter_filter_evaluations_total", topic)),
                       s.get(key("broker_filter_filter_matches_total", topic)))
                return (s, got) if got[0] and got[0] >= 10 and got[1:] == (3, 20, 4) else None

            s, _ = wait_for("the filter metrics", metrics)
            costliest = {dict(labels)["filter"]: dict(labels) for (name, labels), v in s.items()
                         if name == "broker_filter_costliest_filter_info"}
            # (the hash alone: metrics.filter_text_in_labels is off)
            texts = {"#" + short_text(t).rpartition("#")[2] for t in ("n >= 7", "n < 2", "n = 1 OR n = 3")}
            assert set(costliest) <= texts and costliest, costliest
            assert {c["rank"] for c in costliest.values()} == {str(i) for i in range(1, len(costliest) + 1)}

            table = run_links("--url", url)
            assert table.returncode == 0, table.stderr
            assert "on-queue" in table.stdout and "selector: n >= 7 [here]" in table.stdout
            assert "shared subscription (2 link(s)" in table.stdout
            raw = run_links("--url", url, "--json")
            assert {r["link"] for r in json.loads(raw.stdout)["links"]} >= {"on-queue", "sub-low", "sub-odd"}
            # Without the token the command is told why.
            refused = run_links("--url", url, token=None)
            assert refused.returncode == 1 and "answered 401" in refused.stderr and "metrics.token" in refused.stderr
        finally:
            conn.close()

        # A closed link's counts stay in the counters (they never go down).
        def kept():
            s = samples(url)
            return s.get(("broker_filter_filter_matches_total", (("address", queue), ("kind", "selector")))) == 3 \
                and not [r for r in get_json(url)["links"] if r["link"] == "on-queue"]

        wait_for("the closed link's counts kept", kept)
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_links_on_the_embedded_broker_count_what_it_evaluates():
    d = Daemon("--metrics", "127.0.0.1:0", env={"BROKER_FILTER_METRICS_TOKEN": TOKEN})
    try:
        url = d.metrics_url()
        queue = f"anycast://links-{uuid.uuid4().hex[:8]}"
        conn = connect(d.url)
        try:
            r = conn.create_receiver(queue, name="embedded-queue", credit=10, options=Selector("n > 5"))
            publish(conn, queue, 8)
            assert sorted(m.body for m in receive_n(r, 2)) == ["m6", "m7"]
            link = wait_for("the embedded broker's counts", lambda: next(
                (x for x in get_json(url)["links"] if x["link"] == "embedded-queue" and x["evaluated"] == 8), None))
            assert link["matched"] == 2
            assert link["filters"][0]["evaluated"] == "embedded broker"
            wait_for("the metrics", lambda: samples(url).get(
                ("broker_filter_filter_matches_total", (("address", queue), ("kind", "selector")))) == 2)
        finally:
            conn.close()
    finally:
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_the_command_says_when_no_daemon_answers():
    out = run_links("--url", "http://127.0.0.1:9")
    assert out.returncode == 1
    assert out.stderr.strip().startswith("broker-filter links: no daemon answers at http://127.0.0.1:9")
    assert "Traceback" not in out.stderr
