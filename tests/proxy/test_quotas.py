"""What one user or one source address may hold (`[limits]` connections_per_user,
connections_per_address, links_per_user, unfinished_bytes): refused with
amqp:resource-limit-exceeded naming the setting, the daemon and the other clients unaffected."""

from __future__ import annotations

import pytest
from proton import Message
from proton import ConnectionException
from proton.utils import LinkDetached, SendException

from broker_filter.config import Limits
from broker_filter.proxy.quotas import Quotas, source_address
from broker_filter.proxy.records import ClientConnection
from broker_filter.security import Identity
from tests.support.clients import connect, link_name, receive_n
from tests.support.launcher import Daemon
from tests.support.users import USERS, login



def test_connections_per_user_and_links_per_user():
    d = Daemon("--set", "limits.connections_per_user=2", "--set", "limits.links_per_user=3", config=USERS)
    held = []
    try:
        held = [login(d, "alice"), login(d, "alice")]
        with pytest.raises(ConnectionException) as info:
            login(d, "alice")
        assert "limits.connections_per_user" in str(info.value) and "resource-limit-exceeded" in str(info.value)
        bob = login(d, "bob")  # another user is not affected
        held.append(bob)
        # links: three over alice's two connections, the fourth refused on either
        held[0].create_receiver("q3", name=link_name())
        held[0].create_receiver("q2", name=link_name())
        snd = held[1].create_sender("q1", name=link_name())
        with pytest.raises(LinkDetached) as info:
            held[1].create_receiver("q4", name=link_name())
        assert "limits.links_per_user" in str(info.value)
        # alice's connections carry on, and bob's links are his own
        snd.send(Message(body="still here"))
        got = bob.create_receiver("q1", name=link_name(), credit=1)
        assert [m.body for m in receive_n(got, 1)] == ["still here"]
        # a connection that goes frees its place
        held.pop(0).close()
        held.append(login(d, "alice"))
    finally:
        for c in held:
            c.close()
        d.stop()
    assert "Traceback" not in d.log()


def test_unfinished_bytes_per_connection():
    d = Daemon("--set", "limits.unfinished_bytes=1048576")
    c = connect(d.url)
    try:
        snd = c.create_sender("big", name=link_name())
        with pytest.raises(SendException):
            snd.send(Message(body=b"x" * (3 * 1024 * 1024)))  # in frames, over 1 MiB before it is whole
        snd.send(Message(body=b"y" * 100_000))  # the link and the connection carry on
        rcv = c.create_receiver("big", name=link_name(), credit=5)
        assert [len(m.body) for m in receive_n(rcv, 1)] == [100_000]
    finally:
        c.close()
        d.stop()
    assert "Traceback" not in d.log()


def _conn(user: str, peer: str) -> ClientConnection:
    return ClientConnection(f"i/{user}{peer}", identity=Identity(user, "PLAIN", peer=peer))


def test_connections_per_source_address():
    """Counted per address, whatever the port or the user; IPv6 and IPv4 addresses alike."""
    quotas = Quotas(Limits(connections_per_address=2, connections_per_user=0))
    a1, a2 = _conn("alice", "127.0.0.2:4000"), _conn("bob", "127.0.0.2:4001")
    for c in (a1, a2):
        assert quotas.refusal(c.identity) is None
        quotas.admitted(c)
    third = _conn("carol", "127.0.0.2:4002")
    assert "limits.connections_per_address" in quotas.refusal(third.identity)
    assert quotas.refusal(_conn("carol", "127.0.0.3:4002").identity) is None  # another address
    quotas.gone(a1)
    assert quotas.refusal(third.identity) is None
    assert source_address(Identity("x", "PLAIN", peer="[::1]:5000")) == "::1"
    assert quotas.by_address == {"127.0.0.2": 1}
    quotas.gone(a2)
    quotas.gone(a2)  # (twice: counted once)
    assert quotas.by_address == {} and quotas.by_user == {}
