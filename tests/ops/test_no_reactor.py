"""The daemon never loads proton's reactor (`proton.reactor`, `proton._reactor`: the Container, which
waits in select() and dies past 1,024 descriptors): a running daemon is watched from its first import
to its exit while clients use it, on the embedded broker with PLAIN users and in front of RabbitMQ
with pass-through logins."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

from proton import Message
from proton.reactor import Selector  # the test's client only: the daemon is another process
from proton.utils import BlockingConnection

from broker_filter.security import hash_password
from clients import filtered_round_trip, receive_n_and_extras
from launcher import Daemon

WATCH = Path(__file__).with_name("reactor_watch.py")


def watched_daemon(tmp_path: Path, *args: str, preload: str = "", **kwargs) -> tuple[Daemon, Path]:
    report = tmp_path / "reactor.json"
    env = {"BROKER_FILTER_TEST_REACTOR_REPORT": str(report), "BROKER_FILTER_TEST_PRELOAD": preload}
    return Daemon(*args, program=[sys.executable, str(WATCH), "serve"], env=env, **kwargs), report


def stopped_report(daemon: Daemon, report: Path) -> dict:
    assert daemon.stop() == 0, daemon.log
    assert report.exists(), daemon.log
    return json.loads(report.read_text())


def test_the_embedded_daemon_with_plain_users_never_imports_the_reactor(tmp_path):
    alice = hash_password("wonderland", algorithm="pbkdf2-sha256")
    daemon, report = watched_daemon(tmp_path, "--set", f'listener.users={{alice = "{alice}"}}')
    url = f"amqp://127.0.0.1:{daemon.port}"
    assert filtered_round_trip(url) == ["red"]
    conn = BlockingConnection(url, timeout=20, user="alice", password="wonderland", allowed_mechs="PLAIN")
    try:
        conn.create_sender("inbox").send(Message(body="hello"))
    finally:
        conn.close()
    assert stopped_report(daemon, report) == {}


def test_a_pass_through_daemon_in_front_of_rabbitmq_never_imports_the_reactor(tmp_path, rabbitmq):
    daemon, report = watched_daemon(tmp_path, "--set", "upstream.credentials=pass-through",
                                    "--set", "listener.allow_anonymous=false", upstream=rabbitmq)
    conn = BlockingConnection(f"amqp://127.0.0.1:{daemon.port}", timeout=20, user="guest", password="guest",
                              allowed_mechs="PLAIN")
    topic = f"/topic/no-reactor-{uuid.uuid4().hex[:8]}"
    try:
        rcv = conn.create_receiver(topic, options=Selector("color = 'red'"), credit=10)
        snd = conn.create_sender(topic)
        for color in ("blue", "red"):
            snd.send(Message(body=color, properties={"color": color}))
        assert [m.body for m in receive_n_and_extras(rcv, 1, extra_wait=1, limit=20)] == ["red"]
        rcv.close()
    finally:
        conn.close()
    assert stopped_report(daemon, report) == {}


def test_the_watch_sees_a_reactor_import(tmp_path):
    """The control: the same watch on a daemon that imports `proton.utils` (which loads the reactor)
    reports it, with the stack that did it."""
    daemon, report = watched_daemon(tmp_path, preload="proton.utils")
    loaded = stopped_report(daemon, report)
    assert "proton._reactor" in loaded
    assert "proton/utils.py" in loaded["proton._reactor"] or "proton/_utils.py" in loaded["proton._reactor"]
