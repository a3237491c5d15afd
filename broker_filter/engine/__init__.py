"""The AMQP I/O engine: proton-c's connection engine driven from the project's own event loop.

    endpoints  Engine, Connection, Session, Sender, Receiver, Delivery, Terminus, Handler,
               LinkHandler (a link's own handler: its transfers straight from the engine) (no I/O)
    loop       EventLoop: one epoll loop owning every socket, timers, a thread-safe wake-up
    streams    TLS (ssl memory BIOs) and the server's SASL exchange in front of a transport
    memory     pump(): two connections joined in memory, for tests
    container  EngineContainer: the daemon's proton handlers on the loop

Needs python-qpid-proton >=0.40,<0.41 (its cffi module `cproton_ffi`), checked at import.
"""

from .endpoints import (
    ACCEPTED,
    MODIFIED,
    REJECTED,
    RELEASED,
    Condition,
    Connection,
    Delivery,
    Engine,
    Handler,
    Link,
    LinkHandler,
    Receiver,
    SaslClient,
    Sender,
    Session,
    Terminus,
)

__all__ = [
    "ACCEPTED",
    "MODIFIED",
    "REJECTED",
    "RELEASED",
    "Condition",
    "Connection",
    "Delivery",
    "Engine",
    "Handler",
    "Link",
    "LinkHandler",
    "Receiver",
    "SaslClient",
    "Sender",
    "Session",
    "Terminus",
]
