"""Filter-sets on Spark: legacy bindings, and/or/not, selectors inside them — against the core."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_filter.amqp import types as t
from broker_filter.amqp.types import Described, symbol
from broker_filter.filters import compile_filter_set
from broker_filter.filters.bindings import topic_binding
from broker_filter.amqp.message import Message, Properties
from broker_filter.spark.compile import CompiledSelector, compile_filter_set as spark_filter_set, topic_condition

pytestmark = pytest.mark.spark

SELECTOR = "apache.org:selector-filter:string"


def message(subject=None, **props) -> Message:
    return Message(
        properties=None if subject is None else Properties(subject=subject),
        application_properties=props or None,
    )


MESSAGES = [
    message(),
    message("a.b", color="red", n=t.int32(1)),
    message("a.b.c", color="blue", n=1, f=float("nan")),
    message("", color=t.symbol("red"), n=t.ubyte(1), x=b"\x01"),
    message("x", **{"x-y": "z", "dec": t.decimal64("1.0"), "f": t.float32(0.5)}),
]

FILTER_SETS = [
    {"jms-selector": Described(symbol(SELECTOR), "color = 'red'")},
    {"d": Described(symbol("apache.org:legacy-amqp-direct-binding:string"), "a.b")},
    {"t": Described(t.ulong(0x0000468C00000001), "a.#")},
    {"t": Described(symbol("apache.org:legacy-amqp-topic-binding:string"), "#")},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"color": "red", "n": t.int32(1)})},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"x-match": "any", "color": "blue", "n": t.ubyte(1)})},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"x-match": "all-with-x", "x-y": "z"})},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"x-y": "nothing", "x": None})},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"dec": t.decimal64("1.00")})},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"f": t.float32(0.5), "x-match": "any"})},
    {"h": Described(symbol("apache.org:legacy-amqp-headers-binding:map"), {"x": b"\x01"})},
    {
        "o": Described(
            symbol("apache.org:or-filter:list"),
            [Described(symbol(SELECTOR), "n > 0"), Described(symbol("apache.org:not-filter:list"), [Described(symbol(SELECTOR), "color = 'red'")])],
        ),
        "no-local": Described(symbol("apache.org:no-local-filter:list"), "NoLocalFilter{}"),
    },
    {
        "a": {"descriptor": "apache.org:and-filter:list", "value": [
            {"descriptor": SELECTOR, "value": "n = 1"},
            {"descriptor": "0x0000468C:0x00000002", "value": {"type": "map", "value": [["n", {"type": "int", "value": 1}]]}},
        ]},
        "s": {"descriptor": 0x0000468C00000004, "value": "f IS NULL OR f > 0"},
    },
]


def test_filter_sets_agree_with_the_core(evaluate_on_spark):
    compiled = [compile_filter_set(fs) for fs in FILTER_SETS]
    results = evaluate_on_spark([spark_filter_set(c) for c in compiled], MESSAGES)
    wrong = []
    for fs, c, got in zip(FILTER_SETS, compiled, results):
        want = [c.evaluate(m) for m in MESSAGES]
        if want != got:
            wrong.append(f"{fs!r}: core {want}, spark {got}")
    assert not wrong, "\n".join(wrong)
    assert {v for row in results for v in row} == {True, False, None}


WORDS = st.sampled_from(["a", "b", "", "*", "#", "a*", "x#"])


def test_topic_keys_agree_with_the_core(evaluate_on_spark):
    cases: list[tuple[str, str | None]] = []

    @settings(max_examples=300, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(WORDS, max_size=4).map(".".join), st.none() | st.lists(st.sampled_from(["a", "b", "", "a*"]), max_size=4).map(".".join))
    def draw(key, subject):
        cases.append((key, subject))

    draw()
    keys = sorted({k for k, _ in cases})
    subjects = [message(s) for s in sorted({s for _, s in cases if s is not None})] + [message()]
    results = evaluate_on_spark([CompiledSelector([], _as_col(topic_condition(k))) for k in keys], subjects)
    wrong = []
    for key, got in zip(keys, results):
        f = topic_binding(key)
        want = [f.evaluate(m) for m in subjects]
        if want != got:
            wrong.append(f"key {key!r}: core {want}, spark {got}")
    assert not wrong, "\n".join(wrong[:20])
    assert len(keys) > 50


def _as_col(c):
    from broker_filter.spark.sqlexpr import lit

    return lit(c) if isinstance(c, bool) else c
