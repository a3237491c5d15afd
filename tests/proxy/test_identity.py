"""The daemon's identity in its open frame: in front of RabbitMQ it presents RabbitMQ's `product` and a
`version` (RabbitMQ's own AMQP 1.0 clients refuse a server that is not RabbitMQ 4 or later, in
`_validate_server_properties` of rabbitmq-amqp-python-client, and gate features on it): 4.2.0 in
front of RabbitMQ 4.0 and 4.1 (what the daemon serves), the upstream's own otherwise, with
`upstream-version` the upstream's own and a `broker-filter` property naming itself beside them, and
its filter capabilities; on the embedded broker it is product broker-filter."""

from __future__ import annotations

from clients import connect
from launcher import Daemon

import broker_filter


def properties(url: str) -> tuple[dict, set]:
    c = connect(url)
    try:
        return ({str(k): v for k, v in (c.conn.remote_properties or {}).items()},
                {str(x) for x in c.conn.remote_offered_capabilities or ()})
    finally:
        c.close()


def test_in_front_of_rabbitmq_the_open_frame_presents_rabbitmqs_product_and_version(proxy, rabbitmq):
    upstream, _ = properties(rabbitmq)
    props, caps = properties(proxy.url)
    assert props["product"] == upstream["product"] == "RabbitMQ"
    assert props["upstream-version"] == upstream["version"]  # the upstream's own, always
    if upstream["version"].startswith("4.0."):  # what the daemon serves on RabbitMQ 4 (test_rabbitmq_client.py)
        assert props["version"] == "4.2.0"
    else:  # RabbitMQ 3.x: its own (RabbitMQ's own clients refuse it, as they would directly)
        assert props["version"] == upstream["version"]
    assert props["broker-filter"] == broker_filter.__version__
    assert "APACHE.ORG:SELECTOR" in caps


def test_on_the_embedded_broker_the_product_is_broker_filter():
    d = Daemon()
    try:
        props, caps = properties(d.url)
        assert props["product"] == "broker-filter" and props["broker-filter"] == broker_filter.__version__
        assert "APACHE.ORG:SELECTOR" in caps
    finally:
        d.stop()
