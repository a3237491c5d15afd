"""Link names a client attaches twice on one session: aliased below proton-c's transport.

Why.  A client may attach two links with the same name and role on one session while the first is
still attached (python-qpid-proton's Container names every unnamed receiver
`<container-id>-<address>`; RabbitMQ 4 and Artemis attach both).  proton-c's transport treats the
second attach as a protocol error (`pn_do_attach`: "link name already attached") and closes the
whole connection, before any event reaches the daemon; its API has nothing to change that (the
name is what `pni_find_link` matches a local link by).  So the daemon's socket layer, which sees
every byte before `pn_transport_push`, renames such an attach to a unique alias before proton sees
it, and gives the client its own name back in the attach that answers it.

How.  `LinkNames.incoming` walks the frames of the client's byte stream: per frame it reads the
8-byte header and the performative's descriptor (3 bytes for the usual small-ulong form), skipping
the body of every frame but attach, detach and end; only those are decoded.  It keeps the
(channel, role, name) of every attached link of the connection (by the name proton sees), forgets
one at its detach and a channel's at its end.  An attach whose (channel, role, name) is attached
already is re-encoded with the name `<name>~<n>` (only the list header and the name change; every
other byte is copied), logged at INFO and counted.  Then the output side is switched on
(`outgoing`): from a frame boundary (the loop drains proton's output first) it walks the daemon's
frames the same way and puts the client's name back into the attach that carries the alias.  It
switches off again once no alias waits for its answer and a chunk of output ended at a frame
boundary, so connections without duplicates never pay for it.

An attach frame is held back until it is whole (up to `_HOLD_MAX`; a larger one is passed on
unexamined, as is everything after a frame that does not parse: proton judges those).
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from ..amqp import CodecError, decode, encode

log = logging.getLogger("broker_filter.engine")

ATTACH, DETACH, END = 0x12, 0x16, 0x17
_WATCHED = (ATTACH, DETACH, END)
_HOLD_MAX = 1 << 20  # the largest attach frame examined (bytes)
_header = struct.Struct(">IBBH")
_list32 = struct.Struct(">II")


def _performative(data: Any, body: int, end: int) -> int:
    """The descriptor code of the performative at `body` (-1: not known yet, -2: not a performative)."""
    if body + 3 > end:
        return -1
    if data[body] != 0:
        return -2
    form = data[body + 1]
    if form == 0x53:
        return data[body + 2]
    if form == 0x80:
        if body + 10 > end:
            return -1
        return data[body + 9] if not any(data[body + 2:body + 9]) else -2
    return -2


class FrameWalker:
    """Frame boundaries in one direction of a connection's byte stream, incrementally; hands each
    whole attach/detach/end frame to `on_frame(code, channel, frame) -> replacement or None`."""

    __slots__ = ("skip", "held", "broken", "on_frame")

    def __init__(self, on_frame: Any, skip: int = 0):
        self.skip = skip  # bytes of the current frame (or protocol header) still to pass unexamined
        self.held = b""  # the start of a frame not yet whole enough to judge
        self.broken = False  # the stream stopped parsing as frames: pass everything on
        self.on_frame = on_frame

    def feed(self, data: Any) -> bytes | None:
        """The bytes to pass on for `data`: None means `data` itself, unchanged and whole."""
        if self.broken:
            if self.held:
                data, self.held = self.held + bytes(data), b""
                return data
            return None
        original = not self.held
        if self.held:
            data = self.held + bytes(data)
            self.held = b""
        n = len(data)
        pos = self.skip
        if pos >= n:
            self.skip = pos - n
            return None if original else data
        pieces: list | None = None
        start = 0  # data[start:pos] is passed on as is
        unpack = _header.unpack_from
        while pos < n:
            if pos + 8 > n:
                break  # hold the partial header
            size, doff, _, channel = unpack(data, pos)
            if size < 8 or doff < 2:
                self.broken = True
                pos = n
                break
            if size > 8:
                body = pos + doff * 4
                if body + 3 <= n and data[body + 1] == 0x53 and not data[body]:
                    code = data[body + 2]  # the usual form: 0x00 0x53 <code>
                    if code not in _WATCHED:
                        pos += size
                        continue
                else:
                    code = _performative(data, body, min(n, pos + size))
                if code == -1 and pos + size > n:
                    break  # hold until the descriptor is here
                if code in _WATCHED and size <= _HOLD_MAX:
                    if pos + size > n:
                        break  # hold until the frame is whole
                    replacement = self.on_frame(code, channel, bytes(data[pos:pos + size]))
                    if replacement is not None:
                        if pieces is None:
                            pieces = []
                        pieces.append(bytes(data[start:pos]))
                        pieces.append(replacement)
                        start = pos + size
            pos += size
        if pos < n:  # a frame not yet whole enough: hold it back
            self.held = bytes(data[pos:])
            self.skip = 0
            end = pos
        else:
            self.skip = pos - n
            end = n
        if pieces is None:
            if original and end == n:
                return None
            return bytes(data[:end])
        pieces.append(bytes(data[start:end]))
        return b"".join(pieces)


def _fields(frame: bytes) -> tuple[int, int, int, int] | None:
    """(body offset, list offset, elements offset, element count) of a frame's performative list."""
    body = frame[4] * 4
    p = body + (3 if frame[body + 1] == 0x53 else 10)
    kind = frame[p]
    if kind == 0xC0:
        return body, p, p + 3, frame[p + 2]
    if kind == 0xD0:
        return body, p, p + 9, _list32.unpack_from(frame, p + 1)[1]
    return None


def _list_end(frame: bytes, p: int) -> int:
    if frame[p] == 0xC0:
        return p + 2 + frame[p + 1]
    return p + 5 + _list32.unpack_from(frame, p + 1)[0]


def rename(frame: bytes, name: str) -> bytes:
    """An attach frame with its name (the first field) replaced; every other byte as it was."""
    layout = _fields(frame)
    assert layout is not None
    body, p, elements, count = layout
    _, after_name = decode(frame, elements)
    end = _list_end(frame, p)
    items = encode(name) + frame[after_name:end]
    performative = frame[body:p] + b"\xd0" + _list32.pack(len(items) + 4, count) + items
    rest = frame[end:]
    size = body + len(performative) + len(rest)
    return struct.pack(">I", size) + frame[4:body] + performative + rest


def _read(frame: bytes, wanted: int) -> list | None:
    """The first `wanted` fields of a frame's performative (None: not readable, proton judges it)."""
    layout = _fields(frame)
    if layout is None:
        return None
    _, _, pos, count = layout
    out = []
    for _ in range(min(wanted, count)):
        value, pos = decode(frame, pos)
        out.append(value)
    return out


class LinkNames:
    """The aliasing of one server connection (see the module's text)."""

    __slots__ = ("connection", "attached", "handles", "aliases", "serial", "inbound", "outbound", "renamed")

    def __init__(self, connection: Any):
        self.connection = connection
        self.attached: dict[tuple, int] = {}  # (channel, role, name proton sees) -> handle
        self.handles: dict[tuple, tuple] = {}  # (channel, handle) -> its key in `attached`
        self.aliases: dict[str, str] = {}  # alias -> the client's name, until the answer is out
        self.serial = 0
        self.renamed = 0
        self.inbound = FrameWalker(self._incoming_frame, skip=8)  # after the AMQP protocol header
        self.outbound: FrameWalker | None = None

    # ---------------------------------------------------------------- client -> daemon
    def incoming(self, data: Any) -> bytes | None:
        return self.inbound.feed(data)

    def _incoming_frame(self, code: int, channel: int, frame: bytes) -> bytes | None:
        try:
            if code == ATTACH:
                return self._attach(channel, frame)
            if code == DETACH:
                fields = _read(frame, 1)
                if fields:
                    key = self.handles.pop((channel, int(fields[0])), None)
                    if key is not None:
                        self.attached.pop(key, None)
            else:  # END: every link of the channel's session is gone
                for key in [k for k in self.handles if k[0] == channel]:
                    self.attached.pop(self.handles.pop(key), None)
        except (CodecError, IndexError, TypeError, ValueError, struct.error):
            pass  # not readable here: proton judges it
        return None

    def _attach(self, channel: int, frame: bytes) -> bytes | None:
        fields = _read(frame, 3)
        if not fields or len(fields) < 3 or not isinstance(fields[0], str):
            return None
        name, handle, role = fields[0], int(fields[1]), bool(fields[2])
        key = (channel, role, name)
        replacement = None
        if key in self.attached:
            alias = name
            while (channel, role, alias) in self.attached or alias in self.aliases:
                self.serial += 1
                alias = f"{name}~{self.serial}"
            replacement = rename(frame, alias)
            self.aliases[alias] = name
            self.renamed += 1
            key = (channel, role, alias)
            connection_id = _connection_id(self.connection)
            log.info("link name already attached on this session: attached as %s", alias,
                     extra={"fields": {"connection": connection_id, "link": name, "alias": alias,
                                       "channel": channel, "role": "receiver" if role else "sender"}})
            if self.outbound is None:
                self.outbound = FrameWalker(self._outgoing_frame)
        old = self.handles.pop((channel, handle), None)  # a handle reused without a detach: proton judges
        if old is not None:
            self.attached.pop(old, None)
        self.attached[key] = handle
        self.handles[(channel, handle)] = key
        return replacement

    # ---------------------------------------------------------------- daemon -> client
    def outgoing(self, data: Any) -> bytes | None:
        """The daemon's output with the client's names back (only while `outbound` is on)."""
        walker = self.outbound
        if walker is None:
            return None
        out = walker.feed(data)
        if not self.aliases and walker.skip == 0 and not walker.held:
            self.outbound = None  # at a frame boundary with nothing to put back: off again
        return out

    def _outgoing_frame(self, code: int, channel: int, frame: bytes) -> bytes | None:
        if code != ATTACH:
            return None
        try:
            fields = _read(frame, 1)
        except (CodecError, IndexError, TypeError, ValueError, struct.error):
            return None
        if not fields:
            return None
        name = self.aliases.pop(fields[0], None) if isinstance(fields[0], str) else None
        return None if name is None else rename(frame, name)


def _connection_id(connection: Any) -> str:
    """The daemon's id of a connection (the proxy's record of it, `context.id`), else its name."""
    ours = getattr(getattr(connection, "context", None), "id", None)
    if ours is not None:
        return str(ours)
    return str(getattr(connection, "name", "") or connection)
