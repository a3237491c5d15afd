"""Replicas: several daemons in front of one broker, one owner per queue (`[replicas]`).

Theory of operation.  Every replica is configured with the same list of peers (`replicas.peers`,
the `HOST:PORT` of each one's AMQP listener) and its own place in it (`replicas.self`).  Each keeps
an AMQP connection to every other peer (a `RemoteUpstream`, reconnecting at most a second apart,
with an idle timeout of `replicas.heartbeat`), opened with the property `broker-filter-replica`.  A
peer is live while that connection is open; the replica itself is live until it drains.  A peer
whose own upstream is down closes its peer connections and refuses new ones, so it is not live
either, and a peer that drains (SIGTERM) detaches every link with `amqp:connection:forced`: it
counts as gone from then on, until its connection opens again.

With `listener.tls` on, the peer connections speak TLS too (`replicas.tls`, the context made by
`security.replica_ssl_context`, hardened as the listener is): each peer's certificate is checked
against `replicas.tls.ca_file` (else the listener's CA file) and must carry the peer's host as
`replicas.peers` names it (or `replicas.tls.server_name`; with `replicas.dns`, its NAME).  A peer
whose certificate does not verify never opens, so it is never live; why is logged as a warning
naming the peer, again when the reason changes and otherwise at most once a `FAILURE_LOG` seconds
(with the count of attempts that failed alike in between).

The owner of a queue is the live peer with the highest weight `hash(peer, queue)` (rendezvous
hashing): every replica computes it alone, from the same list and the same liveness, and when a
peer leaves only the queues it owned move (each to the next highest weight), and only those it
owns come back when it returns.

A client link on a queue (not a subscription, a browser or a dynamic source) is served by the
owner: on the owner as in a single daemon; elsewhere through the peer connection to the owner,
which recognises a broker-filter upstream and takes the link's selector (chained daemons), so only
matching messages cross and only the owner consumes from the queue.  A link that comes over a peer
connection is always served where it lands: two replicas whose views differ for a moment never pass
a link back and forth; both consume from the queue then, as unowned replicas do.

When the owners change (a peer leaves, drains or comes back), every queue feed whose owner is now
another replica moves its links there (`Rehoming.rehome`): each link stays attached to its
client; what the old feed held goes back to the broker (as custody promises) and the deliveries
the client has not settled are given back too (the client's later outcome for one is ignored), so
they may come again: a duplicate, as on any reconnect.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import quote

from ..config import split_hostport
from .remote import RemoteUpstream
from .upstream import UpstreamListener

log = logging.getLogger("broker_filter.replicas")

PROPERTY = "broker-filter-replica"  # connection property naming the replica that opened it
RECONNECT = 1.0  # at most this long between attempts to reach a peer
# A peer counts as live once its connection has stayed open this long: one that opens and closes at
# once (its own upstream is down, see `ProxyServer.on_connection_remote_open`) never owns a queue.
SETTLE = 0.3
RESOLVE = 5.0  # `replicas.dns` is resolved this often
FAILURE_LOG = 60.0  # a peer that keeps failing alike is logged at most this often (`Replicas.failed`)


def normal(peer: str) -> str:
    """`HOST:PORT` as every replica writes it (the weights hash this text)."""
    host, port = split_hostport(peer)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def weight(peer: str, address: str) -> int:
    """The rendezvous weight of `peer` for `address`: the same in every replica."""
    return int.from_bytes(hashlib.blake2b(f"{peer}\n{address}".encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "big")


def owner_of(address: str, live: list[str]) -> str | None:
    """The owner of `address` among the live peers (None: none is)."""
    return max(live, key=lambda p: weight(p, address)) if live else None


class _Peer:
    def __init__(self, address: str):
        self.address = address
        self.upstream: RemoteUpstream | None = None
        self.leaving = False  # it detached our links as it drains: gone until it connects again
        self.settled = False  # its connection stayed open SETTLE seconds
        self.failure: str | None = None  # why the last attempts to connect failed (logged: `Replicas.failed`)
        self.failure_logged = 0.0  # when (monotonic) it was last logged
        self.failures = 0  # attempts that failed alike since

    @property
    def live(self) -> bool:
        return self.upstream is not None and self.upstream.connected and self.settled and not self.leaving


class _PeerListener(UpstreamListener):
    """`UpstreamListener` of one peer connection: its ups and downs change the owners."""

    def __init__(self, replicas: "Replicas", peer: _Peer):
        self.replicas = replicas
        self.peer = peer

    def on_upstream_failed(self, upstream: Any, error: Any) -> None:
        self.replicas.failed(self.peer, upstream, error)

    def on_upstream_up(self, upstream: Any) -> None:
        self.peer.failure = None
        connection = upstream.connection

        def settled() -> None:
            if upstream.connected and upstream.connection is connection and not self.replicas.stopping:
                log.info("replica %s is up", self.peer.address)
                self.peer.leaving = False
                self.peer.settled = True
                self.replicas.changed()

        self.replicas.loop.call_later(SETTLE, settled)

    def on_upstream_down(self, upstream: Any, error: Any) -> None:
        was = self.peer.settled
        self.peer.settled = False
        if was:
            log.warning("replica %s is gone", self.peer.address)
            self.replicas.changed()


class Replicas:
    """This replica's view of the others, and the owner of each queue."""

    def __init__(self, settings: Any, server: Any, *, tls: Any = None):
        self.self = normal(settings.self)
        self.server = server
        self.settings = settings
        # with `listener.tls`: the peers are reached over TLS with this `ssl.SSLContext`, their
        # certificates checked for `server_name` (None: each peer's own host)
        self.tls = tls
        self.server_name = (settings.tls.server_name or (split_hostport(settings.dns)[0] if settings.dns else None)
                            if tls is not None and settings.tls.verify != "peer" else None)
        self.heartbeat = settings.heartbeat
        self.peers = {p: _Peer(p) for p in map(normal, settings.peers) if p != self.self}
        self.stopping = False
        self.loop: Any = None
        self.changes = 0  # how often the owners were recomputed

    def start(self, loop: Any) -> None:
        self.loop = loop
        for peer in self.peers.values():
            self._connect(peer)
        if self.settings.dns:
            self._resolve()

    def _connect(self, peer: _Peer) -> None:
        user = self.settings.user
        login = f"{quote(user, safe='')}:{quote(self.settings.password, safe='')}@" if user else ""
        peer.upstream = RemoteUpstream(
            f"{'amqps' if self.tls is not None else 'amqp'}://{login}{peer.address}",
            max_backoff=RECONNECT,
            backoff=lambda attempt: min(RECONNECT, 0.1 * 2 ** attempt),
            heartbeat=self.settings.heartbeat,
            properties={PROPERTY: self.self},
            tls=self.tls,
            server_hostname=self.server_name,
        )
        peer.upstream.start(self.loop, _PeerListener(self, peer))

    def failed(self, peer: _Peer, upstream: Any, error: Any) -> None:
        """An attempt to connect to `peer` failed before its open (it is not live): a TLS failure or
        a refused login is logged as a warning, anything else (a peer not listening yet) at info;
        each when its reason is new, else at most once a FAILURE_LOG seconds."""
        if self.stopping or upstream is not peer.upstream:
            return
        description = error.description or ""  # (an `upstream.ErrorInfo`)
        why = description.split(" connection lost: ", 1)[1] if " connection lost: " in description else description
        why = why or error.condition or "closed"
        now = time.monotonic()
        if why == peer.failure and now - peer.failure_logged < FAILURE_LOG:
            peer.failures += 1
            return
        again = f" ({peer.failures} more attempts failed alike)" if why == peer.failure and peer.failures else ""
        peer.failure, peer.failure_logged, peer.failures = why, now, 0
        if "certificate verify failed" in why:
            log.warning("replica %s is not live: its TLS certificate does not verify (%s; replicas.tls.ca_file, "
                        "replicas.tls.verify and replicas.tls.server_name decide what is accepted)%s",
                        peer.address, why, again)
        elif "TLS failed" in why:
            log.warning("replica %s is not live: TLS with it failed (%s)%s", peer.address, why, again)
        elif "unauthorized" in why or "authentication" in why.lower():
            log.warning("replica %s is not live: it refused this replica's login (%s; replicas.user and "
                        "replicas.password)%s", peer.address, why, again)
        else:
            log.info("replica %s cannot be reached: %s%s", peer.address, why, again)

    # ---------------------------------------------------------------- replicas.dns
    def _resolve(self) -> None:
        """Look NAME up on a thread of its own (a slow resolver never stalls the loop); the loop
        picks the answer up (`_answered`)."""
        if self.stopping:
            return
        host, port = split_hostport(self.settings.dns)
        box: dict = {}

        def lookup() -> None:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                box["found"] = {normal(f"[{i[4][0]}]:{port}" if ":" in i[4][0] else f"{i[4][0]}:{port}")
                                for i in infos}
            except OSError as e:
                box["error"] = str(e)

        thread = threading.Thread(target=lookup, name="replicas-dns", daemon=True)
        thread.start()
        self.loop.call_later(0.1, lambda: self._answered(thread, box, 0.1))

    def _answered(self, thread: threading.Thread, box: dict, waited: float) -> None:
        if self.stopping:
            return
        if thread.is_alive():
            self.loop.call_later(0.1, lambda: self._answered(thread, box, waited + 0.1))
            return
        if "error" in box:
            log.warning("replicas.dns: %s does not resolve (%s); the replicas stay as they were",
                        self.settings.dns, box["error"])
        else:
            self.found(box["found"])
        self.loop.call_later(RESOLVE, self._resolve)

    def found(self, addresses: set[str]) -> None:
        """The replicas `replicas.dns` resolved to now: new ones are connected, gone ones dropped."""
        others = {a for a in addresses if a != self.self}
        added = sorted(others - set(self.peers))
        removed = sorted(set(self.peers) - others)
        if not added and not removed:
            return
        log.info("replicas.dns %s: %s", self.settings.dns,
                 "; ".join(filter(None, [f"new {', '.join(added)}" if added else "",
                                         f"gone {', '.join(removed)}" if removed else ""])))
        dropped = []
        for address in removed:
            peer = self.peers[address]
            dropped.append(peer)
            peer.leaving = True  # not live: its queues move first, then its connection goes
        if any(p.settled for p in dropped):
            self.changed()
        for peer in dropped:
            del self.peers[peer.address]
            if peer.upstream is not None:
                peer.upstream.stop()
        for address in added:
            peer = _Peer(address)
            self.peers[address] = peer
            self._connect(peer)  # live once connected (`_PeerListener`)

    def stop(self) -> None:
        self.stopping = True
        for peer in self.peers.values():
            if peer.upstream is not None:
                peer.upstream.stop()

    def closing(self) -> bool:
        return any(p.upstream is not None and p.upstream.closing() for p in self.peers.values())

    def live(self) -> list[str]:
        """The live replicas, this one first (while it does not drain)."""
        out = [] if self.stopping else [self.self]
        out.extend(p.address for p in self.peers.values() if p.live)
        return out

    def owner(self, address: str) -> str | None:
        return owner_of(address, self.live())

    def upstream_for(self, address: str) -> tuple[str | None, Any]:
        """(peer, its upstream) serving a queue link on `address`; (None, None): this replica."""
        owner = self.owner(address)
        if owner is None or owner == self.self:
            return None, None
        return owner, self.peers[owner].upstream

    def peer_leaving(self, address: str) -> None:
        """The peer detached a link with amqp:connection:forced: it drains."""
        peer = self.peers.get(address)
        if peer is not None and not peer.leaving:
            log.warning("replica %s is draining", address)
            peer.leaving = True
            self.changed()

    def changed(self) -> None:
        """The live replicas changed: feeds whose queue has another owner now move there."""
        self.changes += 1
        if self.server is not None:
            self.server.rehoming.owners_changed()

    def snapshot(self) -> dict:
        return {"self": self.self, "live": self.live(), "changes": self.changes}
