"""Who may do what (`[security]`), enforced by the daemon on the embedded broker, with proton clients
logging in as alice and bob (PLAIN): consume, browse, send, the anonymous relay per message, and a
SIGHUP reload that detaches a link no longer permitted without dropping its connection."""

from __future__ import annotations

import signal

import pytest
from proton import Message
from proton.utils import LinkDetached, SendException

from broker_filter.security import hash_password
from tests.support.clients import connect, link_name, receive_n
from tests.support.launcher import Daemon
from tests.support.users import USERS, login


SETTINGS = """
[[security.settings]]
match = "alice.#"
consume = ["alice"]
send = ["alice"]

[[security.settings]]
match = "shared.#"
consume = ["team"]
send = ["team"]
browse = ["auditor"]
"""


def config(extra: str = "") -> str:
    return USERS + f"""[security.roles]
alice = ["alice", "team"]
bob = ["team"]
{extra}
{SETTINGS}
"""


@pytest.fixture
def daemon():
    d = Daemon(config=config())
    yield d
    d.stop()


def refused(attach) -> str:
    with pytest.raises(LinkDetached) as info:
        attach()
    return str(info.value)


def test_consume_and_send_are_granted_per_address(daemon):
    alice, bob = login(daemon, "alice"), login(daemon, "bob")
    try:
        rcv = alice.create_receiver("alice.private", name=link_name(), credit=10)
        text = refused(lambda: bob.create_receiver("alice.private", name=link_name(), credit=10))
        assert "unauthorized-access" in text and "consume" in text and "alice.private" in text and "bob" in text
        text = refused(lambda: bob.create_sender("alice.private", name=link_name()))
        assert "unauthorized-access" in text and "send" in text
        # bob's connection carries on: what his roles grant works
        shared = bob.create_sender("shared.news", name=link_name())
        shared.send(Message(body="hello"))
        alice.create_sender("alice.private", name=link_name()).send(Message(body="mine"))
        assert [m.body for m in receive_n(rcv, 1)] == ["mine"]
        # nothing granted is refused: an address no setting matches
        assert "no security setting matches" in refused(lambda: alice.create_receiver("other.q", name=link_name()))
    finally:
        alice.close()
        bob.close()
    assert "authorization: refused consume on 'alice.private' for user 'bob'" in daemon.log()


def test_browse_is_not_consume(daemon):
    from tests.support.clients import Capabilities
    from proton.reactor import Copy

    bob = login(daemon, "bob")
    try:
        bob.create_receiver("shared.news", name=link_name(), credit=1)  # consume: granted (team)
        text = refused(lambda: bob.create_receiver("shared.news", name=link_name(), credit=1, options=[Copy(), Capabilities("queue")]))
        assert "browse" in text and "unauthorized-access" in text
    finally:
        bob.close()


def test_anonymous_relay_checks_each_message(daemon):
    from proton import Delivery

    from tests.support.clients import receives_nothing

    alice, bob = login(daemon, "alice"), login(daemon, "bob")
    try:
        mine = alice.create_receiver("alice.private", name=link_name(), credit=10)
        relay = bob.create_sender(None, name=link_name())
        with pytest.raises(SendException) as info:
            relay.send(Message(address="alice.private", body="forged"))
        assert info.value.state == Delivery.REJECTED
        relay.send(Message(address="shared.news", body="fine"))  # the link lives and goes on
        assert receives_nothing(mine, 0.5)
    finally:
        alice.close()
        bob.close()
    assert "authorization: refused send on 'alice.private' for user 'bob'" in daemon.log()


def test_sighup_reload_detaches_and_grants_without_dropping_connections(daemon):
    bob = login(daemon, "bob")
    try:
        rcv = bob.create_receiver("shared.news", name=link_name(), credit=10)
        assert "unauthorized" in refused(lambda: bob.create_receiver("alice.private", name=link_name(), credit=10))
        # the file changes: bob loses `team` and becomes alice's reader, and carol is a new user
        carol = hash_password("carol's", algorithm="pbkdf2-sha256")
        daemon.config_path.write_text(config().replace('bob = ["team"]', 'bob = ["alice"]').replace(
            "[security.roles]", f'carol = "{carol}"\n\n[security.roles]'))
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for("configuration reloaded", 20)
        with pytest.raises(LinkDetached) as info:  # (raised by the client as the detach arrives)
            bob.wait(lambda: rcv.link.state & rcv.link.REMOTE_CLOSED, timeout=10)
        assert "unauthorized-access" in str(info.value) and "shared.news" in str(info.value)
        again = bob.create_receiver("alice.private", name=link_name(), credit=10)  # same connection: now granted
        assert again.link.state & again.link.REMOTE_ACTIVE
        connect(daemon.url, user="carol", password="carol's", allowed_mechs="PLAIN").close()  # logs in
        # an error in the file keeps the settings running
        daemon.config_path.write_text(config() + "\n[[security.settings]]\nconsume = 3\n")
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for("configuration reload refused", 20)
        assert "security.settings" in daemon.log().split("configuration reload refused")[-1].splitlines()[0]
        bob.create_receiver("alice.private", name=link_name(), credit=1)
    finally:
        bob.close()


def test_rhea_is_refused_and_granted_as_proton_is(daemon, monkeypatch):
    """rhea (its own process) logs in as bob: refused on alice's address with the refusal naming the
    operation, served on the team's."""
    from tests.support.clients import run_js

    monkeypatch.setenv("RHEA_USER", "bob")
    monkeypatch.setenv("RHEA_PASSWORD", "builder")
    refused_lines = run_js("receive.js", str(daemon.port), "alice.private", "-", "1", "5000")
    (detached,) = [line["detached"] for line in refused_lines if "detached" in line]
    assert detached["condition"] == "amqp:unauthorized-access" and "consume" in detached["description"]
    alice = login(daemon, "alice")
    try:
        alice.create_sender("shared.rhea", name=link_name()).send(Message(body="for the team"))
    finally:
        alice.close()
    served = run_js("receive.js", str(daemon.port), "shared.rhea", "-", "1", "10000")
    assert [line["message"]["body"] for line in served if "message" in line] == ["for the team"]
