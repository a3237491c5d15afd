import pytest

from broker_filter.broker import (ANYCAST, MULTICAST, AddressError, Broker, BrokerConfig, BrokerError, parse_node,
                                  subscription_name)

from brokerkit import assigned_bodies, dispatch_all, publish


def test_parse_node_prefixes_capabilities_and_fqqn():
    assert parse_node("anycast://orders") == parse_node("orders", ["queue"])
    assert parse_node("orders", ["queue"]).routing_type == ANYCAST
    assert parse_node("multicast://news").routing_type == MULTICAST
    assert parse_node("news", ["topic"]).routing_type == MULTICAST
    assert parse_node("news").routing_type is None
    n = parse_node("foo::q1")
    assert (n.address, n.queue) == ("foo", "q1")
    with pytest.raises(AddressError):
        parse_node("::q")
    with pytest.raises(AddressError):
        parse_node(None)


@pytest.mark.parametrize(
    "link,container,caps,durable,expected",
    [
        ("sub", "cid", ["topic"], True, "cid.sub"),
        ("sub", "cid", ["topic", "shared"], True, "cid.sub"),
        ("sub|2", "cid", ["topic", "shared"], True, "cid.sub"),
        ("sub|global", "cid", ["topic", "shared", "global"], True, "sub:global"),
        ("sub|global3", None, ["topic", "shared", "global"], True, "sub:global"),
        ("sub|volatile1", "cid", ["topic", "shared"], False, "cid.sub:shared-volatile"),
        ("sub|global-volatile2", None, ["shared", "global"], False, "sub:shared-volatile:global"),
    ],
)
def test_qpid_jms_subscription_link_names(link, container, caps, durable, expected):
    assert subscription_name(link, container, caps, durable).queue_name == expected


def test_private_receiver_has_no_subscription_name():
    assert subscription_name("receiver-1", "cid", ["topic"], False) is None


def test_anycast_queue_competing_consumers_round_robin(broker):
    a = broker.subscribe("orders")
    b = broker.subscribe("orders")
    broker.flow(a, 10)
    broker.flow(b, 10)
    for i in range(6):
        publish(broker, "orders", i)
    got = dispatch_all(broker)
    assert assigned_bodies(got, a) == [0, 2, 4] and assigned_bodies(got, b) == [1, 3, 5]


def test_queue_holds_messages_until_a_consumer_comes(broker):
    for i in range(3):
        publish(broker, "later", i)
    c = broker.subscribe("later")
    broker.flow(c, 2)
    assert assigned_bodies(dispatch_all(broker)) == [0, 1]
    broker.flow(c, 5)
    assert assigned_bodies(dispatch_all(broker)) == [2]


def test_multicast_gives_every_subscriber_a_copy_and_drops_without_subscribers(broker):
    assert publish(broker, "news", "early", capabilities=["topic"]) == 0
    a = broker.subscribe("news", capabilities=["topic"])
    b = broker.subscribe("multicast://news")
    broker.flow(a, 10)
    broker.flow(b, 10)
    assert publish(broker, "news", "x", capabilities=["topic"]) == 2
    got = dispatch_all(broker)
    assert assigned_bodies(got, a) == ["x"] and assigned_bodies(got, b) == ["x"]
    assert broker.addresses["news"].messages == 1  # one stored message, two references


def test_default_routing_type_is_configurable():
    broker = Broker(BrokerConfig(default_routing_type=MULTICAST))
    a = broker.subscribe("events")
    b = broker.subscribe("events")
    broker.flow(a, 5)
    broker.flow(b, 5)
    publish(broker, "events", 1)
    got = dispatch_all(broker)
    assert assigned_bodies(got, a) == [1] and assigned_bodies(got, b) == [1]
    with pytest.raises(ValueError):
        BrokerConfig(default_routing_type="broadcast")


def test_existing_address_keeps_its_routing_type_for_receivers_without_preference(broker):
    t = broker.subscribe("multicast://alerts")
    plain = broker.subscribe("alerts")  # no preference: the address is multicast, so a subscription
    broker.flow(t, 5)
    broker.flow(plain, 5)
    publish(broker, "alerts", "a")
    got = dispatch_all(broker)
    assert assigned_bodies(got, t) == ["a"] and assigned_bodies(got, plain) == ["a"]


def test_both_routing_types_on_one_address(broker):
    q = broker.subscribe("orders", capabilities=["queue"])
    t = broker.subscribe("orders", capabilities=["topic"])
    broker.flow(q, 5)
    broker.flow(t, 5)
    publish(broker, "orders", "both")  # no preference: routed by anycast and multicast
    publish(broker, "anycast://orders", "q-only")
    publish(broker, "multicast://orders", "t-only")
    got = dispatch_all(broker)
    assert assigned_bodies(got, q) == ["both", "q-only"]
    assert assigned_bodies(got, t) == ["both", "t-only"]


def test_fqqn_attaches_to_one_queue(broker):
    broker.declare_queue("foo", "q1", ANYCAST)
    broker.declare_queue("foo", "q2", ANYCAST)
    c1 = broker.subscribe("foo::q1")
    c2 = broker.subscribe("foo::q2")
    broker.flow(c1, 10)
    broker.flow(c2, 10)
    for i in range(4):
        publish(broker, "foo", i)  # anycast over two queues: distributed evenly
    publish(broker, "foo::q2", "direct")
    got = dispatch_all(broker)
    assert assigned_bodies(got, c1) == [0, 2] and assigned_bodies(got, c2) == [1, 3, "direct"]
    with pytest.raises(BrokerError) as e:
        broker.subscribe("other::q1")
    assert e.value.condition == "amqp:not-found"


def test_fqqn_reaches_a_durable_subscription_queue(broker):
    sub = broker.subscribe("news", capabilities=["topic"], link_name="s", container_id="c", durable=True)
    broker.close_consumer(sub, closed=False)
    publish(broker, "news", "kept", capabilities=["topic"])
    c = broker.subscribe("news::c.s")
    broker.flow(c, 5)
    assert assigned_bodies(dispatch_all(broker)) == ["kept"]


def test_auto_create_off_refuses_unknown_addresses():
    broker = Broker(BrokerConfig(auto_create=False))
    with pytest.raises(BrokerError) as e:
        broker.subscribe("nope")
    assert e.value.condition == "amqp:not-found"
    with pytest.raises(BrokerError):
        publish(broker, "nope", 1)
    broker.declare_queue("yes")
    c = broker.subscribe("yes")
    broker.flow(c, 1)
    publish(broker, "yes", 1)
    assert assigned_bodies(dispatch_all(broker)) == [1]


def test_wildcard_subscriptions_on_multicast(broker):
    all_news = broker.subscribe("news.#", capabilities=["topic"])
    sport = broker.subscribe("news.*.sport", capabilities=["topic"])
    broker.flow(all_news, 10)
    broker.flow(sport, 10)
    for a in ("news", "news.uk", "news.uk.sport", "news.uk.eu.sport", "weather.uk"):
        publish(broker, a, a, capabilities=["topic"])
    got = dispatch_all(broker)
    assert assigned_bodies(got, all_news) == ["news", "news.uk", "news.uk.sport", "news.uk.eu.sport"]
    assert assigned_bodies(got, sport) == ["news.uk.sport"]
    broker.close_consumer(sport)
    assert publish(broker, "news.fr.sport", 1, capabilities=["topic"]) == 1


def test_private_subscription_ends_with_its_link(broker):
    c = broker.subscribe("news", capabilities=["topic"])
    publish(broker, "news", 1, capabilities=["topic"])
    broker.close_consumer(c)
    assert broker.addresses["news"].multicast == {} and broker.addresses["news"].messages == 0


def test_durable_subscription_survives_disconnect_and_ends_on_close(broker):
    c = broker.subscribe("news", capabilities=["topic"], link_name="mysub", container_id="client-1", durable=True)
    broker.close_consumer(c, closed=False)  # JMS consumer.close(): detach without closing
    publish(broker, "news", "while-away", capabilities=["topic"])
    again = broker.subscribe("news", capabilities=["topic"], link_name="mysub", container_id="client-1", durable=True)
    broker.flow(again, 5)
    assert assigned_bodies(dispatch_all(broker)) == ["while-away"]
    with pytest.raises(BrokerError) as e:  # exclusive durable: one consumer at a time
        broker.subscribe("news", capabilities=["topic"], link_name="mysub", container_id="client-1", durable=True)
    assert e.value.condition == "amqp:resource-locked"
    broker.close_consumer(again, closed=True)  # unsubscribe
    assert "client-1.mysub" not in broker.queues


def test_unsubscribe_by_name_with_null_source(broker):
    c = broker.subscribe("news", capabilities=["topic"], link_name="s1", container_id="cid", durable=True)
    broker.close_consumer(c, closed=False)
    lookup = broker.subscribe(None, link_name="s1", container_id="cid", durable=True)
    broker.close_consumer(lookup, closed=True)
    assert "cid.s1" not in broker.queues
    with pytest.raises(BrokerError):
        broker.subscribe(None, link_name="s1", container_id="cid", durable=True)


def test_shared_durable_subscription_is_one_queue_with_competing_links(broker):
    caps = ["topic", "shared"]
    a = broker.subscribe("t", capabilities=caps, link_name="s", container_id="c1", durable=True)
    b = broker.subscribe("t", capabilities=caps, link_name="s|2", container_id="c1", durable=True)
    other = broker.subscribe("t", capabilities=["topic"])
    for c in (a, b, other):
        broker.flow(c, 10)
    for i in range(4):
        publish(broker, "t", i, capabilities=["topic"])
    got = dispatch_all(broker)
    assert sorted(assigned_bodies(got, a) + assigned_bodies(got, b)) == [0, 1, 2, 3] and assigned_bodies(got, a) and assigned_bodies(got, b)
    assert assigned_bodies(got, other) == [0, 1, 2, 3]
    for c, e in got:
        broker.settle(c, e, "accepted")
    broker.close_consumer(a, closed=False)
    broker.close_consumer(b, closed=False)
    publish(broker, "t", "kept", capabilities=["topic"])
    back = broker.subscribe("t", capabilities=caps, link_name="s", container_id="c1", durable=True)
    broker.flow(back, 5)
    assert assigned_bodies(dispatch_all(broker), back) == ["kept"]


def test_global_shared_subscription_spans_containers(broker):
    caps = ["topic", "shared", "global"]
    a = broker.subscribe("t", capabilities=caps, link_name="g|global", container_id="c1", durable=True)
    b = broker.subscribe("t", capabilities=caps, link_name="g|global2", container_id="c2", durable=True)
    assert a.queue is b.queue


def test_shared_volatile_subscription_ends_with_last_consumer(broker):
    caps = ["topic", "shared"]
    a = broker.subscribe("t", capabilities=caps, link_name="v|volatile1", container_id="c")
    b = broker.subscribe("t", capabilities=caps, link_name="v|volatile2", container_id="c")
    assert a.queue is b.queue
    broker.close_consumer(a, closed=False)
    assert "c.v:shared-volatile" in broker.queues
    broker.close_consumer(b, closed=False)
    assert "c.v:shared-volatile" not in broker.queues


def test_subscription_with_changed_selector_is_recreated_when_idle(broker):
    from brokerkit import prop_equals

    c = broker.subscribe("t", capabilities=["topic"], link_name="s", container_id="c", durable=True,
                         filter=prop_equals("k", 1))
    broker.close_consumer(c, closed=False)
    publish(broker, "t", "old", capabilities=["topic"], k=1)
    c2 = broker.subscribe("t", capabilities=["topic"], link_name="s", container_id="c", durable=True,
                          filter=prop_equals("k", 2))
    broker.flow(c2, 5)
    publish(broker, "t", "new", capabilities=["topic"], k=2)
    assert assigned_bodies(dispatch_all(broker)) == ["new"]
