"""RabbitMQ's own AMQP 1.0 Python client in front of RabbitMQ 3.10 (issue 45 item 1): the daemon presents
3.10's own version there, and the client refuses to connect, as it would directly.  (It speaks
RabbitMQ 4's address model only, `/queues/Q` and `/exchanges/X/KEY`, which RabbitMQ 3.10 refuses, and
uses `/management`, RabbitMQ 4's: a client let in would fail at its first publisher or consumer.)"""

from __future__ import annotations

import pytest

from launcher import Daemon

rmq = pytest.importorskip("rabbitmq_amqp_python_client",
                          reason="RabbitMQ's Python client is in pyproject's `test` extra")


@pytest.mark.rabbitmq
def test_the_client_refuses_rabbitmq_3_through_the_daemon_as_directly(rabbitmq3):
    d = Daemon("--set", "upstream.credentials=pass-through", upstream=rabbitmq3.url)
    try:
        env = rmq.Environment(uri=f"amqp://guest:guest@127.0.0.1:{d.port}/")
        try:
            with pytest.raises(rmq.ValidationCodeException) as e:
                env.connection().dial()
            assert "requires RabbitMQ 4.0.0 or higher" in str(e.value) and "Server version: 3." in str(e.value)
        finally:
            try:
                env.close()
            except RuntimeError:  # (the client's own close of a connection it never opened)
                pass
    finally:
        d.stop()
        assert "Traceback" not in d.log(), d.log()
