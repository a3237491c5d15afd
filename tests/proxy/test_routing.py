"""Address routing: `[[address_rules]]` (first match wins, AMQ wildcards) and `[virtual_addresses]`
(a filter compiled once, ANDed with a client's own), as the proxy applies them to attached addresses."""

from __future__ import annotations

import json

import pytest

from broker_filter.config import VIRTUAL_FILTER_KEY, AddressRule, load
from broker_filter.filters import FilterSet
from broker_filter.proxy.routing import Routing, rule_matches


def loaded(tmp_path, toml: str):
    """The configuration of a file holding `toml`."""
    path = tmp_path / "broker-filter.toml"
    path.write_text(toml)
    return load(None, {"BROKER_FILTER_CONFIG": str(path)})


def test_address_rules_first_match_wins_with_amq_wildcards(tmp_path):
    config = loaded(
        tmp_path,
        """
        [[address_rules]]
        pattern = "news.#"
        routing_type = "multicast"
        upstream = "/exchange/amq.topic/{address}"

        [[address_rules]]
        pattern = "orders.*"
        routing_type = "anycast"
        upstream = "/queue/{address}"

        [[address_rules]]
        pattern = "#"
        """,
    )
    routing = Routing.from_config(config)
    route = routing.route("news")
    assert (route.upstream, route.routing_type) == ("/exchange/amq.topic/news", "multicast")
    assert routing.route("news.eu.sport").upstream == "/exchange/amq.topic/news.eu.sport"
    assert routing.route("orders.eu").upstream == "/queue/orders.eu"
    fallthrough = routing.route("orders.eu.x")
    assert (fallthrough.upstream, fallthrough.routing_type) == ("orders.eu.x", "")
    assert fallthrough.rule is config.address_rules[2]
    assert Routing.from_config(load(None, {})).route("anything").upstream == "anything"


@pytest.mark.parametrize(
    "pattern, address, expected",
    [
        ("a.#", "a", True),
        ("a.#.b", "a.b", True),
        ("#.a.b", "a.x.a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.*", "a.b", True),
        ("a#b", "a#b", True),
        ("a#b", "axb", False),
        ("#", "", True),
    ],
)
def test_wildcards(pattern, address, expected):
    assert rule_matches(AddressRule(pattern), address) is expected


VIRTUAL = """
[[address_rules]]
pattern = "orders"
routing_type = "anycast"
upstream = "/queue/{address}"

[virtual_addresses."orders.red"]
upstream = "orders"
selector = "color = 'red' AND weight > 2.5"

[virtual_addresses."news.sport"]
upstream = "/exchange/amq.topic/news"
routing_type = "multicast"
filter_set = '{"t": {"descriptor": "apache.org:legacy-amqp-topic-binding:string", "value": "*.sport"}}'

[virtual_addresses.vip.filter_set.sel]
descriptor = "0x0000468C:0x00000004"
value = "JMSPriority > 6"
[virtual_addresses.vip]
upstream = "orders"
"""


def test_virtual_addresses_compile_and_route(tmp_path):
    from broker_filter.amqp.message import Message

    config = loaded(tmp_path, VIRTUAL)
    routing = Routing.from_config(config)
    red = routing.route("orders.red")
    assert (red.upstream, red.routing_type) == ("/queue/orders", "anycast")  # the rule applies upstream
    assert red.virtual.settings is config.virtual_addresses["orders.red"]
    selected = red.virtual.filter_set
    assert selected.matches(Message.from_json({"application_properties": {"color": "red", "weight": 3.0}}))
    assert not selected.matches(Message.from_json({"application_properties": {"color": "red", "weight": 1}}))

    sport = routing.route("news.sport")
    assert (sport.upstream, sport.routing_type) == ("/exchange/amq.topic/news", "multicast")
    topic = sport.virtual.filter_set
    assert [e.kind for e in topic.entries] == ["topic"]
    assert topic.matches(Message.from_json({"properties": {"subject": "eu.sport"}}))
    assert not topic.matches(Message.from_json({"properties": {"subject": "eu.politics"}}))

    vip = routing.route("vip").virtual.filter_set
    assert vip.matches(Message.from_json({"header": {"priority": 9}}))
    assert not vip.matches(Message.from_json({}))
    effective = json.loads(json.dumps(config.to_dict()))
    assert effective["virtual_addresses"]["news.sport"]["filter_set"]["t"]["value"] == "*.sport"
    assert effective["virtual_addresses"]["orders.red"]["selector"] == "color = 'red' AND weight > 2.5"


def test_virtual_filter_combines_with_the_client_filter_and_echoes_only_the_client_part(tmp_path):
    from broker_filter.amqp.message import Message
    from broker_filter.filters import compile_filter_set

    config = loaded(tmp_path, VIRTUAL)
    red = Routing.from_config(config).virtual["orders.red"]
    assert [e.kind for e in red.filter_set.entries] == ["selector"]
    # the compiled filter lives with the routing; the setting holds what was written
    setting = config.virtual_addresses["orders.red"]
    assert not [name for name, value in vars(setting).items() if isinstance(value, FilterSet)]
    client = compile_filter_set({"jms-selector": {"descriptor": "apache.org:selector-filter:string",
                                                  "value": "size = 'L'"}})
    combined = red.combine(client)
    assert combined.applied.keys() >= {"jms-selector", VIRTUAL_FILTER_KEY}
    assert client.applied == {"jms-selector": client.entries[0].value}  # what the attach reply echoes
    both = {"color": "red", "weight": 3.0, "size": "L"}
    assert combined.matches(Message.from_json({"application_properties": both}))
    assert not combined.matches(Message.from_json({"application_properties": {**both, "size": "S"}}))
    assert not combined.matches(Message.from_json({"application_properties": {**both, "color": "blue"}}))
    alone = red.combine(compile_filter_set({}))
    assert alone.matches(Message.from_json({"application_properties": both}))


