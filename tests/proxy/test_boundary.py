"""Error boundaries: a failure inside the proxy on one link (injected: nothing else makes the proxy's
own code fail on demand) closes that link with amqp:internal-error; the connection, its other links
and other clients carry on, and the daemon keeps running."""

from __future__ import annotations

import sys

import pytest
from proton import Message
from proton.utils import LinkDetached

from clients import connect, receive_until_quiet
from launcher import Daemon

INJECT = """
import sys
import broker_filter.proxy.forwarding as forwarding
original = forwarding.Feed.on_upstream_delivery
def failing(self, delivery):
    if b"boom" in delivery.data:
        raise RuntimeError("injected failure")
    return original(self, delivery)
forwarding.Feed.on_upstream_delivery = failing
from broker_filter.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def faulty_proxy():
    d = Daemon(program=[sys.executable, "-c", INJECT, "serve"])
    yield d
    d.stop()


def test_failure_on_one_link_closes_only_that_link(faulty_proxy):
    proc, url = faulty_proxy.proc, faulty_proxy.url
    c = connect(url)
    other = connect(url)
    try:
        doomed = c.create_receiver("qa", credit=5)
        fine = c.create_receiver("qb", name="fine", credit=5)
        elsewhere = other.create_receiver("qc", credit=5)
        s = other.create_sender("qa")
        s.send(Message(body=b"boom"))
        with pytest.raises(LinkDetached) as info:
            doomed.receive(timeout=10)
        assert info.value.link.remote_condition.name == "amqp:internal-error"
        s2 = other.create_sender("qb", name="s2")
        s2.send(Message(body="ok"))
        assert [m.body for m in receive_until_quiet(fine, at_most=1)] == ["ok"]
        s3 = other.create_sender("qc", name="s3")
        s3.send(Message(body="also ok"))
        assert [m.body for m in receive_until_quiet(elsewhere, at_most=1)] == ["also ok"]
        assert proc.poll() is None
        text = faulty_proxy.log()
        assert "injected failure" in text and "forwarding a delivery failed" in text
    finally:
        for conn in (c, other):
            try:
                conn.close()
            except Exception:
                pass
