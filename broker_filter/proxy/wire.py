"""Proton-side conversions shared by both sides of the proxy: terminus data (filter-sets,
capabilities) <-> typed values of `broker_filter.amqp.types` (through `broker_filter.amqp`, so a
value keeps its AMQP type both ways), and delivery dispositions <-> `Outcome`."""

from __future__ import annotations

from typing import Any

from proton import Condition, Delivery, Disposition
from proton import symbol as psymbol

from ..amqp import decode, encode
from .forwarding import ACCEPTED, RELEASED, Outcome

_OUTCOME_KINDS = {
    Disposition.ACCEPTED: "accepted",
    Disposition.REJECTED: "rejected",
    Disposition.RELEASED: "released",
    Disposition.MODIFIED: "modified",
}
_DISPOSITIONS = {v: k for k, v in _OUTCOME_KINDS.items()}


def data_value(data) -> Any:
    """A proton Data (terminus filter/capabilities) as typed values of `broker_filter.amqp.types`."""
    raw = data.encode() if data is not None else b""
    if not raw:
        return None
    value, _ = decode(raw, 0)
    return value


def put_value(data, value: Any) -> None:
    """Write a typed value into a proton Data (replacing its content)."""
    data.clear()
    if value is not None:
        data.decode(encode(value))


def outcome_of_delivery(delivery: Delivery) -> Outcome | None:
    """The Outcome of a delivery's remote state, or None if it is not a terminal state."""
    state = delivery.remote_state
    if state == Disposition.ACCEPTED:
        return ACCEPTED
    if state == Disposition.RELEASED:
        return RELEASED
    if state in _OUTCOME_KINDS:
        return outcome_of(delivery.remote)
    return None


def outcome_of(disposition) -> Outcome | None:
    """The Outcome a remote disposition carries, or None if it is not a terminal state."""
    kind = _OUTCOME_KINDS.get(disposition.type)
    if kind is None:
        return None
    if kind == "rejected":
        c = disposition.condition
        return Outcome("rejected", error=(c.name, c.description) if c is not None else None)
    if kind == "modified":
        return Outcome(
            "modified",
            delivery_failed=bool(disposition.failed),
            undeliverable_here=bool(disposition.undeliverable),
            annotations=dict(disposition.annotations) if disposition.annotations else None,
        )
    return Outcome(kind)


def apply_outcome(delivery: Delivery, outcome: Outcome) -> None:
    """Set the outcome as the delivery's local state and settle it."""
    if outcome is ACCEPTED or outcome is RELEASED:  # the common cases: no fields to set
        delivery.update(_DISPOSITIONS[outcome.kind])
        delivery.settle()
        return
    local = delivery.local
    if outcome.kind == "rejected" and outcome.error is not None:
        local.condition = Condition(outcome.error[0], outcome.error[1])
    elif outcome.kind == "modified":
        local.failed = outcome.delivery_failed
        local.undeliverable = outcome.undeliverable_here
        if outcome.annotations:
            local.annotations = {psymbol(str(k)) if isinstance(k, str) else k: v for k, v in outcome.annotations.items()}
    delivery.update(_DISPOSITIONS[outcome.kind])
    delivery.settle()
