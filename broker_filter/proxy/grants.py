"""The permission model (`broker_filter.authorization`) as the attach plan asks it (`plan.Permissions`):
decided in the address model of the upstream actually served (RabbitMQ's addresses in front of
RabbitMQ, Artemis's on the embedded broker and other brokers), read from its traits at each check,
since a remote upstream says what it is only in its open frame."""

from __future__ import annotations

from typing import Any

from ..authorization import Permissions as Model
from .plan import Permissions

# A dynamic node (a temporary queue) is named by the upstream, not the client: its permission is
# asked for every address the embedded broker may give one (`temp.<id>`).
DYNAMIC = "temp.#"


def address_model(traits: Any) -> str:
    """The `authorization` address model of an upstream with `traits`."""
    if traits.in_process:
        return "embedded"
    return "rabbitmq" if traits.binds_exchange_keys else "other"  # (binds exchange keys: RabbitMQ)


class Granted(Permissions):
    """`model`'s decisions for the clients of `upstream`."""

    def __init__(self, model: Model, upstream: Any):
        self.model = model
        self.upstream = upstream

    @classmethod
    def of(cls, config: Any, upstream: Any) -> Permissions:
        """The permissions of `config`'s `[security]`, or `plan.OPEN` when it has no settings."""
        from .plan import OPEN

        model = Model.from_config(config)
        return OPEN if model.is_open else cls(model, upstream)

    def refusal(self, user: str | None, operation: str, address: str | None) -> str | None:
        model = self.model.for_upstream(address_model(self.upstream.traits))
        refused = model.explain(user, None, operation, address if address is not None else DYNAMIC)
        return None if refused is None else str(refused)
