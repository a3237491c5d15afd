"""The sharing rule on its own (broker_filter.proxy.sharing): which source semantics each input gives."""

from __future__ import annotations

import pytest

from broker_filter.broker import Broker, BrokerConfig
from broker_filter.filters import compile_filter_set
from broker_filter.proxy.embedded import EmbeddedUpstream
from broker_filter.proxy.sharing import QUEUE, SUBSCRIPTION, decide, feed_key, upstream_capabilities


class Remote:
    """The remote upstream's answer, without a connection."""

    def routing_type(self, address, capabilities=()):
        from broker_filter.proxy.sharing import address_form_routing

        return address_form_routing(address)


@pytest.mark.parametrize("address, want", [
    ("multicast://news", SUBSCRIPTION), ("anycast://orders", QUEUE), ("news::sub1", QUEUE),
    ("/topic/t", SUBSCRIPTION), ("/exchange/amq.topic/k", SUBSCRIPTION), ("/exchanges/x/k", SUBSCRIPTION),
    ("/queue/q", QUEUE), ("/amq/queue/q", QUEUE), ("/queues/q", QUEUE), ("plain", QUEUE),
])
def test_remote_address_forms(address, want):
    assert decide(address=address, upstream=Remote()).semantics == want


def test_embedded_address_model_before_attach():
    up = EmbeddedUpstream(Broker(BrokerConfig(default_routing_type="anycast")))
    up.broker.declare_address("feed", "multicast")
    assert decide(address="feed", upstream=up).semantics == SUBSCRIPTION  # existing multicast address
    assert decide(address="fresh", upstream=up).semantics == QUEUE  # new: the default routing type
    assert decide(address="multicast://news.#", upstream=up).semantics == SUBSCRIPTION
    assert decide(address="feed::q", upstream=up).semantics == QUEUE  # an FQQN names one shared queue
    multi = EmbeddedUpstream(Broker(BrokerConfig(default_routing_type="multicast")))
    assert decide(address="fresh", upstream=multi).semantics == SUBSCRIPTION
    assert "fresh" not in multi.broker.addresses  # asking created nothing


def test_precedence_rule_then_copy_then_capabilities_then_address():
    r = Remote()
    assert decide(address="/topic/t", rule_routing_type="anycast", upstream=r).semantics == QUEUE
    assert decide(address="/queue/q", copy=True, upstream=r).semantics == SUBSCRIPTION
    assert decide(address="/queue/q", capabilities=("topic",), upstream=r).semantics == SUBSCRIPTION
    assert decide(address="/topic/t", capabilities=("queue",), upstream=r).semantics == QUEUE
    assert decide(address="/topic/t", capabilities=("queue", "topic"), upstream=r).semantics == SUBSCRIPTION


def test_keys_private_subscriptions_share_one_upstream_subscription_queues_share_named_by_name():
    none = compile_filter_set({})
    sub = decide(address="/topic/t", upstream=Remote())
    queue = decide(address="/queue/q", upstream=Remote())
    # non-durable, unnamed subscription links: one shared upstream subscription per address
    assert feed_key(sub, address="/topic/t", pushed=(), local=none, serial=1) == \
        feed_key(sub, address="/topic/t", pushed=(), local=none, serial=2) == ("fanout", "/topic/t", ())
    assert feed_key(sub, address="/topic/t", pushed=(), local=none, serial=1) != \
        feed_key(sub, address="/topic/u", pushed=(), local=none, serial=2)
    # durable or dynamic: a subscription of their own
    assert feed_key(sub, address="/topic/t", pushed=(), local=none, serial=1, link_name="d", durable=True) != \
        feed_key(sub, address="/topic/t", pushed=(), local=none, serial=2, link_name="d", durable=True)
    assert feed_key(sub, address="/topic/t", pushed=(), local=none, serial=1, dynamic=True)[0] == "subscription"
    assert feed_key(queue, address="/queue/q", pushed=(), local=none, serial=1) == \
        feed_key(queue, address="/queue/q", pushed=(), local=none, serial=2)
    shared = dict(address="/topic/t", pushed=(), local=none, container_id="c1", capabilities=("topic", "shared"))
    assert feed_key(sub, serial=1, link_name="s", **shared) == feed_key(sub, serial=2, link_name="s|2", **shared)
    assert feed_key(sub, serial=1, link_name="s", **shared) != feed_key(sub, serial=2, link_name="other", **shared)


def test_rule_routing_type_reaches_the_upstream_as_a_capability():
    assert upstream_capabilities(("shared", "queue"), "multicast") == ("shared", "topic")
    assert upstream_capabilities(("topic",), "anycast") == ("queue",)
    assert upstream_capabilities(("topic",), "") == ("topic",)
