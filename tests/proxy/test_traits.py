"""The upstream's traits from its open frame's `product`/`version`: a table, no sockets."""

from __future__ import annotations

import dataclasses

import pytest

from broker_filter.proxy.traits import EMBEDDED, Traits, major, traits_of

# every remote broker is given the filters the proxy does not know (its echo says what it applied)
R3 = Traits(binds_exchange_keys=True, modified_ok=False, over_delivers=True, passes_unknown_filters=True,
            closes_on_unparsable=True)
R4 = Traits(binds_exchange_keys=True, recycles_sessions=True, dead_letters_undeliverable=True, counts_queue=True,
            serves_management=True, passes_unknown_filters=True)
OTHER = Traits(passes_unknown_filters=True)


@pytest.mark.parametrize("product, version, chained, expected", [
    ("RabbitMQ", "3.10.7", False, R3),
    ("RabbitMQ", "3.13.0", False, R3),
    ("RabbitMQ", "4.0.5", False, R4),
    ("RabbitMQ", "4.1.0", False, R4),
    ("rabbitmq", "4.0.5", False, R4),  # the product name is matched without case
    ("RabbitMQ", None, False, R3),  # no version: taken as the oldest
    ("RabbitMQ", "garbage", False, R3),
    # a broker-filter under RabbitMQ's name (its /management pair is not relayed twice)
    ("RabbitMQ", "4.0.5", True, dataclasses.replace(R4, chained=True, serves_management=False)),
    # a broker-filter in front of RabbitMQ 3.x: what would drop its upstream connection is refused here too
    ("RabbitMQ", "3.10.8", True, dataclasses.replace(R3, chained=True)),
    ("broker-filter", "0.1", False, dataclasses.replace(OTHER, chained=True)),
    ("apache-activemq-artemis", "2.31.0", False, OTHER),
    (None, None, False, OTHER),
    (None, None, True, dataclasses.replace(OTHER, chained=True)),
])
def test_traits_table(product, version, chained, expected):
    assert traits_of(product, version, chained) == expected


def test_embedded_traits():
    """The embedded broker's are fixed: in process, Artemis's address model, nothing passed through."""
    assert EMBEDDED == Traits(dynamic_sources=True, named_subscriptions=True, browses_queues=True,
                              redelivers_in_place=True, in_process=True)
    assert not any(getattr(traits_of(p, v), f) for p, v in (("RabbitMQ", "4.0.5"), (None, None))
                   for f in ("dynamic_sources", "named_subscriptions", "browses_queues", "in_process"))


def test_traits_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        traits_of("RabbitMQ", "4.0.5").modified_ok = False  # type: ignore[misc]


@pytest.mark.parametrize("version, expected", [("4.0.5", 4), ("3.10.7", 3), ("10", 10), ("", 0), (None, 0),
                                               ("v4", 0), (" 4 .1", 4)])
def test_major(version, expected):
    assert major(version) == expected
