"""The per-message path shared by both sides of the proxy, on proton-c pointers: receiving and
sending a message's bytes, delivery dispositions <-> `Outcome`."""

from __future__ import annotations

from typing import Any

from ..amqp import types as t
from ..engine._cproton import ffi, lib
from ..engine.endpoints import condition_of, read_data, set_disposition
from .forwarding import ACCEPTED, RELEASED, Outcome


# --------------------------------------------------------------------------------------------------
# The per-message path on raw proton-c pointers (a link's `LinkHandler.transfer`): no wrapper built.
# A delivery pointer is valid until it is settled here or its link goes (see engine/endpoints.py).

_ACCEPTED_STATE, _REJECTED_STATE, _RELEASED_STATE, _MODIFIED_STATE = (
    lib.PN_ACCEPTED, lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED)
_STATES = {"accepted": _ACCEPTED_STATE, "rejected": _REJECTED_STATE, "released": _RELEASED_STATE,
           "modified": _MODIFIED_STATE}


class _Buffer:
    """The buffer `receive` reads messages into (grown for a larger one)."""

    def __init__(self, size: int):
        self.data = bytearray(size)
        self.c = ffi.from_buffer(self.data)

    def fit(self, size: int) -> None:
        if size > len(self.data):
            self.__init__(max(size, 2 * len(self.data)))  # type: ignore[misc]


_RECEIVED = _Buffer(64 * 1024)


def receive(link: Any, delivery: Any) -> bytes | None:
    """The complete message of `delivery` on receiving `link` (pointers), the link advanced; None
    while it is partial."""
    if not lib.pn_delivery_readable(delivery) or lib.pn_delivery_partial(delivery):
        return None
    size = lib.pn_delivery_pending(delivery)
    buffer = _RECEIVED
    if size > len(buffer.data):
        buffer.fit(size)
    received = lib.pn_link_recv(link, buffer.c, size)
    lib.pn_link_advance(link)
    return ffi.unpack(buffer.c, received) if received > 0 else b""


def discard(link: Any) -> None:
    """Read and drop what has arrived of the current delivery on receiving `link` (a pointer)."""
    buffer = _RECEIVED
    while lib.pn_link_recv(link, buffer.c, len(buffer.data)) > 0:
        pass


def send(link: Any, tag: bytes, data: bytes, settled: bool = False) -> Any:
    """Send one encoded message on sending `link` (a pointer): the new delivery's pointer (settled
    at once when `settled`: then no longer to be used)."""
    delivery = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
    lib.pn_link_send(link, data, len(data))
    if settled:
        lib.pn_delivery_settle(delivery)
    lib.pn_link_advance(link)
    return delivery


def remote_outcome(delivery: Any) -> Outcome | None:
    """The Outcome of a delivery's remote state (a pointer), or None if it is not a terminal state."""
    state = lib.pn_delivery_remote_state(delivery)
    if state == _ACCEPTED_STATE:
        return ACCEPTED
    if state == _RELEASED_STATE:
        return RELEASED
    if state == _REJECTED_STATE:
        condition = condition_of(lib.pn_disposition_condition(lib.pn_delivery_remote(delivery)))
        return Outcome("rejected", error=(condition.name, condition.description or None) if condition else None)
    if state == _MODIFIED_STATE:
        remote = lib.pn_delivery_remote(delivery)
        annotations, _ = read_data(lib.pn_disposition_annotations(remote))
        return Outcome("modified", delivery_failed=bool(lib.pn_disposition_is_failed(remote)),
                       undeliverable_here=bool(lib.pn_disposition_is_undeliverable(remote)),
                       annotations=dict(annotations) if isinstance(annotations, dict) and annotations else None)
    return None


def settle_with(delivery: Any, outcome: Outcome) -> None:
    """Set `outcome` as the delivery's local state (a pointer) and settle it."""
    if outcome is ACCEPTED or outcome is RELEASED:
        lib.pn_delivery_update(delivery, _STATES[outcome.kind])
    else:
        set_disposition(delivery, _STATES[outcome.kind], condition=outcome.error,
                        failed=outcome.delivery_failed, undeliverable=outcome.undeliverable_here,
                        annotations={t.symbol(k) if isinstance(k, str) else k: v
                                     for k, v in outcome.annotations.items()} if outcome.annotations else None)
    lib.pn_delivery_settle(delivery)


def read(owner: Any, dlv: Any) -> bytes | None:
    """The whole message of a client's transfer (a delivery pointer) on `owner`'s link (a `SenderLink` or
    a `Relay`), or None when there is nothing to publish yet: a part of one (dropped as it arrives
    once over `limits.max_message_size`), an aborted one (settled), or one too large (rejected)."""
    if not lib.pn_delivery_readable(dlv):
        return None
    limit = owner.server.max_message_size
    unfinished = owner.conn.unfinished
    if lib.pn_delivery_partial(dlv):
        if limit and lib.pn_delivery_pending(dlv) > limit:
            # Too large already: drop what arrived (memory stays bounded), refuse once complete.
            discard(owner.ptr)
            owner.oversize.add(dlv)
            unfinished.done(owner, dlv)
        elif dlv not in owner.oversize and unfinished.over(owner, dlv):
            # The connection's messages in transfer hold too much: this one is dropped as it arrives.
            discard(owner.ptr)
            owner.oversize.add(dlv)
            unfinished.dropped(owner, dlv)
        return None
    size = lib.pn_delivery_pending(dlv)
    data = receive(owner.ptr, dlv)
    crowded = unfinished.done(owner, dlv) if unfinished.pending else False
    if lib.pn_delivery_aborted(dlv):
        owner.oversize.discard(dlv)
        lib.pn_delivery_settle(dlv)
        return None
    if (limit and size > limit) or (owner.oversize and dlv in owner.oversize):
        owner.oversize.discard(dlv)
        why = (f"the client's messages in transfer on this connection were over {unfinished.limit} bytes "
               "(limits.unfinished_bytes): this one was dropped as it arrived; send it again" if crowded else
               f"message larger than the {limit} bytes allowed (limits.max_message_size)")
        settle_with(dlv, Outcome("rejected", error=("amqp:resource-limit-exceeded", why)))
        owner.top_up()
        return None
    return data
