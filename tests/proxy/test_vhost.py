"""Vhosts: RabbitMQ's clients name the vhost in the open frame's hostname (`vhost:NAME`).  The daemon
serves the vhost its upstream URL names (the URL's path, `/` by default) and refuses a connection that
asks for another one, never serving it silently from the wrong vhost; with pass-through logins each
client's own upstream connection opens the vhost the client names, and RabbitMQ decides."""

from __future__ import annotations

import uuid

import pytest
from proton import Message
from proton import ConnectionException
from proton.utils import BlockingConnection, LinkDetached

from clients import receive_n, receive_n_and_extras
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


def _add_vhost(broker, name: str) -> None:
    assert broker.ctl("add_vhost", name).returncode == 0
    assert broker.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*").returncode == 0


def _send(url: str, address: str, body: str, vhost: str | None) -> None:
    c = BlockingConnection(url, timeout=10, virtual_host=vhost)
    try:
        c.create_sender(address).send(Message(body=body))
    finally:
        c.close()


def test_pass_through_opens_the_vhost_each_client_names(rabbitmq_broker, request):
    """Two vhosts through one daemon, one login: each client's messages land in the vhost it named
    (read straight from RabbitMQ in that vhost), and a vhost RabbitMQ does not have is refused with
    RabbitMQ's own word, before the client is served anything."""
    one, two = f"bf-{uuid.uuid4().hex[:6]}", f"bf-{uuid.uuid4().hex[:6]}"
    for name in (one, two):
        _add_vhost(rabbitmq_broker, name)
    d = Daemon("--set", "upstream.credentials=pass-through", "--set", "listener.allow_anonymous=false",
               upstream=rabbitmq_broker.url)
    try:
        url = d.url.replace("amqp://", "amqp://guest:guest@")
        q = f"/queue/vh-{uuid.uuid4().hex[:6]}"
        _send(url, q, "to one", f"vhost:{one}")
        _send(url, q, "to two", f"vhost:{two}")
        _send(url, q, "to the default", None)
        for vhost, body in ((one, "to one"), (two, "to two"), ("/", "to the default")):
            direct = BlockingConnection(rabbitmq_broker.url, timeout=10, virtual_host=f"vhost:{vhost}")
            try:
                r = direct.create_receiver(q, credit=5)
                assert [m.body for m in receive_n_and_extras(r, 1)] == [body], vhost
            finally:
                direct.close()
        missing = f"bf-none-{uuid.uuid4().hex[:6]}"
        # (RabbitMQ 4 refuses the open by closing its socket, and so does the daemon to the client, as
        # RabbitMQ's clients expect it: they take a close frame for a connection to recover; RabbitMQ
        # 3.10 opens and then closes the connection: the client's link is detached, with its reason)
        with pytest.raises((ConnectionException, LinkDetached)) as info:
            _send(url, q, "lost", f"vhost:{missing}")
        if "rabbitmq4" in request.node.callspec.id:
            assert "aborted" in str(info.value), info.value
        else:
            assert missing in str(info.value), info.value
        assert missing in d.log()  # why, in the daemon's log
        _send(url, q, "still served", f"vhost:{one}")  # the refusal took nothing else down
    finally:
        d.stop()
        for name in (one, two):
            rabbitmq_broker.ctl("delete_vhost", name)
