import random
import tomllib
from pathlib import Path

import pytest

from broker_filter.broker import WildcardTrie, is_wildcard
from broker_filter.config import AddressRule
from broker_filter.proxy.routing import rule_matches
from broker_filter.filters import compile_filter_set
from broker_filter.amqp.message import Message

TOPIC_ROWS = tomllib.loads((Path(__file__).parents[1] / "core" / "data" / "topic.toml").read_text())["rows"]


def reference(pattern: str, address: str) -> bool:
    """Backtracking matcher used as the oracle for the trie."""
    p, a = pattern.split("."), address.split(".")

    def go(i, j):
        if i == len(p):
            return j == len(a)
        if p[i] == "#":
            return any(go(i + 1, k) for k in range(j, len(a) + 1))
        if j == len(a):
            return False
        return (p[i] == "*" or p[i] == a[j]) and go(i + 1, j + 1)

    return go(0, 0)


@pytest.mark.parametrize(
    "pattern,address,expected",
    [
        ("news.#", "news", True),
        ("news.#", "news.uk", True),
        ("news.#", "news.uk.sport", True),
        ("news.#", "newsx", False),
        ("news.*.sport", "news.uk.sport", True),
        ("news.*.sport", "news.sport", False),
        ("news.*.sport", "news.uk.eu.sport", False),
        ("#", "anything.at.all", True),
        ("#.sport", "news.uk.sport", True),
        ("#.a.b", "a.x.a.b", True),
        ("*", "a.b", False),
        ("a.#.b", "a.b", True),
        ("a.#.#.b", "a.x.y.b", True),
    ],
)
def test_amq_wildcard_semantics(pattern, address, expected):
    trie = WildcardTrie()
    trie.add(pattern, "q", "q")
    assert (trie.match(address) == ("q",)) is expected
    assert reference(pattern, address) is expected
    assert rule_matches(AddressRule(pattern), address) is expected


@pytest.mark.parametrize("pattern,name,expected", [pytest.param(*r, id=f"{r[0]!r}~{r[1]!r}") for r in TOPIC_ROWS])
def test_one_rule_for_subscriptions_address_rules_and_topic_bindings(pattern, name, expected):
    """RabbitMQ's topic-binding table (tests/core/data/topic.toml) holds for every wildcard user."""
    trie = WildcardTrie()
    trie.add(pattern, "q", "q")
    binding = compile_filter_set({"t": {"descriptor": "apache.org:legacy-amqp-topic-binding:string", "value": pattern}})
    assert (trie.match(name) == ("q",)) is expected
    assert rule_matches(AddressRule(pattern), name) is expected
    assert binding.matches(Message.from_json({"properties": {"subject": name}})) is expected


def test_trie_agrees_with_backtracking_oracle_on_random_patterns():
    rng = random.Random(7)
    words = ["a", "b", "c"]
    patterns = {".".join(rng.choice(words + ["*", "#"]) for _ in range(rng.randint(1, 4))) for _ in range(200)}
    trie = WildcardTrie(cache_size=8)
    for p in patterns:
        trie.add(p, p, p)
    for _ in range(500):
        address = ".".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
        assert set(trie.match(address)) == {p for p in patterns if reference(p, address)}, address


def test_remove_prunes_and_invalidates_cache():
    trie = WildcardTrie()
    trie.add("news.#", 1, "one")
    trie.add("news.*", 2, "two")
    assert set(trie.match("news.uk")) == {"one", "two"}
    trie.remove("news.#", 1)
    assert trie.match("news.uk") == ("two",)
    trie.remove("news.*", 2)
    assert trie.match("news.uk") == () and len(trie) == 0 and list(trie.patterns()) == []


def test_is_wildcard():
    assert is_wildcard("news.#") and is_wildcard("a.*.b") and not is_wildcard("a#b.c")
