"""The subscription index: for random filter sets and messages, the keys it returns are exactly the
keys whose filter selects the message (index on and off, cache on and off), through registrations,
removals and re-registrations; plus the terms each kind of filter is indexed by."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker_filter.amqp import types as t
from broker_filter.amqp.types import Described, symbol
from broker_filter.filters import FilterError, SelectorError, compile_filter_set, compile_selector
from broker_filter.filters.base import ORIGIN_ANNOTATION
from broker_filter.filters.index import SubscriptionIndex, exact_key, index_key, index_terms
from broker_filter.amqp.message import Message, Properties

import strategies as S

SUBJECTS = ("TagA", "TagB", "order", "", "5")
TOPIC_WORDS = ("TagA", "order", "*", "#", "5", "")


def described(name: str, value):
    return Described(symbol(name), value)


def _message_of(subject=None, **app):
    return Message(properties=Properties(subject=subject) if subject is not None else None,
                   application_properties=app or None)


# A small pool of values shared by filters and messages, so that equal values of different types
# (5, 5.0, ubyte 5, '5', symbol 'c1') meet often.
POOL = ("c1", "c2", "5", "", 5, 5.0, 2, -1, 2**40, True, b"5",
        t.int32(5), t.ubyte(5), t.ulong(5), t.float32(2.0), t.symbol("c1"), t.char("5"), t.decimal64("5"), t.timestamp(5))
POOL_LITERALS = ("'c1'", "'c2'", "'5'", "''", "5", "5.0", "2", "-1", "1099511627776", "TRUE", "5L", "0x5", "2.0", "5e0")


def pool_values() -> st.SearchStrategy:
    return st.sampled_from(POOL)


def equality_selectors() -> st.SearchStrategy[str]:
    """`customer = 'c1'`-style selectors (the indexable shapes), alone or ANDed with a random condition."""
    name = st.sampled_from(S.PROPERTY_NAMES[:2])
    literal = st.one_of(st.sampled_from(POOL_LITERALS), st.sampled_from(POOL_LITERALS), S.string_literals(), S.exact_literals(), S.approximate_literals())
    eq = st.tuples(name, literal).map(lambda p: f"{p[0]} = {p[1]}")
    rev = st.tuples(name, literal).map(lambda p: f"{p[1]} = {p[0]}")
    in_list = st.tuples(name, st.lists(st.one_of(st.sampled_from(POOL_LITERALS[:4]), S.string_literals()),
                                       min_size=1, max_size=3)).map(
        lambda p: f"{p[0]} IN ({', '.join(p[1])})")
    simple = st.one_of(eq, rev, in_list)
    return st.one_of(simple, st.tuples(simple, S.conditions("jms")).map(lambda p: f"{p[0]} AND ({p[1]})"),
                     st.tuples(S.conditions("jms"), simple).map(lambda p: f"({p[0]}) AND {p[1]}"))


def simple_values() -> st.SearchStrategy:
    return st.one_of(pool_values(), S.amqp_values().filter(lambda v: not isinstance(v, Described)))


@st.composite
def filter_entries(draw) -> object:
    kind = draw(st.sampled_from(("selector", "equality", "equality", "equality", "direct", "topic", "headers", "properties",
                                 "application-properties", "no-local")))
    if kind in ("selector", "equality"):
        dialect = draw(st.sampled_from(S.DIALECTS)) if kind == "selector" else draw(st.sampled_from(("jms", "artemis")))
        text = draw(S.selectors(dialect)) if kind == "selector" else draw(equality_selectors())
        return described("apache.org:selector-filter:string", text), dialect
    if kind == "direct":
        return described("apache.org:legacy-amqp-direct-binding:string", draw(st.sampled_from(SUBJECTS))), None
    if kind == "topic":
        words = draw(st.lists(st.sampled_from(TOPIC_WORDS), min_size=1, max_size=3))
        return described("apache.org:legacy-amqp-topic-binding:string", ".".join(words)), None
    if kind == "headers":
        pairs = draw(st.dictionaries(st.sampled_from(S.PROPERTY_NAMES), st.one_of(st.none(), simple_values()), max_size=3))
        mode = draw(st.sampled_from((None, "all", "any")))
        if mode:
            pairs["x-match"] = mode
        return described("apache.org:legacy-amqp-headers-binding:map", pairs), None
    if kind == "properties":
        ref = draw(st.one_of(
            st.tuples(st.just("subject"), st.one_of(st.sampled_from(SUBJECTS), st.sampled_from(("&p:Tag", "&s:A", "&&x")), st.none())),
            st.tuples(st.just("message-id"), st.one_of(st.just("ID:1"), st.integers(0, 9).map(t.ulong), st.none())),
            st.tuples(st.just("group-sequence"), st.integers(0, 3).map(t.uint)),
        ))
        return described("amqp:properties-filter", {symbol(ref[0]): ref[1]}), None
    if kind == "application-properties":
        refs = draw(st.dictionaries(st.sampled_from(S.PROPERTY_NAMES), st.one_of(
            simple_values(), st.sampled_from(("&p:a", "&s:5", "&&5"))), min_size=1, max_size=2))
        return described("amqp:application-properties-filter", refs), None
    return described("apache.org:no-local-filter:list", []), None


@st.composite
def filters(draw):
    """A compiled filter-set of one to three entries (None for a filter that does not compile)."""
    entries = draw(st.one_of(st.lists(filter_entries(), min_size=1, max_size=1),
                             st.lists(filter_entries(), min_size=1, max_size=3)))
    dialect = next((d for _, d in entries if d is not None), "jms")
    fs = {symbol(f"f{i}"): value for i, (value, _) in enumerate(entries)}
    try:
        return compile_filter_set(fs, dialect)
    except (FilterError, SelectorError):
        return None


@st.composite
def index_messages(draw):
    m = draw(S.messages())
    if draw(st.booleans()):
        m.application_properties = draw(st.dictionaries(st.sampled_from(S.PROPERTY_NAMES[:2]), pool_values(), max_size=2))
    if m.properties is None and draw(st.booleans()):
        m.properties = Properties(subject=draw(st.sampled_from(SUBJECTS)))
    if draw(st.integers(0, 4)) == 0:
        m.message_annotations = {ORIGIN_ANNOTATION: "me"}
    return m


def expected(filter_set, message, receiver):
    if filter_set is None:
        return True
    try:
        return filter_set.evaluate(message, receiver) is True
    except Exception:
        return False


VARIANTS = [(True, 64), (True, 0), (False, 64), (False, 0)]


def _fs(**entries):
    names = {"selector": "apache.org:selector-filter:string", "headers": "apache.org:legacy-amqp-headers-binding:map",
             "app": "amqp:application-properties-filter", "topic": "apache.org:legacy-amqp-topic-binding:string"}
    return compile_filter_set({symbol(k): described(names[k.rstrip("0123456789")], v) for k, v in entries.items()})


# The typing rules, always tried: JMS `5 = 5.0` is TRUE and '5' never equals 5; headers compare the
# AMQP type too; the OASIS filters compare numbers as numbers and strings with symbols.
TYPED_FILTERS = [_fs(selector="a = 5"), _fs(selector="a = '5'"), _fs(selector="a IN ('c1', '5') AND b <> 1"),
                 _fs(headers={"x-match": "any", "b": t.int32(5), "a": "c1"}), _fs(app={"a": t.uint(5)}),
                 _fs(app={"a": "c1"}), _fs(topic="c1.#", selector1="b = 2"), _fs(selector="5 = a"), None]
TYPED_MESSAGES = [_message_of(a=5.0), _message_of(a="5"), _message_of(a=t.ubyte(5), b=2), _message_of(a=t.symbol("c1")),
                  _message_of(b=t.int32(5)), _message_of(b=5), _message_of(a=t.decimal64("5")),
                  _message_of(subject="c1.x", b=t.float32(2.0))]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(filters(), st.none()), min_size=1, max_size=12), st.lists(index_messages(), min_size=1, max_size=6),
       st.lists(st.booleans(), max_size=12))
@example(TYPED_FILTERS, TYPED_MESSAGES, [False, True, False, True, True])
def test_index_returns_exactly_the_selecting_filters(filter_list, messages, drop_mask):
    receivers = {i: ("me" if i % 3 == 0 else None) for i in range(len(filter_list))}
    indexes = [SubscriptionIndex(indexed=indexed, cache_size=cache) for indexed, cache in VARIANTS]
    live = {}
    for i, f in enumerate(filter_list):
        live[i] = f
        for index in indexes:
            index.register(i, f, receivers[i])

    def check_all():
        for m in messages + messages:  # twice: the second round hits the cache
            want = [k for k, f in live.items() if expected(f, m, receivers[k])]
            for index in indexes:
                got = index.match(m)
                assert got == want, (index.indexed, index.cache_size, [live[k] and live[k].description for k in want])
                assert set(got) <= set(index.candidates(m))

    check_all()
    drop = [k for k, d in zip(sorted(live), drop_mask) if d]
    for k in drop:
        del live[k]
        for index in indexes:
            index.unregister(k)
    check_all()
    for k in drop[: len(drop) // 2]:  # back again: registration order is the new one
        live[k] = filter_list[k]
        for index in indexes:
            index.register(k, filter_list[k], receivers[k])
    check_all()


_message = _message_of


def test_equality_filters_are_looked_up_not_evaluated():
    index = SubscriptionIndex(cache_size=0)
    for i in range(1000):
        index.register(i, compile_selector(f"customer = 'c{i}'"))
    index.register("n", compile_selector("n = 5 AND colour LIKE 'r%'"))
    index.register("like", compile_selector("customer LIKE 'c1%'"))
    assert index.match(_message(customer="c7")) == [7]
    assert index.candidates(_message(customer="c7")) == [7, "like"]
    assert index.match(_message(n=5.0, colour="red")) == ["n"]  # 5 = 5.0 in JMS
    assert index.match(_message(n="5", colour="red")) == []  # '5' never equals 5
    assert index.candidates(_message(n="5", colour="red")) == ["like"]
    assert index.match(_message(customer="c12")) == [12, "like"]
    stats = index.stats()
    assert stats["messages"] == 6 and stats["filters"] == 1002 and stats["unindexed_filters"] == 1
    assert stats["candidates_per_message"] <= 2 and stats["evaluations_per_message"] <= 2


def test_bindings_and_property_filters_are_indexed():
    def fs(name, value):
        return compile_filter_set({symbol("f"): described(name, value)})

    assert index_terms(fs("apache.org:legacy-amqp-direct-binding:string", "a.b")) == (("subject", None, "a.b"),)
    assert index_terms(fs("apache.org:legacy-amqp-topic-binding:string", "a.*")) == (("topic", None, "a.*"),)
    assert index_terms(fs("apache.org:legacy-amqp-topic-binding:string", "#")) is None  # every message
    headers_any = fs("apache.org:legacy-amqp-headers-binding:map", {"x-match": "any", "a": "1", "b": t.int32(2)})
    assert set(index_terms(headers_any)) == {("app", "a", "1"), ("app", "b", 2.0)}
    assert index_terms(fs("apache.org:legacy-amqp-headers-binding:map", {"x-match": "any", "a": "1", "b": None})) is None
    assert index_terms(fs("amqp:application-properties-filter", {"a": "&p:x", "b": None})) is None  # prefix, NULL
    assert index_terms(fs("amqp:application-properties-filter", {"a": "&p:x", "b": "&&y"})) == (("app", "b", "&y"),)
    assert index_terms(fs("amqp:properties-filter", {symbol("subject"): "&s:x"})) is None
    assert index_terms(fs("amqp:properties-filter", {symbol("message-id"): t.ulong(3)})) == (("prop", "message_id", 3.0),)
    # a filter-set is an AND: its cheapest entry is enough
    both = compile_filter_set({symbol("s"): described("apache.org:selector-filter:string", "k IN ('a', 'b', 'c')"),
                               symbol("d"): described("apache.org:legacy-amqp-direct-binding:string", "x")})
    assert index_terms(both) == (("subject", None, "x"),)

    index = SubscriptionIndex()
    index.register("topic", fs("apache.org:legacy-amqp-topic-binding:string", "news.#"))
    index.register("direct", fs("apache.org:legacy-amqp-direct-binding:string", "news.uk"))
    index.register("headers", headers_any)
    assert index.match(_message("news.uk")) == ["topic", "direct"]
    assert index.match(_message("sport", b=t.int32(2))) == ["headers"]
    assert index.match(_message("sport", b=2)) == ["headers"]  # headers: integers by value (long 2 = int 2)
    assert index.match(_message("sport", b=2.0)) == []  # ... but never a floating value
    assert index.candidates(_message("sport")) == []
    for k, pattern in enumerate(("news.uk", "*.uk", "#.uk", "news.*")):  # several trie nodes: registration order
        index.register(k, fs("apache.org:legacy-amqp-topic-binding:string", pattern))
    assert index.match(_message("news.uk")) == ["topic", "direct", 0, 1, 2, 3]


def test_cache_is_bounded_and_dropped_on_change():
    index = SubscriptionIndex(cache_size=4)
    for i in range(10):
        index.register(i, compile_selector(f"customer = 'c{i}'"))
    for _ in range(3):
        for i in range(10):
            assert index.match(_message(customer=f"c{i % 3}")) == [i % 3]
    assert len(index._cache) <= 4
    assert index.stats()["cache_hit_rate"] == pytest.approx(27 / 30)
    index.register("late", compile_selector("customer = 'c1'"))  # a cached list must not hide it
    assert index.match(_message(customer="c1")) == [1, "late"]
    index.unregister(1)
    assert index.match(_message(customer="c1")) == ["late"]


def test_unreadable_messages_fall_back_to_every_filter():
    index = SubscriptionIndex()
    index.register("a", compile_selector("customer = 'c1'"))
    index.register("all", None)
    assert index.candidates(None) == ["a", "all"]
    assert index.match(None) == ["all"]  # a filter that cannot read the message selects nothing


@pytest.mark.parametrize("value, key", [("x", "x"), (t.symbol("x"), "x"), (5, 5), (5.0, 5), (t.ubyte(5), 5),
                                        (5.5, None), (True, None), (None, None), (math.nan, None)])
def test_index_key(value, key):
    assert index_key(value) == key and isinstance(index_key(value), type(key))


@pytest.mark.parametrize("a, b, same", [(t.uint(10), 10.0, True), ("x", t.symbol("x"), True), (True, 1, False),
                                        (t.timestamp(5), 5, False), (b"5", "5", False), (1, t.ulong(1), True)])
def test_exact_key(a, b, same):
    assert (exact_key(a) == exact_key(b)) is same
    assert exact_key(math.nan) is None and exact_key({}) is None
