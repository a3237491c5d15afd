"""The permission model (`broker_filter.authorization`) as the attach plan asks it (`plan.Permissions`):
decided in the address model of the upstream actually served (RabbitMQ's addresses in front of
RabbitMQ, Artemis's on the embedded broker and other brokers), read from its traits at each check,
since a remote upstream says what it is only in its open frame."""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..authorization import Permissions as Model
from ..engine.endpoints import LOCAL_CLOSED, Link
from . import plan
from .plan import Permissions
from .records import ClientConnection, links_of
from .refusal import close_link

log = logging.getLogger("broker_filter.proxy")

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
        model = Model.from_config(config)
        return plan.OPEN if model.is_open else cls(model, upstream)

    def refusal(self, user: str | None, operation: str, address: str | None) -> str | None:
        model = self.model.for_upstream(address_model(self.upstream.traits))
        refused = model.explain(user, None, operation, address if address is not None else DYNAMIC)
        return None if refused is None else str(refused)


class Guard:
    """A server's use of its permissions outside an attach's plan: who a named subscription belongs
    to, what a `/management` request needs, the links re-checked on SIGHUP, and the audit of every
    refusal (a log line and `broker_filter_authorization_refusals_total{operation}`)."""

    def __init__(self, server: Any):
        self.server = server

    def subscriber(self, conn: ClientConnection | None, link: Link) -> str | None:
        """Who a named (JMS durable or shared) subscription belongs to: the client's container id, and,
        with `[security]` settings, its user too, so that a subscription belongs to the user who
        made it (another user with the same client id and name has one of its own)."""
        container = link.connection.remote_container
        if self.server.permissions is plan.OPEN or conn is None or conn.peer is not None:
            return container
        return f"{container}@{conn.user or 'anonymous'}"

    def manage_check(self, conn: ClientConnection) -> Callable[[Any, str], str | None]:
        """What a `/management` request of `conn`'s needs (`authorization.management_checks`: the
        (operation, address) pairs it must be allowed; None for one RabbitMQ would refuse as
        malformed); with no settings, every request passes."""

        def check(needed: Any, request: str) -> str | None:
            if self.server.permissions is plan.OPEN:
                return None
            if needed is None:
                why = f"{request}: not a request the daemon can check permissions for"
                self.audit(conn, plan.MANAGE, None, why)
                return why
            for operation, address in needed:
                why = self.server.permissions.refusal(conn.user, operation, address)
                if why is not None:
                    self.audit(conn, operation, address, why)
                    return why
            return None

        return check

    def recheck(self, config: Any) -> int:
        """New security settings (SIGHUP): every client link is checked again as it was attached, and
        one no longer permitted is detached with `amqp:unauthorized-access` (its connection and other
        links carry on); the number detached."""
        self.server.config = config
        self.server.permissions = Granted.of(config, self.server.upstream)
        detached = 0
        for conn in list(self.server.connections.values()):
            if conn.peer is not None or conn.connection is None:
                continue  # (a replica's links were checked where their client logged in)
            for link in links_of(conn.connection):
                state = link.context
                if state is None or state.operation is None or link.local_state == LOCAL_CLOSED:
                    continue
                why = self.server.permissions.refusal(conn.user, state.operation, state.address)
                if why is None:
                    continue
                self.audit(conn, state.operation, state.address, why)
                self.server._drop_link(link)
                close_link(link, "amqp:unauthorized-access", why)
                detached += 1
        return detached

    def audit(self, conn: ClientConnection, operation: str | None, address: str | None, why: str) -> None:
        """An operation refused by the permissions: one log line (who, from where, what, where) and
        a count by operation."""
        identity = conn.identity
        log.warning("authorization: refused %s on %r for user %r from %s: %s", operation, address,
                    conn.user, identity.peer if identity is not None else "?", why)
        if self.server.metrics is not None:
            self.server.metrics.authorization_refused(operation or "other")
