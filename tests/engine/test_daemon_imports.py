"""No proton wrapper object on the daemon's path: `broker-filter serve` (embedded broker, the default)
runs under `python -X importtime`, carries one message from a sender to a filtered receiver, and
the modules it imported are read from its log.  The proton event, reactor and handler layers
(`proton._events`, `proton._reactor`, `proton._handlers`) must not be among them, nor the `proton`
package at all (importing it imports its event layer): the daemon's handlers are the engine's."""

from __future__ import annotations

import re
import sys
import uuid

from launcher import Daemon

FORBIDDEN = ("proton", "proton._events", "proton._reactor", "proton._handlers", "proton._endpoints")


def imported_modules(log: str) -> set[str]:
    """The module names in `python -X importtime` lines (`import time: self | cumulative | name`)."""
    return {m.group(1).strip() for m in re.finditer(r"^import time:\s+\d+\s+\|\s+\d+\s+\|\s+(.+)$", log, re.M)}


def test_serve_imports_no_proton_event_layer():
    from proton import Message
    from proton.reactor import Selector
    from proton.utils import BlockingConnection

    daemon = Daemon(program=[sys.executable, "-X", "importtime", "-m", "broker_filter", "serve"])
    try:
        address = f"imports-{uuid.uuid4().hex[:8]}"
        connection = BlockingConnection(daemon.url, timeout=30)
        try:
            receiver = connection.create_receiver(address, options=Selector("n = 1"))
            sender = connection.create_sender(address)
            sender.send(Message(body="one", properties={"n": 1}))
            assert receiver.receive(timeout=30).body == "one"
            receiver.accept()
        finally:
            connection.close()
    finally:
        daemon.stop()
    modules = imported_modules(daemon.log())
    assert "broker_filter.proxy.server" in modules or "broker_filter.app" in modules, \
        f"no importtime lines for the daemon's own modules in its log:\n{daemon.log()[-2000:]}"
    found = sorted(name for name in modules if name in FORBIDDEN)
    assert not found, f"broker-filter serve imported {found}"
