"""Per-link forwarding state, without I/O.

Theory of operation: the proxy's proton handlers feed events in (client credit, upstream
deliveries, client outcomes, detaches) and carry out the decisions that come back.  Everything here
is plain data and pure decisions so it can be tested without a network.

Outcomes are the AMQP 1.0 delivery outcomes, shared by both sides of the proxy: what the client
said about a delivery is applied unchanged to the upstream delivery it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """An AMQP 1.0 terminal delivery state.

    kind: "accepted" | "rejected" | "released" | "modified".
    `error` is (condition, description) for rejected; the modified fields follow the spec.
    """

    kind: str
    error: tuple[str, str | None] | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False
    annotations: dict[Any, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("accepted", "rejected", "released", "modified"):
            raise ValueError(f"not an AMQP outcome: {self.kind!r}")


ACCEPTED = Outcome("accepted")
RELEASED = Outcome("released")
