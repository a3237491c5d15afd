"""Answers read from proton's frame trace, without I/O: what python-qpid-proton has no accessor for.

`remote.RemoteUpstream` traces frames only while it awaits one of these (see its module docstring):
the reply to a consumer attach that offers filters, whose own offered-capabilities (RabbitMQ 4.1+
offers `AMQP_FILTEX_PROP_V1_0` / `AMQP_FILTEX_SQL_V1_0` there, on streams) proton 0.40 does not
expose; and the flow answering a drain without credit, whose `available` is the queue's ready count
(`remote.RemoteConsumer.probe`).  Each function takes one trace line as proton's tracer hands it.
"""

from __future__ import annotations

import re

# An attach reply: the link name, and the attach's own offered-capabilities
_ATTACH = re.compile(r'<- @attach\(18\) \[name="((?:[^"\\]|\\.)*)"')
_OFFERED = re.compile(r'offered-capabilities=(@<symbol>\[[^\]]*\]|:"[^"]*"|:[^\s,\]]+)')
_SYMBOL = re.compile(r':"([^"]*)"|:([^\s,\]"]+)')
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# The answer to a drain without credit: a flow carrying the queue's ready count (RabbitMQ 3.10, 4)
_AVAILABLE = re.compile(r"<- @flow\(19\) \[[^\]]*available=(0x[0-9a-fA-F]+|\d+)[^\]]*drain=true")


def parse_available(line: str) -> int | None:
    """The `available` count of an incoming drain flow; None if `line` is no such flow."""
    m = _AVAILABLE.search(line)
    return int(m.group(1), 0) if m is not None else None


def parse_attach_capabilities(line: str) -> tuple[str, frozenset[str]] | None:
    """(link name, the attach's own offered-capabilities) of an incoming attach; None if `line` is
    no attach.  The name comes unescaped (proton prints `"` as `\\x22`)."""
    m = _ATTACH.search(line)
    if m is None:
        return None
    name = _ESCAPE.sub(lambda x: bytes([int(x.group(1), 16)]),
                       m.group(1).encode("utf-8", "surrogateescape")).decode("utf-8", "replace")
    caps = _OFFERED.search(line, m.end())
    return name, frozenset(a or b for a, b in _SYMBOL.findall(caps.group(1))) if caps is not None else frozenset()
