"""What the proxy keeps on each client connection and link: plain slotted records, a leaf module.

`ClientConnection` is a client `Connection.context`, `ClientLink` a client `Link.context` (what was
asked and permitted, and the parts serving it; the link's object, which gets its events, is its
`Link.handler`: `links`), `Placement` what a receiving link asked for.  They import nothing of the
proxy's (the modules that act on them — the server, `management`, `topology` — import this one,
never each other for a record)."""

from __future__ import annotations

from typing import Any


class ClientConnection:
    """What the proxy keeps on each client connection (`Connection.context`)."""

    __slots__ = ("id", "links", "producers", "closed", "peer", "connection", "management_calls", "identity",
                 "unfinished")

    def __init__(self, id: str, connection: Any = None, identity: Any = None):
        self.id = id
        self.links: set = set()
        self.producers: set = set()  # the links of `links` a client sends on (an inlet or a relay)
        self.closed = False
        self.peer: str | None = None  # the replica that opened it (`[replicas]`), else None
        self.connection = connection
        self.management_calls: Any = None  # its /management requests in flight (`management._Calls`)
        self.identity = identity  # who logged in (`security.Identity`), None when unknown
        self.unfinished: Any = None  # its messages in transfer, not complete yet (`quotas.Unfinished`)

    @property
    def user(self) -> str | None:
        return self.identity.user if self.identity is not None else None


class ClientLink:
    """What the proxy keeps on each client link (`Link.context`)."""

    __slots__ = ("outlet", "inlet", "relay", "place", "fs", "subscription", "unsubscribe", "unsubscribe_queue",
                 "pair", "peer", "unsettled", "operation", "address")

    def __init__(self) -> None:
        self.outlet: Any = None  # a receiving link's place on its feed (`forwarding.Outlet`)
        self.inlet: Any = None  # a sending link's object (`sender.SenderLink`, a `replies.ReplyInlet`)
        self.relay: Any = None  # ... or its anonymous relay's (`sender.Relay`)
        self.place: Placement | None = None
        self.fs: Any = None  # its filter-set as attached
        self.subscription = False
        self.unsubscribe: str | None = None  # the kept durable subscription a null-source attach names
        self.unsubscribe_queue: str | None = None  # ... or the queue on the broker holding it (`topology`)
        # a link served by an object of its own (a /management link: its `management.ManagementPair`; a
        # reply address's receiver: its `replies.ReplyNode`): it gets the link's flow (`links.ServedLink`)
        # and its end
        self.pair: Any = None
        self.peer: Any = None  # ... and its upstream link
        self.unsettled: dict | None = None  # ... and the deliveries relayed on it -> their origins
        # what the link was permitted as (`authorization`): checked again when the permissions change
        self.operation: str | None = None
        self.address: str | None = None


_NO_STATE = ClientLink()  # what a link the proxy keeps nothing on reads as


def link_state(link: Any) -> ClientLink:
    """The proxy's record of a client link (made on first use)."""
    state = link.context
    if state is None:
        state = link.context = ClientLink()
    return state


def state_of(link: Any) -> ClientLink:
    """The proxy's record of a client link, or an empty one (never made here)."""
    state = link.context if link is not None else None
    return state if state is not None else _NO_STATE


def connection_state(conn: Any) -> ClientConnection | None:
    return conn.context if conn is not None else None


def links_of(conn: Any) -> list:
    """Every link of a client connection, over its sessions (a copy)."""
    return [link for session in list(conn.sessions) for link in list(session.links)]


class Placement:
    """What a client's receiving link asked for, kept to serve it again on another upstream (a
    queue whose owner changed, see `rehoming.Rehoming.rehome`)."""

    __slots__ = ("routed", "wanted", "decision", "caps", "routing_type", "browse", "owned")

    def __init__(self, routed, wanted, decision, caps, routing_type, browse, owned):
        self.routed = routed
        self.wanted = wanted
        self.decision = decision
        self.caps = caps
        self.routing_type = routing_type
        self.browse = browse
        self.owned = owned  # a queue link served by the queue's owner (`[replicas]`)
