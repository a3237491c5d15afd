"""What one user or one source address may hold at once: connections, links, and the bytes of
messages still in transfer on one connection (`[limits]`).  Counts only, no I/O: the server asks
before it accepts, and tells when something goes.  A refusal names the limit and its setting."""

from __future__ import annotations

from typing import Any

from ..engine._cproton import lib


def source_address(identity: Any) -> str:
    """The client's address without its port ("host:port", "[v6]:port")."""
    peer = identity.peer if identity is not None else ""
    host = peer.rpartition(":")[0] if ":" in peer else peer
    return host.strip("[]") or "?"


def user_of(identity: Any) -> str:
    return (identity.user if identity is not None else None) or "anonymous"


class Quotas:
    """Connections per user and per source address, links per user (see `config.Limits`)."""

    def __init__(self, limits: Any):
        self.limits = limits
        self.by_user: dict[str, set] = {}  # user -> its client connections (records.ClientConnection)
        self.by_address: dict[str, int] = {}

    def refusal(self, identity: Any) -> str | None:
        """Why a new connection of `identity` is refused, or None (then `admitted` counts it)."""
        limits = self.limits
        user, address = user_of(identity), source_address(identity)
        if limits.connections_per_user and len(self.by_user.get(user, ())) >= limits.connections_per_user:
            return (f"user {user!r} has {limits.connections_per_user} connections open, the most one user may "
                    "(limits.connections_per_user)")
        if limits.connections_per_address and self.by_address.get(address, 0) >= limits.connections_per_address:
            return (f"{address} has {limits.connections_per_address} connections open, the most one source address "
                    "may (limits.connections_per_address)")
        return None

    def admitted(self, conn: Any) -> None:
        self.by_user.setdefault(user_of(conn.identity), set()).add(conn)
        address = source_address(conn.identity)
        self.by_address[address] = self.by_address.get(address, 0) + 1

    def gone(self, conn: Any) -> None:
        user = user_of(conn.identity)
        mine = self.by_user.get(user)
        if mine is not None and conn in mine:
            mine.discard(conn)
            if not mine:
                del self.by_user[user]
            address = source_address(conn.identity)
            left = self.by_address.get(address, 0) - 1
            if left > 0:
                self.by_address[address] = left
            else:
                self.by_address.pop(address, None)

    def link_refusal(self, conn: Any) -> str | None:
        """Why a new link on `conn` is refused by the user's link limit, or None."""
        limit = self.limits.links_per_user
        if not limit:
            return None
        user = user_of(conn.identity)
        held = sum(len(c.links) for c in self.by_user.get(user, ()))
        if held >= limit:
            return f"user {user!r} has {limit} links attached, the most one user may (limits.links_per_user)"
        return None


class Unfinished:
    """The bytes of a connection's messages in transfer, not yet complete ((link's owner, delivery
    pointer) -> bytes; a message dropped for the limit stays, at -1, until it completes).  A link that
    goes takes its entries with it (`forget`): a delivery pointer is not to be used after its link."""

    __slots__ = ("limit", "pending")

    def __init__(self, limit: int):
        self.limit = limit
        self.pending: dict = {}

    def over(self, owner: Any, dlv: Any) -> bool:
        """`dlv` is a part of a message: whether the connection's unfinished bytes are over the limit."""
        self.pending[owner, dlv] = lib.pn_delivery_pending(dlv)
        return bool(self.limit) and sum(n for n in self.pending.values() if n > 0) > self.limit

    def dropped(self, owner: Any, dlv: Any) -> None:
        self.pending[owner, dlv] = -1

    def done(self, owner: Any, dlv: Any) -> bool:
        """`dlv` is complete: True when it was dropped for the limit."""
        return self.pending.pop((owner, dlv), 0) == -1

    def forget(self, owner: Any) -> None:
        """`owner`'s link went, with its deliveries."""
        if self.pending:
            for key in [k for k in self.pending if k[0] is owner]:
                del self.pending[key]
