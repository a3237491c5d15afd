"""The attach plan (`broker_filter.proxy.plan`) as a table: every refusal rule, the splice, the relay,
the dynamic target and what is served, with the permission rows; no sockets, no upstream."""

from __future__ import annotations

import dataclasses

import pytest

from broker_filter.proxy import plan
from broker_filter.proxy.routing import Routing
from broker_filter.proxy.sharing import address_form_routing
from broker_filter.proxy.traits import EMBEDDED, traits_of

R3 = traits_of("RabbitMQ", "3.10.7")
SELECTOR = {plan.t.symbol("jms-selector"): plan.t.Described(plan.t.symbol("apache.org:selector-filter:string"), "a = 1")}
BAD_SELECTOR = {plan.t.symbol("jms-selector"): plan.t.Described(plan.t.symbol("apache.org:selector-filter:string"), "a = = 1")}


class Table(plan.Permissions):
    """alice may consume and send on `alice.*`, bob only send to `bob.in`; browse nowhere."""

    GRANTS = {("alice", "consume"): "alice.", ("alice", "send"): "alice.", ("bob", "send"): "bob.in"}

    def refusal(self, user, operation, address):
        prefix = self.GRANTS.get((user, operation))
        if prefix is not None and address is not None and address.startswith(prefix):
            return None
        return f"user {user} may not {operation} {address}"


def context(traits=R3, up=True, permissions=plan.OPEN, **kw):
    return plan.Context(traits=traits, upstream_name="up", upstream_up=up, routing_type=lambda a, c=(): address_form_routing(a),
                        permissions=permissions, **kw)


def receiver(address="q", **kw):
    return plan.ReceiverRequest(address=address, **kw)


def sender(address="q", **kw):
    return plan.SenderRequest(address=address, **kw)


RECEIVERS = [
    # (name, request, context, plan kind, condition of a refusal)
    ("filter not a map", receiver(filter=[1, 2]), context(), plan.Refuse, "amqp:invalid-field"),
    ("dynamic, no dynamic nodes: the daemon holds the reply address", receiver(None, dynamic=True), context(),
     plan.Reply, None),
    ("... even while the upstream is down (no broker involved)", receiver(None, dynamic=True), context(up=False),
     plan.Reply, None),
    ("dynamic, embedded", receiver(None, dynamic=True), context(EMBEDDED), plan.Serve, None),
    ("null source: look up the kept subscription", receiver(None, null=True), context(), plan.LookUpKept, None),
    ("null source, embedded: served (named subscriptions)", receiver(None, null=True), context(EMBEDDED), plan.Serve, None),
    ("invalid selector", receiver(filter=BAD_SELECTOR), context(), plan.Refuse, "amqp:invalid-field"),
    ("upstream down", receiver(), context(up=False), plan.Refuse, "amqp:connection:forced"),
    ("browse where the upstream cannot", receiver(capabilities=("queue",), copy=True), context(), plan.Refuse,
     "amqp:not-implemented"),
    ("browse on the embedded broker", receiver(capabilities=("queue",), copy=True), context(EMBEDDED), plan.Serve, None),
    ("a plain queue", receiver(filter=SELECTOR), context(), plan.Serve, None),
    ("a queue another replica owns, spliceable", receiver(), context(replicas=True, splicing=True), plan.Splice, None),
    ("... not spliced while the upstream is down", receiver(), context(up=False, replicas=True, splicing=True),
     plan.Refuse, "amqp:connection:forced"),
    ("a subscription is never spliced", receiver("/topic/t"), context(replicas=True, splicing=True), plan.Serve, None),
    ("a replica's own link is never spliced", receiver(peer=True), context(replicas=True, splicing=True), plan.Serve,
     None),
    # permissions
    ("consume granted", receiver("alice.q", user="alice"), context(permissions=Table()), plan.Serve, None),
    ("consume refused", receiver("alice.q", user="bob"), context(permissions=Table()), plan.Refuse,
     "amqp:unauthorized-access"),
    ("refused before the filter is compiled", receiver("alice.q", user="bob", filter=BAD_SELECTOR),
     context(permissions=Table()), plan.Refuse, "amqp:unauthorized-access"),
    ("refused before a splice", receiver("alice.q", user="bob"), context(permissions=Table(), replicas=True,
                                                                          splicing=True), plan.Refuse,
     "amqp:unauthorized-access"),
    ("browse is its own permission", receiver("alice.q", user="alice", capabilities=("queue",), copy=True),
     context(EMBEDDED, permissions=Table()), plan.Refuse, "amqp:unauthorized-access"),
    ("a replica's link was checked where its client logged in", receiver("alice.q", user="replica", peer=True),
     context(permissions=Table()), plan.Serve, None),
    ("a receiver on a reply address of the daemon's", receiver("/queues/broker-filter.reply-to.x"), context(),
     plan.Refuse, "amqp:not-allowed"),
    ("a reply address needs consume", receiver(None, dynamic=True, user="bob"), context(permissions=Table()),
     plan.Refuse, "amqp:unauthorized-access"),
]


@pytest.mark.parametrize("name, request_, ctx, kind, condition", RECEIVERS, ids=[r[0] for r in RECEIVERS])
def test_receiver_plan(name, request_, ctx, kind, condition):
    decided = plan.plan_receiver(request_, ctx)
    assert type(decided) is kind, decided
    if condition is not None:
        assert decided.condition == condition


SENDERS = [
    ("coordinator", sender(None, coordinator=True), context(), plan.Refuse, "amqp:not-implemented"),
    ("dynamic target, no dynamic nodes", sender(None, dynamic=True), context(), plan.Refuse, "amqp:not-implemented"),
    ("dynamic target, embedded", sender(None, dynamic=True), context(EMBEDDED), plan.DynamicTarget, None),
    ("dynamic target, embedded but down", sender(None, dynamic=True), context(EMBEDDED, up=False), plan.Refuse,
     "amqp:not-implemented"),
    ("null target: relay", sender(None), context(), plan.Relay, None),
    ("null target, upstream down", sender(None), context(up=False), plan.Refuse, "amqp:connection:forced"),
    ("null target is relayed whatever the permissions (each message is checked)", sender(None, user="bob"),
     context(permissions=Table()), plan.Relay, None),
    ("a queue", sender("q"), context(), plan.Publish, None),
    ("upstream down", sender("q"), context(up=False), plan.Refuse, "amqp:connection:forced"),
    ("a queue another replica owns", sender("q"), context(replicas=True, splicing=True), plan.Splice, None),
    ("a topic is never spliced", sender("/topic/t"), context(replicas=True, splicing=True), plan.Publish, None),
    ("send granted", sender("bob.in", user="bob"), context(permissions=Table()), plan.Publish, None),
    ("send refused", sender("alice.q", user="bob"), context(permissions=Table()), plan.Refuse,
     "amqp:unauthorized-access"),
    ("send refused before the upstream's state", sender("alice.q", user="bob"), context(up=False, permissions=Table()),
     plan.Refuse, "amqp:unauthorized-access"),
    ("a dynamic target needs send", sender(None, dynamic=True, user="bob"), context(EMBEDDED, permissions=Table()),
     plan.Refuse, "amqp:unauthorized-access"),
    ("a reply address of the daemon's: no permission asked (the unguessable address is)",
     sender("/queues/broker-filter.reply-to.x", user="bob"), context(up=False, permissions=Table()), plan.ToReply, None),
]


@pytest.mark.parametrize("name, request_, ctx, kind, condition", SENDERS, ids=[r[0] for r in SENDERS])
def test_sender_plan(name, request_, ctx, kind, condition):
    decided = plan.plan_sender(request_, ctx)
    assert type(decided) is kind, decided
    if condition is not None:
        assert decided.condition == condition


def test_a_refusal_names_the_operation_and_the_address():
    decided = plan.plan_receiver(receiver("alice.q", user="bob"), context(permissions=Table()))
    assert (decided.operation, decided.address, decided.reason) == ("consume", "alice.q", "unauthorized")
    assert decided.description == "user bob may not consume alice.q"


def test_an_address_rule_never_widens_what_is_granted():
    """An address rule rewrites `alice.in` to `shared`: served only if both are granted (alice may
    consume `alice.*`, not `shared`); a rule to a granted address serves."""
    from broker_filter.config import AddressRule, Config

    def ctx(upstream: str):
        routing = Routing.from_config(dataclasses.replace(
            Config(), address_rules=(AddressRule(pattern="alice.in", upstream=upstream),)))
        return context(permissions=Table(), route=routing.route)

    refused = plan.plan_receiver(receiver("alice.in", user="alice"), ctx("shared"))
    assert isinstance(refused, plan.Refuse) and refused.address == "shared"
    assert isinstance(plan.plan_sender(sender("alice.in", user="alice"), ctx("shared")), plan.Refuse)
    served = plan.plan_receiver(receiver("alice.in", user="alice"), ctx("alice.queue"))
    assert isinstance(served, plan.Serve) and served.routed == "alice.queue"


def test_the_relay_checks_each_message():
    assert plan.may_send(Table(), "bob", "bob.in") is None
    assert plan.may_send(Table(), "bob", "alice.q") == "user bob may not send alice.q"


class Durable(Table):
    GRANTS = {**Table.GRANTS, ("alice", "durable"): "alice."}


@pytest.mark.parametrize("user, address, kind", [
    ("alice", "alice.news", plan.Serve),  # consume and durable granted
    ("alice", "multicast://alice.news", plan.Refuse),  # (Table's prefix check: not granted)
])
def test_a_durable_subscription_needs_durable(user, address, kind):
    ctx = context(EMBEDDED, permissions=Durable())
    durable = receiver(address, user=user, durable=True, capabilities=("topic",))
    assert type(plan.plan_receiver(durable, ctx)) is kind
    # without `durable`, only the non-durable subscription is granted
    ctx = context(EMBEDDED, permissions=Table())
    refused = plan.plan_receiver(receiver("alice.news", user="alice", durable=True, capabilities=("topic",)), ctx)
    assert isinstance(refused, plan.Refuse) and refused.operation == "durable"
    assert isinstance(plan.plan_receiver(receiver("alice.news", user="alice", capabilities=("topic",)), ctx), plan.Serve)
    # a durable queue link is no subscription: consume decides
    assert isinstance(plan.plan_receiver(receiver("alice.q", user="alice", durable=True, capabilities=("queue",)), ctx),
                      plan.Serve)
