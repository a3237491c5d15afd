"""Vhosts: RabbitMQ's clients name the vhost in the open frame's hostname (`vhost:NAME`).  The daemon
serves the vhost its upstream URL names (the URL's path, `/` by default) and refuses a connection that
asks for another one, never serving it silently from the wrong vhost."""

from __future__ import annotations

import uuid

import pytest
from proton import Message
from proton import ConnectionException
from proton.utils import BlockingConnection

from clients import receive_n
from launcher import Daemon

pytestmark = pytest.mark.rabbitmq


def test_a_client_asking_for_another_vhost_is_refused_and_the_default_is_served(proxy):
    with pytest.raises(ConnectionException) as info:
        c = BlockingConnection(proxy.url, timeout=10, virtual_host="vhost:nope")
        c.create_sender("/queue/x")
    assert "vhost 'nope' is not served here" in str(info.value)
    for hostname in ("vhost:/", None):
        c = BlockingConnection(proxy.url, timeout=10, virtual_host=hostname)
        try:
            c.create_sender(f"/queue/vh-{uuid.uuid4().hex[:6]}")
        finally:
            c.close()


def test_the_upstream_urls_path_names_the_vhost_served(rabbitmq_broker):
    vhost = f"bf-{uuid.uuid4().hex[:6]}"
    assert rabbitmq_broker.ctl("add_vhost", vhost).returncode == 0
    try:
        assert rabbitmq_broker.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*").returncode == 0
        d = Daemon(upstream=f"{rabbitmq_broker.url}/{vhost}")
        try:
            q = f"/queue/vh-{uuid.uuid4().hex[:6]}"
            c = BlockingConnection(d.url, timeout=10, virtual_host=f"vhost:{vhost}")
            try:
                c.create_sender(q).send(Message(body="in the vhost"))
            finally:
                c.close()
            direct = BlockingConnection(rabbitmq_broker.url, timeout=10, virtual_host=f"vhost:{vhost}")
            try:
                assert [m.body for m in receive_n(direct.create_receiver(q, credit=1), 1, timeout=10)] == ["in the vhost"]
            finally:
                direct.close()
            with pytest.raises(ConnectionException):
                BlockingConnection(d.url, timeout=10, virtual_host="vhost:/").create_sender(q)
        finally:
            d.stop()
    finally:
        rabbitmq_broker.ctl("delete_vhost", vhost)
