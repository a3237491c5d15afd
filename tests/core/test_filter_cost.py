"""Filter cost is bounded by construction (issue 43): topic and address wildcards match in time linear
in the name, whatever pattern is accepted; patterns beyond the word limit are refused with
amqp:invalid-field naming the limit.  Costs are checked by counting the matcher's steps, or against
the cost of reading the input in the same process with a generous factor, never by a clock alone."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_filter.amqp.message import Message
from broker_filter.broker import Broker, BrokerError
from broker_filter.broker.broker import MULTICAST
from broker_filter.filters import FilterError, LimitError, compile_filter_set
from broker_filter.filters.wildcards import MAX_PATTERN_WORDS, WildcardTrie, canonical, wildcard_matcher

pytestmark = pytest.mark.timeout(600)

TOPIC = "apache.org:legacy-amqp-topic-binding:string"
SMALL = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(pattern: str, name: str) -> bool:
    """The rule as stated, by dynamic programming over (pattern words, name words): `ok[j]` is whether
    the pattern's words so far match the name's first j words."""
    p = [] if pattern == "" else pattern.split(".")
    a = [] if name == "" else name.split(".")
    ok = [True] + [False] * len(a)
    for w in p:
        if w == "#":  # any number of words: true from the first true on
            seen = False
            ok = [seen := seen or x for x in ok]
        else:
            ok = [False] + [ok[j] and (w == "*" or w == a[j]) for j in range(len(a))]
    return ok[len(a)]


pattern_words = st.lists(st.sampled_from(["a", "b", "", "#", "*", "#", "*"]), max_size=7)
name_words = st.lists(st.sampled_from(["a", "b", "", "c"]), max_size=8)
as_text = st.builds(".".join, pattern_words)
names = st.builds(".".join, name_words)


@SMALL
@given(as_text, names)
def test_one_pattern_matcher_agrees_with_the_rule(pattern: str, name: str) -> None:
    assert wildcard_matcher(pattern)(name) is reference(pattern, name)


@SMALL
@given(as_text, names)
def test_canonical_form_means_the_same(pattern: str, name: str) -> None:
    c = canonical(pattern)
    assert reference(c, name) is reference(pattern, name)
    assert ".#.#." not in f".{c}." and ".#.*." not in f".{c}."  # no `#` runs, the `*`s before the `#`
    assert canonical(c) == c


@SMALL
@given(st.lists(as_text, min_size=1, max_size=6), st.lists(names, min_size=1, max_size=6))
def test_trie_agrees_with_the_rule(patterns: list[str], addresses: list[str]) -> None:
    trie = WildcardTrie(cache_size=2)
    for i, p in enumerate(patterns):
        trie.add(p, i, i)
    for a in addresses:
        assert set(trie.match(a)) == {i for i, p in enumerate(patterns) if reference(p, a)}, a
    for i, p in enumerate(patterns):
        trie.remove(p, i)
    assert len(trie) == 0 and trie.match(addresses[0]) == ()


@pytest.mark.parametrize(
    "pattern,expected",
    [("#.#", "#"), ("#.#.#.a", "#.a"), ("#.*", "*.#"), ("*.#.*.#", "*.*.#"), ("a.#.*.#.b.*", "a.*.#.b.*"),
     ("*.*", "*.*"), ("a.#", "a.#"), ("", "")],
)
def test_runs_of_hash_collapse(pattern: str, expected: str) -> None:
    assert canonical(pattern) == expected
    trie = WildcardTrie()
    trie.add(pattern, 1, 1)
    assert list(trie.patterns()) == [expected]


# ----------------------------------------------------------------------------- the worst accepted
SUBJECT_WORDS = 2000  # a 4 KB subject
WORST_KEYS = {
    "# x128": ".".join(["#"] * MAX_PATTERN_WORDS),
    "#.* x64": ".".join(["#", "*"] * (MAX_PATTERN_WORDS // 2)),
    "#.a x64": ".".join(["#", "a"] * (MAX_PATTERN_WORDS // 2)),
    "#.a x63 .b": ".".join(["#", "a"] * (MAX_PATTERN_WORDS // 2 - 1)) + ".#.b",
    "a.* x63 .#": ".".join(["a", "*"] * (MAX_PATTERN_WORDS // 2 - 1)) + ".a.#",
    "#.a.* x42 .b.#": "#." + ".".join(["a", "*"] * 42) + ".b.#",
    "* x127 .#": ".".join(["*"] * (MAX_PATTERN_WORDS - 1)) + ".#",
}
SUBJECTS = {
    "a x2000": ".".join(["a"] * SUBJECT_WORDS),
    "a.b x1000": ".".join(["a", "b"] * (SUBJECT_WORDS // 2)),
    "distinct": ".".join(f"w{i}" for i in range(SUBJECT_WORDS)),
}


def _best(fn, repeat: int = 7, number: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, time.process_time() - t0)
    return best / number


@pytest.mark.parametrize("key", list(WORST_KEYS), ids=list(WORST_KEYS))
def test_worst_accepted_topic_binding_costs_a_small_multiple_of_reading_the_subject(key: str) -> None:
    """Issue 43: a 1,900-`#` binding cost 14 ms a message.  Every accepted key now costs at most 20x
    splitting the subject into its words (what any topic binding must do), measured in this process."""
    binding = compile_filter_set({"t": {"descriptor": TOPIC, "value": WORST_KEYS[key]}})
    for subject in SUBJECTS.values():
        m = Message.from_json({"properties": {"subject": subject}})
        assert binding.matches(m) is reference(WORST_KEYS[key], subject)
        read = _best(lambda: subject.split("."))
        cost = _best(lambda: binding.matches(m))
        assert cost < 20 * read + 200e-6, (key, cost, read)  # +200 µs: a clock tick on a loaded box


@pytest.mark.parametrize("key", list(WORST_KEYS), ids=list(WORST_KEYS))
def test_trie_steps_are_linear_in_the_address_words(key: str) -> None:
    """The subscription trie's state visits per publish stay within a few per word for any accepted
    pattern (patterns with several `#` are matched apart, in one pass)."""
    trie = WildcardTrie(cache_size=0)
    trie.add(WORST_KEYS[key], 1, 1)
    trie.add("#.a", 2, 2)  # one `#`: in the trie, one loop node
    trie.add("a.*.#", 3, 3)
    for subject in SUBJECTS.values():
        before = trie.steps
        got = set(trie.match(subject))
        assert got == {k for k, p in ((1, WORST_KEYS[key]), (2, "#.a"), (3, "a.*.#")) if reference(p, subject)}
        assert trie.steps - before <= 4 * SUBJECT_WORDS, (key, trie.steps - before)


def test_many_single_hash_patterns_cost_one_state_each() -> None:
    trie = WildcardTrie(cache_size=0)
    for i in range(100):
        trie.add(f"#.w{i}", i, i)
    subject = ".".join(f"w{i % 100}" for i in range(SUBJECT_WORDS))
    before = trie.steps
    assert len(trie.match(subject)) == 1  # ends with w99
    assert trie.steps - before <= 3 * SUBJECT_WORDS


# ----------------------------------------------------------------------------- refusals
def test_a_topic_binding_beyond_the_word_limit_is_refused_naming_the_limit() -> None:
    key = ".".join(["#"] * 1900)  # 3.8 KB: issue 43's binding
    with pytest.raises(FilterError) as info:
        compile_filter_set({"topic": {"descriptor": TOPIC, "value": key}})
    e = info.value
    assert isinstance(e, LimitError) and e.condition == "amqp:invalid-field"
    assert e.describe() == "filter 'topic': topic binding key has 1900 words; the limit is 128 words"
    compile_filter_set({"topic": {"descriptor": TOPIC, "value": ".".join(["#"] * 128)}})  # at the limit: fine


def test_the_word_limit_is_a_filter_limit() -> None:
    from broker_filter.filters.parser import Limits

    with pytest.raises(LimitError, match="topic binding key has 5 words; the limit is 4 words"):
        compile_filter_set({"t": {"descriptor": TOPIC, "value": "a.b.c.d.#"}}, limits=Limits(max_pattern_words=4))


def test_a_wildcard_subscription_beyond_the_word_limit_is_refused_by_the_broker() -> None:
    broker = Broker()
    with pytest.raises(BrokerError) as info:
        broker.declare_queue(".".join(["#", "a"] * 100), "q1", MULTICAST)
    assert info.value.condition == "amqp:invalid-field"
    assert info.value.description == "wildcard address has 200 words; the limit is 128 words"
    assert "q1" not in broker.queues
    broker.declare_queue(".".join(["#", "a"] * 64), "q2", MULTICAST)  # at the limit: fine


# ----------------------------------------------------------------------------- selectors
SELECTOR_LIMIT = 4096  # the daemon's `limits.selector_length`
DAEMON_LIMITS = None


def _daemon_limits():
    from broker_filter.config import Limits as DaemonLimits

    return DaemonLimits().filter_limits()


def _fill(clause, sep: str, limit: int = SELECTOR_LIMIT) -> str:
    parts: list[str] = []
    k = 0
    while len(sep.join(parts + [clause(k)])) <= limit:
        parts.append(clause(k))
        k += 1
    return sep.join(parts)


def maximal_selectors(i: int) -> dict[str, str]:
    """Selectors at the length limit, distinct for each `i`, in the shapes that compile largest."""
    return {
        "equalities": _fill(lambda k: f"p{i}_{k} = 'v{k}'", " OR "),
        "comparisons and LIKE": _fill(lambda k: f"(a{k} > {i + k} AND b{k} LIKE 'x%y_{k}')", " OR "),
        "arithmetic": _fill(lambda k: f"a{k}+{i}*b{k} > c{k}-{k}", " AND "),
        "IN list": "x IN (" + _fill(lambda k: f"'{i}_{k}'", ",", SELECTOR_LIMIT - 7) + ")",
        "LIKE chain": _fill(lambda k: f"a{k} LIKE '{i}_{k}%x%y_'", " OR "),
        "short comparisons": _fill(lambda k: f"a<{i * 1000 + k}", " OR "),
        "BETWEEN": _fill(lambda k: f"x{k} BETWEEN {k} AND {i}", " OR "),
    }


def _traced(make) -> tuple[object, int]:
    import gc
    import tracemalloc

    from broker_filter.filters import selector

    selector.clear_cache()
    gc.collect()
    tracemalloc.start()
    try:
        kept = make()
        selector.clear_cache()
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return kept, size


@pytest.mark.parametrize("shape", list(maximal_selectors(0)), ids=list(maximal_selectors(0)))
def test_a_maximal_selector_compiles_to_a_bounded_size(shape: str) -> None:
    """Issue 43: a 4 KB selector compiled to ~430 KiB (up to 770 KiB for arithmetic).  Now within the
    cache's estimate for its length, and within 100 KiB except for chains of LIKEs (~115 KiB)."""
    from broker_filter.filters import compile_selector
    from broker_filter.filters.selector import estimated_size

    limits = _daemon_limits()
    texts = [maximal_selectors(i)[shape] for i in range(1, 9)]
    assert all(len(t) <= SELECTOR_LIMIT for t in texts)
    compile_selector(texts[0], "jms", limits)  # warm: grammar, regexes of the dialect
    kept, size = _traced(lambda: [compile_selector(t, "jms", limits) for t in texts[1:]])
    per = size / len(kept)
    assert per <= estimated_size(texts[1]), (shape, per)
    assert per <= (128 if shape == "LIKE chain" else 100) * 1024, (shape, per)
    m = Message.from_json({"application_properties": {"a0": 5, "x": "1_1"}})
    assert all(f.evaluate(m) in (True, False, None) for f in kept)


def test_compiled_selectors_keep_no_parse_tree_and_still_give_it() -> None:
    from broker_filter.filters import compile_selector
    from broker_filter.filters.index import equality_hint

    f = compile_selector("a = 'x' AND b IN ('1', '2') AND c > 3")
    assert f.ast.text == "a = 'x' AND b IN ('1', '2') AND c > 3"  # parsed again on demand
    assert f.ast is not f.ast
    assert equality_hint(f).key == "a"  # found once at compile time, no parse


def test_the_cache_is_bounded_in_bytes_and_memory_returns_when_links_drop_their_filters() -> None:
    """1,000 distinct maximal selectors compiled and held (as links hold them), then dropped: the cache
    holds at most its byte budget, by its estimate; the last 150 are traced to check the estimate
    against the memory actually kept."""
    import gc
    import tracemalloc

    from broker_filter.filters import compile_selector, selector

    limits = _daemon_limits()
    budget = 4 * 1024 * 1024
    old = selector.cache_budget()
    selector.set_cache_budget(budget)
    try:
        selector.clear_cache()
        texts = [maximal_selectors(i)["short comparisons"] for i in range(1000)]
        held = [compile_selector(t, "jms", limits) for t in texts[:850]]
        stats = selector.cache_stats()
        assert stats["bytes"] <= budget and 0 < stats["entries"] < 850
        gc.collect()
        tracemalloc.start()
        try:
            held += [compile_selector(t, "jms", limits) for t in texts[850:]]
            while_held = tracemalloc.get_traced_memory()[0]
            del held
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert selector.cache_stats()["bytes"] <= budget
        assert after <= budget, (after, budget)
        assert while_held > 3 * after  # the links' filters were the bulk, and are gone
        assert compile_selector(texts[-1], "jms", limits) is compile_selector(texts[-1], "jms", limits)  # a cache
    finally:
        selector.set_cache_budget(old)


def test_a_selector_larger_than_the_budget_is_compiled_but_not_cached() -> None:
    from broker_filter.filters import compile_selector, selector

    old = selector.cache_budget()
    selector.set_cache_budget(1000)
    try:
        selector.clear_cache()
        f = compile_selector("a = 1 OR b = 2")
        assert f.evaluate(Message.from_json({"application_properties": {"a": 1}})) is True
        assert selector.cache_stats()["entries"] == 0
    finally:
        selector.set_cache_budget(old)


# ----------------------------------------------------------------------------- LIKE
def _scan(v: str) -> int:
    return v.count("a")


@pytest.mark.parametrize(
    "pattern",
    ["%a" * 2000 + "%b", "%" + "a%" * 2000, "a%" * 1000 + "b", "%" + "_%" * 2000, "_" * 3000 + "%"],
    ids=["%a%a...%b", "%a%a...%", "a%a%...b", "%_%_...%", "___...%"],
)
def test_like_with_many_wildcards_stays_linear(pattern: str) -> None:
    """`%a%a%a...` never backtracks: greedy leftmost segments, each found once, in C."""
    from broker_filter.filters import compile_selector

    f = compile_selector(f"x LIKE '{pattern}'", "jms", _daemon_limits())
    value = "a" * 4000
    m = Message.from_json({"application_properties": {"x": value}})
    f.evaluate(m)
    cost = _best(lambda: f.evaluate(m))
    read = _best(lambda: _scan(value))
    # linear in what it reads: the value (in C) and the pattern's segments (a C search each)
    assert cost < 20 * read + 1e-6 * len(pattern) + 200e-6, (cost, read)
    longer = "a" * 16000
    m4 = Message.from_json({"application_properties": {"x": longer}})
    assert _best(lambda: f.evaluate(m4)) < 8 * cost + 200e-6  # 4x the value: at most ~4x the cost


def test_like_segments_mixing_underscore_are_bounded_per_selector() -> None:
    """The one LIKE form searched by a regex (a middle segment mixing `_` with characters, up to its
    length per character of the value) is bounded: 6 ms a message with a 2,000-character segment."""
    from broker_filter.filters import compile_selector

    with pytest.raises(LimitError) as info:
        compile_selector("x LIKE '%" + "a" * 1000 + "_" + "a" * 1000 + "b%'", "jms", _daemon_limits())
    assert info.value.condition == "amqp:invalid-field"
    assert info.value.message == (
        "LIKE patterns hold 2002 characters in segments between two % that mix _ with other characters; "
        "the limit is 32 per selector at line 1, column 8"
    )
    with pytest.raises(LimitError, match="hold 33 characters"):  # summed over the selector
        compile_selector(" OR ".join(["x LIKE '%a_a%'"] * 11), "jms", _daemon_limits())
    accepted = compile_selector("x LIKE '%" + "a" * 15 + "_" + "a" * 15 + "b%'", "jms", _daemon_limits())
    value = "a" * 4000
    m = Message.from_json({"application_properties": {"x": value}})
    assert accepted.evaluate(m) is False
    # first, last and `_`-only segments cost no search: not counted
    free = compile_selector("x LIKE '" + "a_" * 100 + "%" + "_%" * 100 + "b_" * 100 + "'", "jms", _daemon_limits())
    assert free.evaluate(m) is False
    assert compile_selector("x LIKE '%_%b_%'", "jms", _daemon_limits()).evaluate(
        Message.from_json({"application_properties": {"x": "zzbq"}})) is True
    cost = _best(lambda: accepted.evaluate(m))
    read = _best(lambda: _scan(value))
    assert cost < 32 * 20 * read + 200e-6, (cost, read)  # the limit's factor, in C


def test_sql_like_segments_are_bounded_too() -> None:
    from broker_filter.filters import compile_selector

    with pytest.raises(LimitError, match="the limit is 32 per selector"):
        compile_selector("x LIKE '%" + "a" * 40 + "_b%'", "amqp-sql", _daemon_limits())
