"""AMQP endpoints on proton-c's engine: connections, sessions, links and deliveries keyed by pointer.

Theory of operation.  An `Engine` owns one proton collector.  Every connection it makes is a
`pn_connection_t` bound to a `pn_transport_t` and collected there; `process()` drains the collector
once and calls the connection's `Handler` with the project's own small objects (`Connection`,
`Session`, `Sender`/`Receiver`, `Delivery`), never with proton's Python wrappers: an event costs a
type number, one pointer and one dict lookup.  The objects live in dicts keyed by their proton
pointer and are dropped *before* the pointer is freed (a freed pointer is a crash, and proton reuses
addresses), so an object whose `ptr` is None is gone and its methods do nothing.

Bytes move through `push(connection, data)` (input) and `take_output(connection)` (one
`pn_transport_pending`/`peek`/`pop`, where proton encodes its frames: call it once per connection
per loop turn).  Who moves them is not this module's business: `loop.EventLoop` does it with
sockets, `memory.pump` with another connection in the same process.  Heartbeats: each connection
is ticked (`pn_transport_tick`) at the deadline proton names, by the engine's timer heap
(`call_at`, `run_timers`).

A link may have a handler of its own (`Link.handler`, a `LinkHandler`): its control events
(detach, flow) go there instead of to the connection's handler, and its transfers go to
`handler.transfer(delivery pointer)` straight from `process`, with no object built: the engine keeps
such handlers in one dict keyed by link pointer (`Engine.link_handlers`), looked up once per
PN_DELIVERY event, and drops the entry when it forgets the link (before proton can reuse the
address).  A transfer that raises calls `handler.failed()` while the exception is handled.

Received messages on other links reach `Handler.on_message(delivery, data)` as a memoryview of a
buffer that the next message overwrites (copy it to keep it).  A message the peer sent settled is settled by the
engine when `on_message` returns.  Delivery tags are never decoded (`Delivery.tag` is bytes,
`Delivery.raw_tag` the proton `pn_bytes_t` a sender can reuse as is).

Values in termini, properties and annotations cross the boundary as AMQP encodings: proton's
`pn_data_encode` into the project's codec (`broker_filter.amqp.decode`) and back through
`pn_data_decode`, so they arrive as `broker_filter.amqp.types` values.  A source filter that proton
could not decode (a map whose count disagrees with its size, an odd number of map items) is
reported as `Terminus.filter_error` instead of reading as no filter.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from ..amqp import types as t
from ..amqp import CodecError, decode, encode
from ._cproton import ffi, lib

NULL = ffi.NULL
log = logging.getLogger("broker_filter.engine")

LOCAL_UNINIT, LOCAL_ACTIVE, LOCAL_CLOSED = lib.PN_LOCAL_UNINIT, lib.PN_LOCAL_ACTIVE, lib.PN_LOCAL_CLOSED
REMOTE_UNINIT, REMOTE_ACTIVE, REMOTE_CLOSED = lib.PN_REMOTE_UNINIT, lib.PN_REMOTE_ACTIVE, lib.PN_REMOTE_CLOSED

ACCEPTED, REJECTED, RELEASED, MODIFIED, RECEIVED = (
    lib.PN_ACCEPTED, lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED, lib.PN_RECEIVED)

EXPIRY_POLICIES = {
    lib.PN_EXPIRE_WITH_LINK: "link-detach",
    lib.PN_EXPIRE_WITH_SESSION: "session-end",
    lib.PN_EXPIRE_WITH_CONNECTION: "connection-close",
    lib.PN_EXPIRE_NEVER: "never",
}
_EXPIRY_CODES = {name: code for code, name in EXPIRY_POLICIES.items()}
DISTRIBUTION_MODES = {lib.PN_DIST_MODE_UNSPECIFIED: None, lib.PN_DIST_MODE_COPY: "copy",
                      lib.PN_DIST_MODE_MOVE: "move"}
_DISTRIBUTION_CODES = {name: code for code, name in DISTRIBUTION_MODES.items()}


_TRANSPORT = lib.PN_TRANSPORT
_DELIVERY = lib.PN_DELIVERY


class Condition(NamedTuple):
    """An AMQP error condition: `name` (a symbol such as amqp:not-found) and a description.  (To
    close with the error's `info` map as well, give a plain tuple (name, description, info).)"""

    name: str
    description: str = ""


# --------------------------------------------------------------------------------------------------
# Values through pn_data (encoded bytes both ways)


def read_data(data: Any) -> tuple[Any, str | None]:
    """(value, error) of a `pn_data_t`: the first value it holds (None when empty), or the reason
    it cannot be read (proton's decode status, or the project's codec refusing the re-encoding)."""
    code = lib.pn_error_code(lib.pn_data_error(data))
    if code:
        return None, f"not a valid AMQP encoding (proton decode status {code})"
    size = lib.pn_data_encoded_size(data)
    if size <= 0:
        return None, None
    buf = ffi.new("char[]", size)
    written = lib.pn_data_encode(data, buf, size)
    if written < 0:
        return None, f"not a valid AMQP value (proton encode status {written})"
    raw = ffi.buffer(buf, written)[:]
    try:
        value, _ = decode(raw, 0)
    except CodecError as e:
        return None, str(e)
    return value, None


def write_data(data: Any, value: Any) -> None:
    """Replace the content of a `pn_data_t` with one value (None: empty)."""
    lib.pn_data_clear(data)
    if value is None:
        return
    raw = encode(value)
    result = lib.pn_data_decode(data, raw, len(raw))
    if result < 0:  # pragma: no cover - the project's encoder produced what proton refuses
        raise ValueError(f"proton refused the encoding of {value!r} (status {result})")


def _text(pointer: Any) -> str | None:
    return None if pointer == NULL else ffi.string(pointer).decode("utf-8", "replace")


def condition_of(pointer: Any) -> Condition | None:
    if pointer == NULL or not lib.pn_condition_is_set(pointer):
        return None
    return Condition(_text(lib.pn_condition_get_name(pointer)) or "",
                     _text(lib.pn_condition_get_description(pointer)) or "")


def set_condition(pointer: Any, condition: Condition | tuple | None) -> None:
    if condition is None:
        return
    name, description, info = (tuple(condition) + ("", None))[:3]
    lib.pn_condition_set_name(pointer, name.encode())
    if description:
        lib.pn_condition_set_description(pointer, description.encode())
    if info:
        write_data(lib.pn_condition_info(pointer), info)


def set_disposition(delivery: Any, state: int, *, condition: Condition | tuple | None = None,
                    failed: bool = False, undeliverable: bool = False, annotations: dict | None = None) -> None:
    """Set the local state of `delivery` (a `pn_delivery_t`): REJECTED with `condition`, MODIFIED with
    its flags and annotations, or any other state as it is.  Settling is the caller's."""
    if state == REJECTED:
        if condition is not None:
            set_condition(lib.pn_disposition_condition(lib.pn_delivery_local(delivery)), condition)
    elif state == MODIFIED:
        local = lib.pn_delivery_local(delivery)
        lib.pn_disposition_set_failed(local, failed)
        lib.pn_disposition_set_undeliverable(local, undeliverable)
        if annotations:
            write_data(lib.pn_disposition_annotations(local), annotations)
    lib.pn_delivery_update(delivery, state)


def _symbols(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return (str(value),)


def _symbol_array(names: Any) -> Any:
    return None if not names else t.Array("symbol", [t.symbol(n) for n in names])


# --------------------------------------------------------------------------------------------------
# Termini


@dataclass(frozen=True)
class Terminus:
    """A link's source or target as the peer (or this side) set it."""

    address: str | None = None
    dynamic: bool = False
    durability: int = 0  # 0 none, 1 configuration, 2 unsettled-state
    expiry_policy: str = "session-end"
    timeout: int = 0
    distribution_mode: str | None = None  # "move", "copy", None
    filter: Any = None  # a map {symbol: value} (or whatever else the peer sent), or None
    filter_error: str | None = None  # why the peer's filter could not be read (then `filter` is None)
    capabilities: tuple[str, ...] = ()
    dynamic_node_properties: Any = None
    null: bool = False  # no terminus at all (an attach refused by its sender carries a null source)


def read_terminus(pointer: Any) -> Terminus:
    if lib.pn_terminus_get_type(pointer) == lib.PN_UNSPECIFIED:
        return _NULL_TERMINUS
    filter_value, filter_error = read_data(lib.pn_terminus_filter(pointer))
    capabilities, _ = read_data(lib.pn_terminus_capabilities(pointer))
    properties, _ = read_data(lib.pn_terminus_properties(pointer))
    return Terminus(
        address=_text(lib.pn_terminus_get_address(pointer)),
        dynamic=bool(lib.pn_terminus_is_dynamic(pointer)),
        durability=int(lib.pn_terminus_get_durability(pointer)),
        expiry_policy=EXPIRY_POLICIES.get(lib.pn_terminus_get_expiry_policy(pointer), "session-end"),
        timeout=int(lib.pn_terminus_get_timeout(pointer)),
        distribution_mode=DISTRIBUTION_MODES.get(lib.pn_terminus_get_distribution_mode(pointer)),
        filter=filter_value,
        filter_error=filter_error,
        capabilities=_symbols(capabilities),
        dynamic_node_properties=properties,
    )


_NULL_TERMINUS = Terminus(null=True)


def write_terminus(pointer: Any, terminus: Terminus) -> None:
    if terminus.null:
        lib.pn_terminus_set_type(pointer, lib.PN_UNSPECIFIED)
        return
    if terminus.address is not None:
        lib.pn_terminus_set_address(pointer, terminus.address.encode())
    lib.pn_terminus_set_dynamic(pointer, terminus.dynamic)
    lib.pn_terminus_set_durability(pointer, terminus.durability)
    lib.pn_terminus_set_expiry_policy(pointer, _EXPIRY_CODES[terminus.expiry_policy])
    lib.pn_terminus_set_timeout(pointer, terminus.timeout)
    lib.pn_terminus_set_distribution_mode(pointer, _DISTRIBUTION_CODES[terminus.distribution_mode])
    write_data(lib.pn_terminus_filter(pointer), terminus.filter or None)
    write_data(lib.pn_terminus_capabilities(pointer), _symbol_array(terminus.capabilities))
    if terminus.dynamic_node_properties is not None:
        write_data(lib.pn_terminus_properties(pointer), terminus.dynamic_node_properties)


def copy_remote(pointer: Any, other: Any) -> None:
    """`pointer`'s (a `pn_link_t`) termini, settle modes and link properties set to what `other`'s
    peer attached with."""
    lib.pn_terminus_copy(lib.pn_link_source(pointer), lib.pn_link_remote_source(other))
    lib.pn_terminus_copy(lib.pn_link_target(pointer), lib.pn_link_remote_target(other))
    lib.pn_link_set_snd_settle_mode(pointer, lib.pn_link_remote_snd_settle_mode(other))
    lib.pn_link_set_rcv_settle_mode(pointer, lib.pn_link_remote_rcv_settle_mode(other))
    properties, _ = read_data(lib.pn_link_remote_properties(other))
    if properties:
        write_data(lib.pn_link_properties(pointer), properties)


# --------------------------------------------------------------------------------------------------
# Handlers


class Handler:
    """What a connection's events call.  The defaults answer the peer as proton's handshaker does
    (open what it opens, close what it closes) and refuse links."""

    def on_accepted(self, connection: Connection) -> None:
        """A listener accepted `connection` (before any byte was read)."""

    def on_connection_open(self, connection: Connection) -> None:
        if connection.local_state == LOCAL_UNINIT:
            connection.open()

    def on_connection_close(self, connection: Connection) -> None:
        connection.close()

    def on_session_open(self, session: Session) -> None:
        if session.local_state == LOCAL_UNINIT:
            session.open()

    def on_session_close(self, session: Session) -> None:
        session.close()

    def on_link_open(self, link: Link) -> None:
        """The peer attached `link`: open it (`link.open()`) or refuse it (`link.close(condition)`)."""
        link.close(Condition("amqp:not-implemented", "this endpoint accepts no links"))

    def on_link_close(self, link: Link) -> None:
        """The peer detached or closed `link`."""
        if link.remote_closed:
            link.close()
        else:
            link.detach()

    def on_flow(self, link: Link) -> None:
        """Credit or drain changed on `link`."""

    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        """A complete message on a receiver; `data` is valid during this call only."""

    def on_delivery_update(self, delivery: Delivery) -> None:
        """The peer changed the state of `delivery` or settled it."""

    def on_disconnected(self, connection: Connection, error: Condition | None) -> None:
        """The connection's transport closed; every object of it is gone after this call."""


class LinkHandler:
    """A link's own handler (`Link.handler`): its transfers as raw `pn_delivery_t` pointers
    (`transfer`, straight from `Engine.process`: the per-message path), `failed()` when a transfer
    raised (called while the exception is handled), and its control events, which by default go on
    to the connection's handler as they would without one."""

    __slots__ = ()

    def transfer(self, delivery: Any) -> None:
        """A PN_DELIVERY event on the link: a message received, or the peer's disposition."""
        raise NotImplementedError

    def failed(self) -> None:
        log.exception("handling a delivery failed")

    def on_link_open(self, link: Link) -> None:
        link.connection.handler.on_link_open(link)

    def on_link_close(self, link: Link) -> None:
        link.connection.handler.on_link_close(link)

    def on_flow(self, link: Link) -> None:
        link.connection.handler.on_flow(link)


class Transfers(LinkHandler):
    """A link handler made of functions: `transfer(delivery pointer)` and, optionally, `failed()`;
    its link's control events stay with the connection's handler (the upstream side's links)."""

    __slots__ = ("transfer", "failed")

    def __init__(self, transfer: Callable[[Any], None], failed: Callable[[], None] | None = None):
        self.transfer = transfer  # type: ignore[method-assign]
        self.failed = failed if failed is not None else super().failed  # type: ignore[method-assign]


class _Endpoint:
    """What connections, sessions and links share: state, open, close with a condition."""

    __slots__ = ()
    ptr: Any
    _state_of: Callable[[Any], int]
    _open_of: Callable[[Any], None]
    _close_of: Callable[[Any], None]
    _condition_of: Callable[[Any], Any]

    @property
    def local_state(self) -> int:
        return self._state_of(self.ptr) & (LOCAL_UNINIT | LOCAL_ACTIVE | LOCAL_CLOSED) if self.ptr is not None \
            else LOCAL_CLOSED

    @property
    def remote_state(self) -> int:
        return self._state_of(self.ptr) & (REMOTE_UNINIT | REMOTE_ACTIVE | REMOTE_CLOSED) if self.ptr is not None \
            else REMOTE_CLOSED

    @property
    def remote_closed(self) -> bool:
        return self.remote_state == REMOTE_CLOSED

    def open(self) -> None:
        if self.ptr is not None:
            self._open_of(self.ptr)

    def close(self, condition: Condition | tuple | None = None) -> None:
        """Close (with an error condition: a name such as amqp:not-found and a description)."""
        if self.ptr is None or self.local_state == LOCAL_CLOSED:
            return
        set_condition(self._condition_of(self.ptr), condition)
        self._close_of(self.ptr)


class Connection(_Endpoint):
    """An AMQP connection (server or client side) on the engine."""

    __slots__ = ("engine", "ptr", "transport", "handler", "server", "identity", "context", "io", "sessions",
                 "error", "_tick_timer", "closed", "name")

    def __init__(self, engine: Engine, handler: Handler, *, server: bool, identity: Any = None, name: str = ""):
        self.engine = engine
        self.handler = handler
        self.server = server
        self.identity = identity
        self.context: Any = None
        self.io: Any = None  # what moves this connection's bytes (a socket channel, a memory pump)
        self.sessions: set[Session] = set()
        self.error: Condition | None = None
        self._tick_timer: Timer | None = None
        self.closed = False
        self.name = name
        self.ptr = lib.pn_connection()
        self.transport = lib.pn_transport()

    _state_of = lib.pn_connection_state
    _close_of = lib.pn_connection_close
    _condition_of = lib.pn_connection_condition

    def open(self, *, container_id: str | None = None, hostname: str | None = None,  # type: ignore[override]
             properties: dict | None = None, offered_capabilities: Any = None) -> None:
        if self.ptr is None:
            return
        lib.pn_connection_set_container(self.ptr, (container_id or self.engine.container_id).encode())
        if hostname:
            lib.pn_connection_set_hostname(self.ptr, hostname.encode())
        if properties:
            write_data(lib.pn_connection_properties(self.ptr), properties)
        if offered_capabilities:
            write_data(lib.pn_connection_offered_capabilities(self.ptr), _symbol_array(offered_capabilities))
        lib.pn_connection_open(self.ptr)

    def session(self, incoming_capacity: int = 0) -> Session:
        """A new local session (call `open()` on it)."""
        pointer = lib.pn_session(self.ptr)
        if incoming_capacity:
            lib.pn_session_set_incoming_capacity(pointer, incoming_capacity)
        session = self.engine._adopt_session(pointer, self)
        assert session is not None
        return session

    @property
    def remote_container(self) -> str | None:
        return _text(lib.pn_connection_remote_container(self.ptr)) if self.ptr is not None else None

    @property
    def remote_hostname(self) -> str | None:
        return _text(lib.pn_connection_remote_hostname(self.ptr)) if self.ptr is not None else None

    @property
    def remote_properties(self) -> Any:
        return read_data(lib.pn_connection_remote_properties(self.ptr))[0] if self.ptr is not None else None

    @property
    def remote_offered_capabilities(self) -> tuple[str, ...]:
        if self.ptr is None:
            return ()
        return _symbols(read_data(lib.pn_connection_remote_offered_capabilities(self.ptr))[0])

    @property
    def remote_condition(self) -> Condition | None:
        return condition_of(lib.pn_connection_remote_condition(self.ptr)) if self.ptr is not None else None

    @property
    def remote_idle_timeout(self) -> float:
        return lib.pn_transport_get_remote_idle_timeout(self.transport) / 1000 if self.ptr is not None else 0.0

    def set_idle_timeout(self, seconds: float) -> None:
        """The idle timeout this side announces (before its open frame goes out)."""
        if self.ptr is not None:
            lib.pn_transport_set_idle_timeout(self.transport, int(seconds * 1000))

    def trace(self, tracer: Callable[[str], None] | None) -> None:
        """Hand every frame this connection sends or receives to `tracer`, as proton's trace text
        (`<- @attach(18) [name="...", ...]`); None stops.  For the few answers proton has no
        accessor for (a link's remote offered-capabilities, a flow's `available`): tracing costs a
        formatted line a frame, so trace only while such an answer is awaited."""
        if self.ptr is None:
            return
        transport = self.transport
        if tracer is None:
            lib.pn_transport_trace(transport, lib.PN_TRACE_OFF)
            return
        import cproton  # python-qpid-proton's C binding module (not the `proton` package): its tracer hook

        record = lib.pn_transport_attachments(transport)
        attributes = cproton.pn_record_get_py(record)
        if attributes is None:  # (proton's wrappers keep their attributes in this record too)
            attributes = {}
            cproton.pn_record_def_py(record)
            cproton.pn_record_set_py(record, attributes)
        attributes["_tracer"] = lambda _transport, message: tracer(message)
        lib.pn_transport_set_tracer(transport, lib.pn_pytracer)
        lib.pn_transport_trace(transport, lib.PN_TRACE_FRM)

    def __repr__(self) -> str:
        return f"<Connection {self.name or hex(id(self))}{' closed' if self.ptr is None else ''}>"


class Session(_Endpoint):
    __slots__ = ("ptr", "connection", "links", "context")

    def __init__(self, pointer: Any, connection: Connection):
        self.ptr = pointer
        self.connection = connection
        self.links: set[Link] = set()
        self.context: Any = None

    _state_of = lib.pn_session_state
    _open_of = lib.pn_session_open
    _close_of = lib.pn_session_close
    _condition_of = lib.pn_session_condition

    @property
    def remote_condition(self) -> Condition | None:
        return condition_of(lib.pn_session_remote_condition(self.ptr)) if self.ptr is not None else None

    def sender(self, name: str, *, target: Terminus | None = None, source: Terminus | None = None,
               settled: bool = False, handler: Handler | None = None, properties: dict | None = None) -> Sender:
        return self._link(lib.pn_sender, name, source, target, settled, handler, properties)  # type: ignore

    def receiver(self, name: str, *, source: Terminus | None = None, target: Terminus | None = None,
                 settled: bool = False, handler: Handler | None = None, properties: dict | None = None) -> Receiver:
        return self._link(lib.pn_receiver, name, source, target, settled, handler, properties)  # type: ignore

    def _link(self, make: Callable, name: str, source: Terminus | None, target: Terminus | None, settled: bool,
              handler: Handler | None, properties: dict | None) -> Link:
        pointer = make(self.ptr, name.encode())
        if source is not None:
            write_terminus(lib.pn_link_source(pointer), source)
        if target is not None:
            write_terminus(lib.pn_link_target(pointer), target)
        if settled:
            lib.pn_link_set_snd_settle_mode(pointer, lib.PN_SND_SETTLED)
        if properties:
            write_data(lib.pn_link_properties(pointer), properties)
        link = self.connection.engine._adopt_link(pointer)
        assert link is not None
        if handler is not None:
            link.handler = handler
        return link

    def free(self) -> None:
        """Forget a session that was never opened (its links with it)."""
        if self.ptr is not None and self.local_state == LOCAL_UNINIT:
            self.connection.engine._free_session(self)


class Link(_Endpoint):
    """A sender or receiver link.  `handler` (None: the connection's) gets its events; a
    `LinkHandler` gets its transfers too, straight from the engine (see the module docstring)."""

    __slots__ = ("ptr", "session", "connection", "_handler", "unsettled", "context", "name", "__weakref__")
    is_sender = False
    is_receiver = True

    def __init__(self, pointer: Any, session: Session):
        self.ptr = pointer
        self.session = session
        self.connection = session.connection
        self._handler: Handler | LinkHandler | None = None
        self.unsettled: dict[Any, Delivery] = {}
        self.context: Any = None
        self.name = _text(lib.pn_link_name(pointer)) or ""

    @property
    def handler(self) -> Handler | LinkHandler | None:
        return self._handler

    @handler.setter
    def handler(self, handler: Handler | LinkHandler | None) -> None:
        self._handler = handler
        if self.ptr is not None:
            handlers = self.connection.engine.link_handlers
            if isinstance(handler, LinkHandler):
                handlers[self.ptr] = handler
            else:
                handlers.pop(self.ptr, None)

    _state_of = lib.pn_link_state
    _open_of = lib.pn_link_open
    _close_of = lib.pn_link_close
    _condition_of = lib.pn_link_condition

    @property
    def remote_source(self) -> Terminus:
        return read_terminus(lib.pn_link_remote_source(self.ptr))

    @property
    def remote_target(self) -> Terminus:
        return read_terminus(lib.pn_link_remote_target(self.ptr))

    @property
    def remote_properties(self) -> Any:
        return read_data(lib.pn_link_remote_properties(self.ptr))[0]

    @property
    def remote_condition(self) -> Condition | None:
        return condition_of(lib.pn_link_remote_condition(self.ptr)) if self.ptr is not None else None

    @property
    def remote_settled_mode(self) -> bool:
        """Whether the peer sends settled (snd-settle-mode settled)."""
        return lib.pn_link_remote_snd_settle_mode(self.ptr) == lib.PN_SND_SETTLED

    def set_source(self, terminus: Terminus) -> None:
        write_terminus(lib.pn_link_source(self.ptr), terminus)

    def set_target(self, terminus: Terminus) -> None:
        write_terminus(lib.pn_link_target(self.ptr), terminus)

    def free(self) -> None:
        """Let go of a link detached both ways without closing (closed links go by themselves): a
        new attach under its name then gets a new link."""
        if self.ptr is not None:
            self.connection.engine._to_free.append(self)

    def detach(self, condition: Condition | tuple | None = None) -> None:
        if self.ptr is None or self.local_state == LOCAL_CLOSED:
            return
        set_condition(lib.pn_link_condition(self.ptr), condition)
        lib.pn_link_detach(self.ptr)

    @property
    def credit(self) -> int:
        return lib.pn_link_credit(self.ptr) if self.ptr is not None else 0

    @property
    def queued(self) -> int:
        return lib.pn_link_queued(self.ptr) if self.ptr is not None else 0

    @property
    def drain_mode(self) -> bool:
        return bool(lib.pn_link_get_drain(self.ptr)) if self.ptr is not None else False

    def set_snd_settle_mode(self, settled: bool) -> None:
        """Send settled (snd-settle-mode settled) or unsettled, as the attach reply will say."""
        if self.ptr is not None:
            lib.pn_link_set_snd_settle_mode(self.ptr, lib.PN_SND_SETTLED if settled else lib.PN_SND_UNSETTLED)

    def set_max_message_size(self, size: int) -> None:
        if self.ptr is not None:
            lib.pn_link_set_max_message_size(self.ptr, size)

    def copy_remote_source(self) -> None:
        """This link's source as the peer's (all of it, as proton read it)."""
        if self.ptr is not None:
            lib.pn_terminus_copy(lib.pn_link_source(self.ptr), lib.pn_link_remote_source(self.ptr))

    def copy_remote_target(self) -> None:
        if self.ptr is not None:
            lib.pn_terminus_copy(lib.pn_link_target(self.ptr), lib.pn_link_remote_target(self.ptr))

    @property
    def remote_target_type(self) -> int:
        """proton's type of the peer's target (`lib.PN_TARGET`, `PN_COORDINATOR`, `PN_UNSPECIFIED`)."""
        return lib.pn_terminus_get_type(lib.pn_link_remote_target(self.ptr)) if self.ptr is not None else 0

    @property
    def unsettled_count(self) -> int:
        """Deliveries on this link not settled here (proton's count, routed links included)."""
        return lib.pn_link_unsettled(self.ptr) if self.ptr is not None else 0

    @property
    def remote_max_message_size(self) -> int:
        return int(lib.pn_link_remote_max_message_size(self.ptr)) if self.ptr is not None else 0

    def copy_remote(self, other: Any) -> None:
        """This link's termini, settle modes and properties as `other`'s peer sent them (`other`: a
        `pn_link_t`), e.g. to attach upstream what a client attached."""
        if self.ptr is not None:
            copy_remote(self.ptr, other)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}{' closed' if self.ptr is None else ''}>"


class Sender(Link):
    __slots__ = ("_tags",)
    is_sender = True
    is_receiver = False

    def __init__(self, pointer: Any, session: Session):
        super().__init__(pointer, session)
        self._tags = itertools.count(1)

    def send(self, data: bytes | bytearray | memoryview, *, tag: Any = None, settled: bool = False
             ) -> Delivery | None:
        """Send one encoded message (one credit).  `tag`: bytes, a `Delivery.raw_tag` to reuse, or
        None for a counter.  Returns the Delivery (None when sent settled)."""
        pointer = self.ptr
        if tag is None:
            tag = next(self._tags).to_bytes(8, "big")
        if isinstance(tag, (bytes, bytearray)):
            delivery = lib.pn_delivery(pointer, (len(tag), ffi.from_buffer(tag)))
        else:
            delivery = lib.pn_delivery(pointer, tag)
        buffer = data if type(data) is bytes else ffi.from_buffer(data)
        lib.pn_link_send(pointer, buffer, len(data))
        lib.pn_link_advance(pointer)
        if settled:
            lib.pn_delivery_settle(delivery)
            return None
        wrapped = Delivery(delivery, self)
        self.unsettled[delivery] = wrapped
        return wrapped

    def drained(self) -> int:
        """Answer a drain request: give back the unused credit; returns how much."""
        return lib.pn_link_drained(self.ptr) if self.ptr is not None else 0

    def offered(self, count: int) -> None:
        lib.pn_link_offered(self.ptr, count)


class Receiver(Link):
    __slots__ = ()

    def flow(self, credit: int) -> None:
        """Grant `credit` more messages."""
        if self.ptr is not None and credit > 0:
            lib.pn_link_flow(self.ptr, credit)

    def drain(self, credit: int = 0) -> None:
        if self.ptr is not None:
            lib.pn_link_drain(self.ptr, credit)

    def set_drain(self, drain: bool) -> None:
        """Set or clear the drain flag the next flow carries (without granting credit)."""
        if self.ptr is not None:
            lib.pn_link_set_drain(self.ptr, drain)


class Delivery:
    """One message transfer.  Valid until settled (here or, for sends, as the engine sees it) or
    until its link goes; afterwards `ptr` is None and its methods do nothing."""

    __slots__ = ("ptr", "link", "context")

    def __init__(self, pointer: Any, link: Link):
        self.ptr = pointer
        self.link = link
        self.context: Any = None

    @property
    def tag(self) -> bytes:
        raw = lib.pn_delivery_tag(self.ptr)
        return ffi.buffer(raw.start, raw.size)[:]

    @property
    def raw_tag(self) -> Any:
        """proton's `pn_bytes_t` of the tag: pass it to `Sender.send(tag=...)` while this delivery lives."""
        return lib.pn_delivery_tag(self.ptr)

    @property
    def remote_state(self) -> int:
        return lib.pn_delivery_remote_state(self.ptr) if self.ptr is not None else 0

    @property
    def remote_settled(self) -> bool:
        return bool(lib.pn_delivery_settled(self.ptr)) if self.ptr is not None else True

    @property
    def remote_condition(self) -> Condition | None:
        return condition_of(lib.pn_disposition_condition(lib.pn_delivery_remote(self.ptr))) \
            if self.ptr is not None else None

    @property
    def remote_failed(self) -> bool:
        return bool(lib.pn_disposition_is_failed(lib.pn_delivery_remote(self.ptr))) if self.ptr is not None else False

    @property
    def remote_undeliverable(self) -> bool:
        return bool(lib.pn_disposition_is_undeliverable(lib.pn_delivery_remote(self.ptr))) \
            if self.ptr is not None else False

    @property
    def remote_annotations(self) -> Any:
        return read_data(lib.pn_disposition_annotations(lib.pn_delivery_remote(self.ptr)))[0] \
            if self.ptr is not None else None

    def accept(self, settle: bool = True) -> None:
        self.update(ACCEPTED, settle)

    def release(self, settle: bool = True) -> None:
        self.update(RELEASED, settle)

    def reject(self, condition: Condition | tuple | None = None, settle: bool = True) -> None:
        if self.ptr is not None:
            set_disposition(self.ptr, REJECTED, condition=condition)
            if settle:
                self.settle()

    def modify(self, *, failed: bool = True, undeliverable: bool = False, annotations: dict | None = None,
               settle: bool = True) -> None:
        if self.ptr is not None:
            set_disposition(self.ptr, MODIFIED, failed=failed, undeliverable=undeliverable, annotations=annotations)
            if settle:
                self.settle()

    def update(self, state: int, settle: bool = True) -> None:
        if self.ptr is None:
            return
        lib.pn_delivery_update(self.ptr, state)
        if settle:
            self.settle()

    def settle(self) -> None:
        pointer = self.ptr
        if pointer is None:
            return
        self.ptr = None
        self.link.unsettled.pop(pointer, None)
        lib.pn_delivery_settle(pointer)

    def __repr__(self) -> str:
        return f"<Delivery on {self.link.name!r}{' settled' if self.ptr is None else ''}>"


# --------------------------------------------------------------------------------------------------
# Timers


class Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]):
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: Timer) -> bool:
        return self.when < other.when


# --------------------------------------------------------------------------------------------------
# The engine


class SaslClient(NamedTuple):
    """Client-side SASL for an outgoing connection (proton's own SASL layer)."""

    mechanisms: str = "PLAIN ANONYMOUS"  # space-separated, proton's syntax
    user: str | None = None
    password: str | None = None


class Engine:
    """The collector, the pointer-keyed objects and the timer heap of a set of connections."""

    def __init__(self, *, container_id: str | None = None, clock: Callable[[], float] = time.monotonic):
        self.container_id = container_id or f"broker-filter-{uuid.uuid4()}"
        self.clock = clock
        self.collector = lib.pn_collector()
        self.connections: dict[Any, Connection] = {}
        self.sessions: dict[Any, Session] = {}
        self.links: dict[Any, Link] = {}
        self.dirty: set[Connection] = set()  # connections whose transport has output to encode
        self._timers: list[Timer] = []
        self._to_free: list[Any] = []
        # endpoints freed before the collector handed over their events (a session never opened):
        # those events must not adopt them again (the address is reused once they are drained)
        self._freed: set[Any] = set()
        # link pointer -> its `LinkHandler` (`Link.handler`): its PN_DELIVERY events go to
        # `.transfer(delivery pointer)` straight from `process`, the per-message path
        self.link_handlers: dict[Any, LinkHandler] = {}
        self._buffer = bytearray(64 * 1024)
        self._cbuffer = ffi.from_buffer(self._buffer)
        self._view = memoryview(self._buffer)
        self._obuffer = bytearray(64 * 1024)
        self._cobuffer = ffi.from_buffer(self._obuffer)
        self._oview = memoryview(self._obuffer)
        self._dispatch = {
            lib.PN_CONNECTION_REMOTE_OPEN: self._on_connection_remote_open,
            lib.PN_CONNECTION_LOCAL_OPEN: self._on_connection_local_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self._on_connection_remote_close,
            lib.PN_SESSION_INIT: self._on_session_init,
            lib.PN_SESSION_REMOTE_OPEN: self._on_session_remote_open,
            lib.PN_SESSION_REMOTE_CLOSE: self._on_session_remote_close,
            lib.PN_SESSION_LOCAL_CLOSE: self._on_session_local_close,
            lib.PN_LINK_INIT: self._on_link_init,
            lib.PN_LINK_REMOTE_OPEN: self._on_link_remote_open,
            lib.PN_LINK_REMOTE_CLOSE: self._on_link_remote_close,
            lib.PN_LINK_REMOTE_DETACH: self._on_link_remote_close,
            lib.PN_LINK_LOCAL_CLOSE: self._on_link_local_close,
            lib.PN_LINK_LOCAL_DETACH: self._on_link_local_close,
            lib.PN_LINK_FLOW: self._on_link_flow,
            lib.PN_DELIVERY: self._on_delivery,
            lib.PN_TRANSPORT_ERROR: self._on_transport_error,
            lib.PN_TRANSPORT_CLOSED: self._on_transport_closed,
        }

    # ---------------------------------------------------------------------------------------------
    # connections

    def connection(self, handler: Handler, *, server: bool, sasl: SaslClient | None = None,
                   idle_timeout: float = 0.0, max_frame: int = 0, identity: Any = None,
                   name: str = "") -> Connection:
        """A new connection, its transport bound.  Server side: no SASL layer in proton (the
        listener runs SASL before the first byte reaches proton).  Client side: proton's SASL when
        `sasl` is given (set before the transport is bound, as proton requires)."""
        connection = Connection(self, handler, server=server, identity=identity, name=name)
        transport = connection.transport
        if server:
            lib.pn_transport_set_server(transport)
        elif sasl is not None:
            pn_sasl = lib.pn_sasl(transport)
            lib.pn_sasl_allowed_mechs(pn_sasl, sasl.mechanisms.encode())
            lib.pn_sasl_set_allow_insecure_mechs(pn_sasl, True)  # TLS is ours, not proton's
            if sasl.user is not None:
                lib.pn_connection_set_user(connection.ptr, sasl.user.encode())
            if sasl.password is not None:
                lib.pn_connection_set_password(connection.ptr, sasl.password.encode())
        if idle_timeout:
            lib.pn_transport_set_idle_timeout(transport, int(idle_timeout * 1000))
        if max_frame:
            lib.pn_transport_set_max_frame(transport, max_frame)
        lib.pn_connection_collect(connection.ptr, self.collector)
        lib.pn_transport_bind(transport, connection.ptr)
        self.connections[connection.ptr] = connection
        return connection

    def push(self, connection: Connection, data: Any, size: int | None = None) -> int:
        """Give received bytes to the transport: how many it took (-1: it takes no more)."""
        if connection.ptr is None:
            return -1
        taken = lib.pn_transport_push(connection.transport, data, len(data) if size is None else size)
        self.dirty.add(connection)
        return taken

    def take_output(self, connection: Connection) -> memoryview | None:
        """The bytes the transport has to send (one pending/peek/pop), valid until the next call;
        None when its output is closed for good."""
        transport = connection.transport
        if connection.ptr is None:
            return None
        pending = lib.pn_transport_pending(transport)
        if pending < 0:
            return None
        if pending == 0:
            return self._oview[:0]
        if pending > len(self._obuffer):
            self._obuffer = bytearray(max(pending, 2 * len(self._obuffer)))
            self._cobuffer = ffi.from_buffer(self._obuffer)
            self._oview = memoryview(self._obuffer)
        lib.pn_transport_peek(transport, self._cobuffer, pending)
        lib.pn_transport_pop(transport, pending)
        return self._oview[:pending]

    def close_input(self, connection: Connection) -> None:
        """The peer sent its last byte."""
        if connection.ptr is not None:
            lib.pn_transport_close_tail(connection.transport)
            self.dirty.add(connection)

    def abort(self, connection: Connection, error: Condition | None = None) -> None:
        """The bytes stopped both ways (socket error, refusal): the transport closes."""
        if connection.ptr is None:
            return
        if error is not None and connection.error is None:
            connection.error = error
            # on the transport too, where proton's own handlers look (proton then reports a
            # transport error, as for a failure it detects itself)
            set_condition(lib.pn_transport_condition(connection.transport), error)
        lib.pn_transport_close_tail(connection.transport)
        lib.pn_transport_close_head(connection.transport)
        self.dirty.add(connection)

    # ---------------------------------------------------------------------------------------------
    # timers

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        heapq.heappush(self._timers, timer)
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.clock() + delay, callback)

    def next_deadline(self) -> float | None:
        timers = self._timers
        while timers and timers[0].cancelled:
            heapq.heappop(timers)
        return timers[0].when if timers else None

    def run_timers(self, now: float | None = None) -> int:
        """Run the timers that are due; how many ran."""
        now = self.clock() if now is None else now
        ran = 0
        timers = self._timers
        while timers and timers[0].when <= now:
            timer = heapq.heappop(timers)
            if not timer.cancelled:
                timer.cancelled = True
                try:
                    timer.callback()
                except Exception:  # noqa: BLE001 - one failing timer must not stop the loop
                    log.exception("timer callback %r failed", timer.callback)
                ran += 1
        return ran

    def tick(self, connection: Connection) -> None:
        """Tick the connection's transport now and schedule the next tick at its deadline."""
        if connection.ptr is None:
            return
        if connection._tick_timer is not None:
            connection._tick_timer.cancel()
            connection._tick_timer = None
        now = self.clock()
        deadline = lib.pn_transport_tick(connection.transport, int(now * 1000))
        self.dirty.add(connection)
        if deadline:
            connection._tick_timer = self.call_at(deadline / 1000, lambda: self.tick(connection))

    # ---------------------------------------------------------------------------------------------
    # events

    @property
    def quiesced(self) -> bool:
        """No event is waiting in the collector (`process` would handle none)."""
        return lib.pn_collector_peek(self.collector) == NULL

    def process(self) -> int:
        """Drain the collector, calling the handlers; how many events there were."""
        collector = self.collector
        dispatch = self._dispatch
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        event_connection = lib.pn_event_connection
        link_handlers, event_link = self.link_handlers, lib.pn_event_link
        connections, dirty = self.connections, self.dirty
        count = 0
        while True:
            event = peek(collector)
            if event == NULL:
                break
            count += 1
            kind = event_type(event)
            if kind == _TRANSPORT:  # (several a message: the engine's alone, handled here)
                connection = connections.get(event_connection(event))
                if connection is not None:
                    dirty.add(connection)
                pop(collector)
                continue
            if kind == _DELIVERY and link_handlers:  # (one a message: a link handler's, straight there)
                handler = link_handlers.get(event_link(event))
                if handler is not None:
                    try:
                        handler.transfer(lib.pn_event_delivery(event))
                    except Exception:  # noqa: BLE001 - as the daemon's boundaries do: log, fail the link
                        try:
                            handler.failed()  # (it logs the exception, with what it knows of the link)
                        except Exception:  # noqa: BLE001
                            log.exception("handling a failed delivery failed")
                    pop(collector)
                    continue
            method = dispatch.get(kind)
            if method is not None:
                try:
                    method(event)
                except Exception:  # noqa: BLE001 - one failing handler must not stop the loop
                    self._handler_failed(event)
            pop(collector)
        if self._to_free:
            self._free_pending()
        if self._freed:
            self._freed.clear()
        return count

    def _handler_failed(self, event: Any) -> None:
        """A handler raised: log it, close the link concerned (else its connection) with
        amqp:internal-error; everything else goes on."""
        kind = _text(lib.pn_event_type_name(lib.pn_event_type(event))) or "event"
        log.exception("handling %s failed", kind)
        condition = Condition("amqp:internal-error", f"handling {kind} failed")
        link = self.links.get(lib.pn_event_link(event))
        if link is not None:
            link.close(condition)
            return
        connection = self.connections.get(lib.pn_event_connection(event))
        if connection is not None:
            connection.close(condition)

    def _on_connection_remote_open(self, event: Any) -> None:
        connection = self.connections.get(lib.pn_event_connection(event))
        if connection is not None:
            connection.handler.on_connection_open(connection)
            self.tick(connection)  # the peer's idle timeout is known now

    def _on_connection_local_open(self, event: Any) -> None:
        connection = self.connections.get(lib.pn_event_connection(event))
        if connection is not None:
            self.tick(connection)

    def _on_connection_remote_close(self, event: Any) -> None:
        connection = self.connections.get(lib.pn_event_connection(event))
        if connection is not None:
            if connection.error is None:
                connection.error = connection.remote_condition
            connection.handler.on_connection_close(connection)

    def _adopt_session(self, pointer: Any, connection: Connection | None = None) -> Session | None:
        session = self.sessions.get(pointer)
        if session is None:
            if pointer in self._freed:
                return None
            connection = connection or self.connections.get(lib.pn_session_connection(pointer))
            if connection is None:
                return None
            session = Session(pointer, connection)
            self.sessions[pointer] = session
            connection.sessions.add(session)
        return session

    def _adopt_link(self, pointer: Any) -> Link | None:
        link = self.links.get(pointer)
        if link is None:
            if pointer in self._freed:
                return None
            session = self._adopt_session(lib.pn_link_session(pointer))
            if session is None:
                return None
            link = (Sender if lib.pn_link_is_sender(pointer) else Receiver)(pointer, session)
            self.links[pointer] = link
            session.links.add(link)
        return link

    def _on_session_init(self, event: Any) -> None:
        self._adopt_session(lib.pn_event_session(event))

    def _on_session_remote_open(self, event: Any) -> None:
        session = self.sessions.get(lib.pn_event_session(event))
        if session is not None:
            session.connection.handler.on_session_open(session)

    def _on_session_remote_close(self, event: Any) -> None:
        session = self.sessions.get(lib.pn_event_session(event))
        if session is not None:
            session.connection.handler.on_session_close(session)
            self._free_if_done(session)

    def _on_session_local_close(self, event: Any) -> None:
        session = self.sessions.get(lib.pn_event_session(event))
        if session is not None:
            self._free_if_done(session)

    def _on_link_init(self, event: Any) -> None:
        self._adopt_link(lib.pn_event_link(event))

    def _on_link_remote_open(self, event: Any) -> None:
        link = self.links.get(lib.pn_event_link(event))
        if link is not None:
            (link._handler or link.connection.handler).on_link_open(link)

    def _on_link_remote_close(self, event: Any) -> None:
        link = self.links.get(lib.pn_event_link(event))
        if link is not None:
            (link._handler or link.connection.handler).on_link_close(link)
            self._free_if_done(link)

    def _on_link_local_close(self, event: Any) -> None:
        link = self.links.get(lib.pn_event_link(event))
        if link is not None:
            self._free_if_done(link)

    def _on_link_flow(self, event: Any) -> None:
        link = self.links.get(lib.pn_event_link(event))
        if link is not None:
            (link._handler or link.connection.handler).on_flow(link)

    def _on_delivery(self, event: Any) -> None:
        pointer = lib.pn_event_delivery(event)
        link = self.links.get(lib.pn_delivery_link(pointer))
        if link is None:
            return
        delivery = link.unsettled.get(pointer)
        if delivery is not None or link.is_sender:
            if delivery is not None:
                (link._handler or link.connection.handler).on_delivery_update(delivery)
            return
        if lib.pn_delivery_aborted(pointer):
            if lib.pn_link_current(link.ptr) == pointer:
                lib.pn_link_advance(link.ptr)
            lib.pn_delivery_settle(pointer)
            return
        if lib.pn_delivery_partial(pointer) or not lib.pn_delivery_readable(pointer):
            return  # the rest of the message has not arrived yet
        size = lib.pn_delivery_pending(pointer)
        if size > len(self._buffer):
            self._buffer = bytearray(max(size, 2 * len(self._buffer)))
            self._cbuffer = ffi.from_buffer(self._buffer)
            self._view = memoryview(self._buffer)
        received = lib.pn_link_recv(link.ptr, self._cbuffer, size)
        lib.pn_link_advance(link.ptr)
        delivery = Delivery(pointer, link)
        settled = lib.pn_delivery_settled(pointer)
        if not settled:
            link.unsettled[pointer] = delivery
        (link._handler or link.connection.handler).on_message(delivery, self._view[:max(received, 0)])
        if settled and delivery.ptr is not None:
            delivery.settle()

    def _on_transport_error(self, event: Any) -> None:
        connection = self.connections.get(lib.pn_event_connection(event))
        if connection is not None and connection.error is None:
            connection.error = condition_of(lib.pn_transport_condition(connection.transport))

    def _on_transport_closed(self, event: Any) -> None:
        connection = self.connections.get(lib.pn_event_connection(event))
        if connection is not None:
            self.finish(connection)

    # ---------------------------------------------------------------------------------------------
    # freeing

    def _free_if_done(self, endpoint: Session | Link) -> None:
        if endpoint.ptr is not None and endpoint.local_state == LOCAL_CLOSED and endpoint.remote_closed:
            self._to_free.append(endpoint)

    def _free_pending(self) -> None:
        pending, self._to_free = self._to_free, []
        for endpoint in pending:
            pointer = endpoint.ptr
            if pointer is None:
                continue
            if isinstance(endpoint, Link):
                self._forget_link(endpoint)
                lib.pn_link_free(pointer)
            else:
                self._free_session(endpoint)

    def _free_session(self, session: Session) -> None:
        pointer = session.ptr
        self._freed.add(pointer)
        for link in list(session.links):
            self._freed.add(link.ptr)
            self._forget_link(link)
        self.sessions.pop(pointer, None)
        session.connection.sessions.discard(session)
        session.ptr = None
        lib.pn_session_free(pointer)

    def _forget_link(self, link: Link) -> None:
        for delivery in link.unsettled.values():
            delivery.ptr = None
        link.unsettled.clear()
        self.links.pop(link.ptr, None)
        self.link_handlers.pop(link.ptr, None)  # before proton can reuse the address
        link._handler = None  # (a link handler refers to its link: no cycle left for the collector)
        link.session.links.discard(link)
        link.ptr = None

    def finish(self, connection: Connection) -> None:
        """The transport is closed: tell the handler, forget every object of the connection and
        release proton's memory (proton frees it once the collector's events let go of it)."""
        if connection.ptr is None:
            return
        if connection._tick_timer is not None:
            connection._tick_timer.cancel()
        if connection.error is None:
            connection.error = condition_of(lib.pn_transport_condition(connection.transport))
        connection.closed = True
        try:
            connection.handler.on_disconnected(connection, connection.error)
        finally:
            for session in list(connection.sessions):
                for link in list(session.links):
                    self._forget_link(link)
                self.sessions.pop(session.ptr, None)
                session.ptr = None
            connection.sessions.clear()
            self.connections.pop(connection.ptr, None)
            self.dirty.discard(connection)
            pointer, transport = connection.ptr, connection.transport
            connection.ptr = None
            lib.pn_transport_unbind(transport)
            lib.pn_decref(transport)
            lib.pn_connection_release(pointer)  # the endpoint's own count (its sessions and links go)
            lib.pn_decref(pointer)  # and the object reference pn_connection() gave: without it, it stays
            if connection.io is not None:
                connection.io.transport_closed()

    def release(self) -> None:
        """Free the collector (after every connection finished)."""
        if self.collector is not None:
            lib.pn_collector_release(self.collector)
            self.collector = None
