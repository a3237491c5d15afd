"""The permission model (`broker_filter.authorization`) and its configuration (`[security]`), as tables.

Each decision table row is (settings, user, roles, operation, address, expected); the settings are
`(match, {operation: roles})` in file order.  A naive reference (word recursion and a port of Artemis's
`MatchComparator`) checks the trie and the specificity order under hypothesis, and an enumeration of
concrete addresses checks that an address with wildcard words is never granted more than the
addresses it stands for.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import re
import textwrap
import tomllib
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_filter import config as cfg
from broker_filter.authorization import (
    OPERATIONS,
    Grant,
    PatternError,
    Permissions,
    covers,
    intersects,
    management_checks,
    node_of,
    open_warning,
)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def permissions(rows, roles=None, upstream="embedded", **kw) -> Permissions:
    grants = [Grant(i, match, {op: frozenset(grant.get(op, ())) for op in OPERATIONS})
              for i, (match, grant) in enumerate(rows)]
    return Permissions(grants, roles or {}, upstream, **kw)


def everything(*roles):
    return {op: roles for op in OPERATIONS}


# ------------------------------------------------------------------------------------------ decisions

TEAMS = [
    ("#", {"browse": ["auditor"]}),
    ("alice.#", {"send": ["alice-team"], "consume": ["alice-team"], "browse": ["alice-team", "auditor"]}),
    ("alice.private.#", {"send": ["alice-team"], "consume": ["alice-team"]}),
    ("/topic/news.#", {"send": ["staff"], "consume": ["staff"], "durable": ["staff"]}),
    ("/topic/alice.#", {"consume": ["alice-team"]}),
]
TEAM_ROLES = {"alice": ["alice-team", "staff"], "bob": ["staff"], "audit": ["auditor"]}

# (upstream, user, operation, address, expected)
TEAM_DECISIONS = [
    # every permission granted and refused, in front of RabbitMQ
    ("rabbitmq", "alice", "send", "/queue/alice.orders", True),
    ("rabbitmq", "bob", "send", "/queue/alice.orders", False),
    ("rabbitmq", "alice", "consume", "/queues/alice.orders", True),
    ("rabbitmq", "bob", "consume", "/queues/alice.orders", False),
    ("rabbitmq", "audit", "browse", "alice.orders", True),
    ("rabbitmq", "audit", "consume", "alice.orders", False),
    ("rabbitmq", "audit", "browse", "alice.private.x", False),  # not inherited from alice.#
    ("rabbitmq", "alice", "browse", "alice.private.x", False),  # ... nor for alice
    ("rabbitmq", "alice", "consume", "alice.private.x", True),
    ("rabbitmq", "audit", "browse", "bob.anything", True),  # `#`
    ("rabbitmq", "bob", "browse", "bob.anything", False),
    ("rabbitmq", "alice", "manage", "/queues/alice.orders", False),
    ("rabbitmq", "bob", "durable", "/topic/news.uk", True),
    ("rabbitmq", "audit", "durable", "/topic/news.uk", False),
    ("rabbitmq", "bob", "send", "/topic/news.uk", True),
    ("rabbitmq", "bob", "send", "/exchange/amq.topic/news.uk", True),
    ("rabbitmq", "bob", "send", "/exchanges/amq.topic/news.uk", True),
    ("rabbitmq", "bob", "consume", "/exchanges/amq.topic/news", True),  # `#` takes zero words
    ("rabbitmq", "bob", "send", "/topic/sport", False),
    ("rabbitmq", "anonymous", "browse", "bob.x", False),
    (None and "rabbitmq" or "rabbitmq", None, "browse", "bob.x", False),  # None: the anonymous login
    # the case: bob subscribes to alice's keys, or to every key
    ("rabbitmq", "bob", "consume", "/exchange/amq.topic/alice.#", False),
    ("rabbitmq", "bob", "consume", "/topic/alice.x", False),
    ("rabbitmq", "bob", "consume", "/topic/#", False),  # `#` covers alice.* too
    ("rabbitmq", "alice", "consume", "/topic/#", False),  # only news.# and alice.# are granted
    ("rabbitmq", "bob", "consume", "/topic/news.*", True),
    ("rabbitmq", "bob", "consume", "/topic/news.#", True),
    ("rabbitmq", "alice", "consume", "/topic/alice.*", True),
    ("rabbitmq", "bob", "consume", "/topic/*.x", False),  # alice.x is under it
    # the same on the embedded broker (no RabbitMQ forms: `/topic/...` is a literal address there)
    ("embedded", "alice", "send", "alice.orders", True),
    ("embedded", "bob", "send", "anycast://alice.orders", False),
    ("embedded", "bob", "consume", "multicast://alice.orders", False),
    ("embedded", "audit", "browse", "alice.orders::q1", True),  # FQQN: decided as its address
    ("embedded", "audit", "browse", "alice.private.x::q1", False),
    ("embedded", "bob", "consume", "alice.*", False),  # a wildcard subscription
    ("embedded", "audit", "browse", "#", False),  # alice.private.# is under it
    ("embedded", "audit", "browse", "bob.#", True),
    ("embedded", "bob", "consume", "/topic/news.x", True),
    ("embedded", "bob", "consume", "/queue/alice.orders", False),  # a literal address: only `#` matches it
    ("other", "audit", "browse", "/queue/alice.orders", True),
]


@pytest.mark.parametrize("upstream, user, operation, address, expected", TEAM_DECISIONS)
def test_team_decisions(upstream, user, operation, address, expected):
    decide = permissions(TEAMS, TEAM_ROLES, upstream)
    assert decide.allows(user, None, operation, address) is expected
    assert (decide.explain(user, None, operation, address) is None) is expected


@pytest.mark.parametrize("operation", OPERATIONS)
def test_each_operation_is_granted_alone(operation):
    decide = permissions([("q.#", {operation: ["r"]})], {"u": ["r"]})
    for other in OPERATIONS:
        assert decide.allows("u", None, other, "q.a") is (other == operation)
        assert decide.allows("v", None, other, "q.a") is False
        assert decide.allows("v", frozenset({"r"}), other, "q.a") is (other == operation)  # roles given
        assert decide.allows("u", None, other, "p.a") is False  # no setting matches


def test_unknown_operation_is_a_programming_error():
    with pytest.raises(ValueError):
        permissions([("#", everything("r"))]).allows("u", None, "delete", "a")


def test_open_permissions_allow_everything_and_say_so():
    decide = Permissions.open()
    assert decide.is_open
    assert all(decide.allows(None, frozenset(), op, "anything") for op in OPERATIONS)
    assert decide.explain("bob", None, "consume", "/queues/x") is None
    assert not permissions([("#", {})]).is_open


def test_roles_may_be_any_iterable_and_users_without_roles_have_none():
    decide = permissions([("a", {"send": ["r"]})], {"u": ["r"]})
    assert decide.allows("x", ["r"], "send", "a")
    assert decide.allows("x", ("r",), "send", "a")
    assert not decide.allows("x", None, "send", "a")
    assert decide.roles_of("u") == frozenset({"r"}) and decide.roles_of(None) == frozenset()


# ------------------------------------------------------------------------------------------ specificity

# (settings in file order, address, index of the setting that decides); every setting grants the
# role "s<index>" everything, so the decider is the one role that is allowed.
SPECIFICITY = [
    # Artemis's documentation: the more specific match decides alone
    (["globalqueues.europe.#", "globalqueues.europe.orders.#"], "globalqueues.europe.orders.plastics", 1),
    (["globalqueues.europe.#", "globalqueues.europe.orders.#"], "globalqueues.europe.x", 0),
    (["#", "a.b", "a.*", "a.#"], "a.b", 1),  # exact before `*` before `#`
    (["#", "a.*", "a.#"], "a.c", 1),
    (["#", "a.#"], "a.c.d", 1),  # the longer `#` match
    (["a.#", "a.b.#"], "a.b.c", 1),
    (["alice.#", "*.private.#"], "alice.private.x", 1),  # Artemis compares `#` matches by length only
    (["*.private.#", "alice.#"], "alice.private.x", 0),
    (["*.b.c", "a.*.c"], "a.b.c", 1),  # the first word where one has `*`: the literal wins
    (["a.*.*", "*.b.c"], "a.b.c", 0),
    (["*.*.c", "a.*.*"], "a.b.c", 1),
    (["*.b.#", "a.b.#"], "a.b.x", 1),  # Artemis's tie (same length): the literal first, here
    (["a.b.#", "*.b.#"], "a.b.x", 0),
    (["a.b.c", "#"], "a.b.c", 0),
    (["#", "a"], "a", 1),
    (["a.#", "a"], "a", 1),
    (["a.#"], "a", 0),  # `#` takes zero words
    (["a.*"], "a.", 0),  # an empty word is a word
    (["a.*"], "a", None),
    (["a.*"], "a.b.c", None),
    (["a"], "A", None),  # case matters
    (["*"], "", None),  # the empty address has no word
    (["#"], "", 0),
    (["a.b", "a::q"], "a::q", 1),  # an FQQN's exact setting
    (["a", "a::q"], "a::r", 0),  # else its address's
    (["#", "a::q"], "a.b::q", 0),
    (["a.b", "a.#"], "anycast://a.b", 0),
]


@pytest.mark.parametrize("matches, address, decider", SPECIFICITY)
def test_the_most_specific_match_decides(matches, address, decider):
    decide = permissions([(m, everything(f"s{i}")) for i, m in enumerate(matches)])
    allowed = [i for i in range(len(matches)) if decide.allows("u", frozenset({f"s{i}"}), "send", address)]
    assert allowed == ([] if decider is None else [decider])


def test_specificity_in_front_of_rabbitmq_is_per_node():
    rows = [("#", everything("all")), ("/queues/#", everything("queues")), ("/exchanges/x", everything("x")),
            ("/exchanges/x/a.#", everything("xa"))]
    decide = permissions(rows, upstream="rabbitmq")

    def decider(address):
        return [r for r in ("all", "queues", "x", "xa") if decide.allows("u", frozenset({r}), "send", address)]

    assert decider("q") == ["queues"]  # a scoped `#` before the bare `#`
    assert decider("/exchange/x/b") == ["x"]
    assert decider("/exchange/x/a.b") == ["xa"]
    assert decider("/exchange/y/a.b") == ["all"]
    assert decider("/topic/a") == ["all"]


# (pattern, wildcard address, every address it stands for matches the pattern, some does)
COVERS = [
    ("a.#", "a.b", True, True),
    ("a.#", "a.*", True, True),
    ("a.#", "a.#", True, True),
    ("a.#", "#", False, True),
    ("a.#", "#.a.#", False, True),
    ("a.*", "a.#", False, True),
    ("*.#", "#", False, True),  # `#` stands for the empty address too
    ("#", "#.a", True, True),
    ("a.b", "*.b", False, True),
    ("a.b", "*.c", False, False),
    ("a", "#", False, True),
    ("*", "*", True, True),
    ("*.*", "#", False, True),
    ("a.*", "*.a", False, True),
    ("b.#", "a.#", False, False),
    ("a.b.#", "a.#", False, True),
    ("*.b", "#.b", False, True),
    ("*.*.#", "*.#.*", True, True),
    ("*.*", "*.#.*", False, True),
    ("a.*.#", "a.#.b", True, True),
    ("a.*.*", "a.#.b", False, True),  # `a.b` is under it, and has no third word
]


@pytest.mark.parametrize("pattern, address, covered, met", COVERS)
def test_covers_and_intersects(pattern, address, covered, met):
    assert covers(tuple(pattern.split(".")), tuple(address.split("."))) is covered
    assert intersects(tuple(pattern.split(".")), tuple(address.split("."))) is met


# ------------------------------------------------------------------------------------------ address forms

# Groups of addresses that name one node in front of RabbitMQ, and what it is shown as.
RABBITMQ_SAME_NODE = [
    ("/queues/alice.private", ["alice.private", "/queue/alice.private", "/amq/queue/alice.private",
                               "/queues/alice.private", "/queues/alice%2Eprivate", "/queues/alice%2eprivate",
                               "/queues/%61lice.private", "/exchange/amq.default/alice.private"]),
    ("/queues/a/b", ["a%2Fb", "/queue/a%2Fb", "/amq/queue/a%2Fb", "/queues/a%2Fb", "/queues/a%2fb", "/queues/a/b"]),
    ("/queues/a%2fb", ["a%2fb", "/queue/a%2fb", "/queues/a%252fb"]),  # v1 unescapes `%2F` only; v2 decodes once
    ("/queues/my queue", ["my queue", "/queues/my%20queue"]),
    ("/queues/é", ["é", "/queues/%C3%A9"]),
    ("/exchanges/amq.topic/news.uk", ["/topic/news.uk", "/exchange/amq.topic/news.uk",
                                      "/exchanges/amq.topic/news.uk", "/exchanges/amq%2Etopic/news%2Euk"]),
    ("/exchanges/x/#", ["/exchange/x", "/exchange/x/", "/exchanges/x", "/exchanges/x/", "/exchange/x/#"]),
    ("/queues/#", ["", "/queue", "/exchange/amq.default", "/queues/%23"]),
    ("/exchanges/x/a/b", ["/exchange/x/a%2Fb", "/exchanges/x/a%2Fb"]),
    ("/exchanges/amq.fanout/#", ["/exchange/amq.fanout/news.x", "/exchanges/amq.fanout/k", "/exchange/amq.fanout"]),
    ("/exchanges/amq.match/#", ["/exchange/amq.match/k", "/exchanges/amq.match"]),  # headers: keys do not route
]


@pytest.mark.parametrize("shown, addresses", RABBITMQ_SAME_NODE)
def test_every_spelling_of_a_rabbitmq_node_is_one_node(shown, addresses):
    nodes = {node_of(a, "rabbitmq") for a in addresses}
    assert len(nodes) == 1 and nodes.pop().shown == shown


def test_spellings_are_decided_alike():
    decide = permissions(TEAMS, TEAM_ROLES, "rabbitmq")
    for _, addresses in RABBITMQ_SAME_NODE:
        for user, op in itertools.product(("alice", "bob", "audit"), OPERATIONS):
            assert len({decide.allows(user, None, op, a) for a in addresses}) == 1, (user, op, addresses)


# Addresses RabbitMQ does not accept either (no node: refused whatever the settings).
RABBITMQ_NO_NODE = [
    "/queue/a/b", "/queue/alice.private/", "/queue/", "/amq/queue", "/amq/queue/", "/topic/", "/topic/a/b",
    "/exchange/", "/exchange//k", "/exchange/x/k/", "/exchanges/", "/exchanges/x/k/l", "/exchanges/amq.default/q",
    "/exchanges//q", "/queues/", "/queues/a%2", "/queues/a%zz", "/queues/%FF", "a/b", "anycast://a",
    "/temp-queue/a", "/reply-queue/a", "/QUEUE/a", "/Queues/a",
]


@pytest.mark.parametrize("address", RABBITMQ_NO_NODE)
def test_addresses_rabbitmq_refuses_name_no_node(address):
    with pytest.raises(PatternError):
        node_of(address, "rabbitmq")
    decide = permissions([("#", everything("r"))], upstream="rabbitmq")
    assert not decide.allows("u", frozenset({"r"}), "send", address)
    assert "names no node in front of rabbitmq" in str(decide.explain("u", frozenset({"r"}), "send", address))


# Evasions: (settings, user roles, operation, address, expected), in front of RabbitMQ.  The site lets
# everyone do everything except on alice's queues and keys.
OPEN_BUT_ALICE = [("#", everything("all")), ("alice.#", everything("alice")), ("/topic/alice.#", everything("alice")),
                  ("/exchanges/logs", everything("all"))]
EVASIONS = [
    ("/queues/alice%2Eprivate", False),  # percent-encoding (v2)
    ("/queues/alice%2eprivate", False),
    ("/queues/%61lice.private", False),
    ("/queue/alice%2Eprivate", True),  # v1 does not decode: the queue `alice%2Eprivate`, not alice's
    ("/queues/alice%252Eprivate", True),  # decoded once: the queue `alice%2Eprivate`
    ("/queues/Alice.private", True),  # case: another queue
    ("/queue/alice.private/", False),  # trailing slash: RabbitMQ refuses it, so do we
    ("/queues/alice.private/", False),  # v2: the queue `alice.private/`, under alice.# too
    ("/queues/alicex/", True),  # ... and `alicex/` is not
    ("alice", False),  # `#` takes zero words
    ("alice.", False),  # an empty word
    ("alice..x", False),
    (".alice.x", True),  # another queue
    ("/exchange/amq.default/alice.private", False),  # the default exchange routes to the queue
    ("/exchange/amq.default", False),  # ... by each message's subject: every queue
    ("/queue", False),  # the same
    ("", False),  # the empty address (v1): every queue too
    ("/topic/alice.x", False),
    ("/topic/alice.#", False),
    ("/topic/#", False),  # a binding key covering alice's keys
    ("/topic/*.x", False),
    ("/topic/#.x", False),  # `#` anywhere in a binding key
    ("/topic/news.#", True),
    ("/exchange/amq.topic", False),  # a sender without a key: each message's subject is the key
    ("/exchange/amq.topic/", False),
    ("/exchanges/amq.topic", False),
    ("/exchange/logs", True),  # ... allowed where every key is granted
    ("/exchange/amq.topic/alice%2Ex", True),  # v1 unescapes only %2F: the key `alice%2Ex` is not alice's
    ("/exchanges/amq.topic/alice%2Ex", False),  # v2 decodes it: `alice.x`
    ("/queues/alice#", True),  # `#` inside a word is a literal character
    ("/queues/alice.%23", False),  # ... and a wildcard word covers alice's queues
]


@pytest.mark.parametrize("address, expected", EVASIONS)
def test_evasions(address, expected):
    decide = permissions(OPEN_BUT_ALICE, upstream="rabbitmq")
    assert decide.allows("bob", frozenset({"all"}), "consume", address) is expected
    assert decide.allows("alice", frozenset({"all", "alice"}), "consume", address) is (address not in RABBITMQ_NO_NODE)


# RabbitMQ 4's /management requests: (method, to, body, the (operation, address) pairs to allow)
MANAGEMENT = [
    ("GET", "/queues/alice.x", None, [("manage", "/queues/alice.x")]),
    ("PUT", "/queues/alice%2Ex", None, [("manage", "/queues/alice.x")]),
    ("delete", "/queues/alice.x", None, [("manage", "/queues/alice.x")]),
    ("DELETE", "/queues/alice.x/messages", None, [("manage", "/queues/alice.x")]),  # purge
    ("DELETE", "/queues/bob/../alice.x", None, [("manage", "/queues/alice.x")]),  # RabbitMQ normalises the URI
    ("DELETE", "/queues/%2E%2E/exchanges/x", None, [("manage", "/exchanges/x")]),
    ("DELETE", "/queues/a%2Fb", None, [("manage", "/queues/a%2Fb")]),
    ("PUT", "/exchanges/x", None, [("manage", "/exchanges/x")]),
    ("POST", "/bindings", {"source": "amq.topic", "binding_key": "alice.#", "destination_queue": "bobs"},
     [("manage", "/queues/bobs"), ("consume", "/exchanges/amq.topic/alice.%23")]),
    ("POST", "/bindings", {"source": "x", "binding_key": "", "destination_exchange": "y", "arguments": {}},
     [("manage", "/exchanges/y"), ("consume", "/exchanges/x/")]),
    ("DELETE", "/bindings/src=amq.topic;dstq=bobs;key=alice.%23;args=",
     None, [("manage", "/queues/bobs"), ("consume", "/exchanges/amq.topic/alice.%23")]),
    ("GET", "/bindings?src=amq.topic&dstq=my+q&key=a.b", None,
     [("manage", "/queues/my%20q"), ("consume", "/exchanges/amq.topic/a.b")]),
    ("PUT", "/auth/tokens", None, []),
]


@pytest.mark.parametrize("method, uri, body, checks", MANAGEMENT)
def test_management_requests_name_what_they_touch(method, uri, body, checks):
    assert list(management_checks(method, uri, body)) == checks


@pytest.mark.parametrize("method, uri, body", [
    ("POST", "/queues/a", None), ("GET", "/vhosts", None), ("DELETE", "/bindings/src=x", None),
    ("POST", "/bindings", {"source": "x"}), ("POST", "/bindings", None), ("GET", "/bindings?src=x", None),
    ("PUT", "queues/a", None), ("PUT", "/queues/a%zz", None),
])
def test_management_requests_rabbitmq_would_refuse(method, uri, body):
    with pytest.raises(PatternError):
        management_checks(method, uri, body)


def test_a_binding_is_allowed_as_a_subscription_would_be():
    decide = permissions(OPEN_BUT_ALICE + [("/queues/bobs", everything("bob"))], upstream="rabbitmq")
    bob = frozenset({"all", "bob"})

    def may(body):
        return all(decide.allows("bob", bob, op, address)
                   for op, address in management_checks("POST", "/bindings", body))

    assert may({"source": "amq.topic", "binding_key": "news.x", "destination_queue": "bobs"})
    assert not may({"source": "amq.topic", "binding_key": "alice.x", "destination_queue": "bobs"})
    assert not may({"source": "amq.topic", "binding_key": "#", "destination_queue": "bobs"})
    assert not may({"source": "amq.topic", "binding_key": "news.x", "destination_queue": "alice.q"})
    assert not may({"source": "", "binding_key": "alice.q", "destination_queue": "bobs"})  # the default exchange


def test_settings_that_grant_nothing_keep_rabbitmqs_own_nodes_out(tmp_path):
    config, _, _ = load(tmp_path, """
        [upstream]
        urls = ["amqp://h"]
        [security.roles]
        bob = ["all"]
        [[security.settings]]
        match = "#"
        send = ["all"]
        consume = ["all"]
        [[security.settings]]
        match = "/exchanges/amq.rabbitmq.trace"
        [[security.settings]]
        match = "broker-filter.durable.#"
    """)
    decide = Permissions.from_config(config, "rabbitmq")
    assert decide.allows("bob", None, "consume", "/exchange/amq.topic/x")
    for address in ("/exchange/amq.rabbitmq.trace/publish.amq.direct", "/exchanges/amq.rabbitmq.trace",
                    "/amq/queue/broker-filter.durable.c1.sub", "/queues/broker-filter%2Edurable.c1.sub", "/queue"):
        assert not decide.allows("bob", None, "consume", address), address
    assert decide.allows("bob", None, "consume", "/topic/#")  # amq.topic, not the trace exchange


# ------------------------------------------------------------------------------------------ explanations

EXPLANATIONS = [
    ("rabbitmq", "bob", "consume", "/queue/alice.private",
     "user bob may not consume from /queue/alice.private (/queues/alice.private): security.settings[2] match "
     "'alice.private.#' grants consume to roles: alice-team"),
    ("rabbitmq", "audit", "browse", "/queues/alice%2Eprivate",
     "user audit may not browse /queues/alice%2Eprivate (/queues/alice.private): security.settings[2] match "
     "'alice.private.#' grants browse to no role"),
    ("rabbitmq", "bob", "consume", "/topic/#",
     "user bob may not consume from /topic/# (/exchanges/amq.topic/#): security.settings[0] match "
     "'#' grants consume to no role"),
    ("rabbitmq", None, "durable", "/topic/news.uk",
     "user anonymous may not keep a durable subscription on /topic/news.uk (/exchanges/amq.topic/news.uk): "
     "security.settings[3] match '/topic/news.#' grants durable to roles: staff"),
    ("rabbitmq", "alice", "manage", "/queues/a/b%zz",
     "user alice may not manage /queues/a/b%zz: names no node in front of rabbitmq: bad percent-encoding in "
     "'a/b%zz'"),
    ("embedded", "bob", "send", "alice.orders",
     "user bob may not send to alice.orders: security.settings[1] match 'alice.#' grants send to roles: alice-team"),
]


@pytest.mark.parametrize("upstream, user, operation, address, text", EXPLANATIONS)
def test_a_refusal_says_who_what_where_and_which_setting(upstream, user, operation, address, text):
    decide = permissions(TEAMS, TEAM_ROLES, upstream)
    refusal = decide.explain(user, None, operation, address)
    assert str(refusal) == text
    assert refusal.operation == operation and refusal.address == address


def test_a_refusal_by_a_setting_that_covers_part_of_a_wildcard_address():
    decide = permissions(OPEN_BUT_ALICE, upstream="rabbitmq")
    assert str(decide.explain("bob", frozenset({"all"}), "consume", "/topic/#")) == (
        "user bob may not consume from /topic/# (/exchanges/amq.topic/#): security.settings[2] match "
        "'/topic/alice.#' covers part of it and grants consume to roles: alice")
    assert str(decide.explain("bob", frozenset({"all"}), "send", "/exchange/amq.topic")) == (
        "user bob may not send to /exchange/amq.topic (/exchanges/amq.topic/#): security.settings[2] match "
        "'/topic/alice.#' covers part of it and grants send to roles: alice")


def test_a_refusal_where_nothing_matches():
    decide = permissions([("a.#", everything("r"))])
    refusal = decide.explain("bob", None, "consume", "b")
    assert refusal.setting is None
    assert str(refusal) == ("user bob may not consume from b: no security setting matches it "
                            "(what is not granted is refused)")


# ------------------------------------------------------------------------------------------ cost and cache

def test_the_decision_cache_is_bounded():
    decide = permissions([("a.#", everything("r"))], cache_size=8)
    for i in range(100):
        assert decide.allows("u", frozenset({"r"}), "send", f"a.{i}")
    assert len(decide._cache) == 8
    uncached = permissions([("a.#", everything("r"))], cache_size=0)
    assert uncached.allows("u", frozenset({"r"}), "send", "a.b") and not uncached._cache


def test_long_addresses_are_decided_within_limits():
    decide = permissions([("#", everything("r")), ("a.#", {})], cache_size=8)
    deep = ".".join(["#"] * 65)
    assert not decide.allows("u", frozenset({"r"}), "send", deep)
    assert str(decide.explain("u", frozenset({"r"}), "send", deep)).endswith(
        "an address with wildcards and more than 64 words is not decided")
    assert decide.allows("u", frozenset({"r"}), "send", ".".join(["b"] + ["#"] * 3 + ["b"] * 60))
    assert decide.allows("u", frozenset({"r"}), "send", ".".join(["b"] * 100_000))  # concrete: the trie walk
    assert not decide.allows("u", frozenset({"r"}), "send", ".".join(["a"] * 100_000))
    assert all(len(address) <= 1024 for address in decide._cache)


def test_no_address_is_refused():
    decide = permissions([("#", everything("r"))])
    assert not decide.allows("u", frozenset({"r"}), "send", None)
    assert str(decide.explain("u", frozenset({"r"}), "send", None)) == (
        "user u may not send to None: names no node in front of embedded: not an address: None")


def test_one_configuration_compiles_for_each_upstream_kind():
    decide = permissions(OPEN_BUT_ALICE, {"bob": ["all"]}, "embedded")
    rabbit = decide.for_upstream("rabbitmq")
    assert rabbit is decide.for_upstream("rabbitmq") and rabbit.upstream == "rabbitmq"
    assert decide.allows("bob", None, "consume", "/queues/alice%2Eorders")  # a literal address there: `#`
    assert not rabbit.allows("bob", None, "consume", "/queues/alice%2Eorders")  # the queue alice.orders


# ------------------------------------------------------------------------------------------ configuration

def load(tmp_path, text, *flags, environ=None):
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent(text))
    args = argparse.Namespace(config=str(path), set=list(flags))
    return cfg.load(args, environ or {}), args, path


def test_the_section_loads_with_artemis_role_strings(tmp_path):
    config, _, _ = load(tmp_path, """
        [security.roles]
        alice = ["a", "b", "a"]
        bob = "b, c"
        [[security.settings]]
        match = "orders.#"
        send = "a, b"
        consume = ["c"]
    """)
    assert dict(config.security.roles) == {"alice": ("a", "b"), "bob": ("b", "c")}
    (setting,) = config.security.settings
    assert (setting.index, setting.match, setting.send, setting.consume, setting.browse) == (
        0, "orders.#", ("a", "b"), ("c",), ())
    assert config.security.enabled
    assert config.to_dict()["security"]["settings"][0]["send"] == ["a", "b"]
    decide = Permissions.from_config(config)
    assert decide.upstream == "embedded" and decide.allows("bob", None, "consume", "orders.x")


CONFIG_ERRORS = [
    ("[security]\nfoo = 1", "security.foo", "unknown setting"),
    ("[security]\nroles = 3", "security.roles", "must be a table"),
    ("[security.roles]\nalice = 3", "security.roles.alice", "must be a list of role names, got 3"),
    ("[security.roles]\nalice = [\"\"]", "security.roles.alice", "role names must not be empty"),
    ("[security]\nsettings = {}", "security.settings", "must be an array of tables"),
    ("[[security.settings]]\nsend = [\"a\"]", "security.settings[0].match", "must be a non-empty address pattern"),
    ("[[security.settings]]\nmatch = \"a\"\n[[security.settings]]\nmatch = \"\"", "security.settings[1].match",
     "must be a non-empty"),
    ("[[security.settings]]\nmatch = \"a\"\nsend = 1", "security.settings[0].send", "must be a list of role names"),
    ("[[security.settings]]\nmatch = \"a\"\nconsumer = []", "security.settings[0].consumer",
     "unknown setting (did you mean 'consume'?"),
    ("[[security.settings]]\nmatch = \"a\"\ncreateDurableQueue = [\"x\"]", "security.settings[0].createDurableQueue",
     "use `durable`"),
    ("[[security.settings]]\nmatch = \"a\"\ncreateNonDurableQueue = [\"x\"]",
     "security.settings[0].createNonDurableQueue", "granted with `consume`"),
    ("[[security.settings]]\nmatch = \"a\"\n[[security.settings]]\nmatch = \"a.#.b\"", "security.settings[1].match",
     "'a.#.b': `#` may only be the last word (as in Artemis)"),
    ("[[security.settings]]\nmatch = \"a::*\"", "security.settings[0].match", "matches exactly: no `*` or `#`"),
    ("[[security.settings]]\nmatch = \"" + "a." * 64 + "#\"", "security.settings[0].match", "more than 64 words"),
    ("[[security.settings]]\nmatch = \"a.#\"\n[[security.settings]]\nmatch = \"a.#\"", "security.settings[1].match",
     "names the same addresses as security.settings[0] (match 'a.#')"),
    ("[[security.settings]]\nmatch = \"a\"\n[listener.users]\nanonymous = \"$scrypt$ln=15,r=8,p=1$"
     "MvKqX9NRNf8Mg/0nywDmPw$lDSQxl4zLrlgmYZHp0fAFwB7061Ix7/+Br4Xss7kfck\"", "listener.users.anonymous",
     "the ANONYMOUS login's name"),
]


@pytest.mark.parametrize("toml, key, reason", CONFIG_ERRORS)
def test_configuration_errors_name_the_key(tmp_path, toml, key, reason):
    with pytest.raises(cfg.ConfigError) as e:
        load(tmp_path, toml)
    assert e.value.key == key
    assert reason in e.value.reason


RABBITMQ_CONFIG_ERRORS = [
    ("/queue/a/b", "in front of RabbitMQ: `/queue/` takes one queue name"),
    ("/exchanges/*/k", "in front of RabbitMQ: an exchange name in a match is literal"),
    ("/exchange/a.#/k", "in front of RabbitMQ: an exchange name in a match is literal"),
    ("/queues/a%zz", "in front of RabbitMQ: bad percent-encoding"),
    ("anycast://a", "in front of RabbitMQ: a bare queue name may not contain `/`"),
]


@pytest.mark.parametrize("match, reason", RABBITMQ_CONFIG_ERRORS)
def test_in_front_of_an_upstream_matches_must_be_rabbitmq_addresses_too(tmp_path, match, reason):
    toml = (f'[upstream]\nurls = ["amqp://h"]\n[[security.settings]]\nmatch = "x"\n'
            f'[[security.settings]]\nmatch = "{match}"')
    with pytest.raises(cfg.ConfigError) as e:
        load(tmp_path, toml)
    assert e.value.key == "security.settings[1].match" and reason in e.value.reason
    load(tmp_path, f'[[security.settings]]\nmatch = "{match}"')  # a literal address on the embedded broker


def test_two_spellings_of_one_node_are_one_match_too_many(tmp_path):
    with pytest.raises(cfg.ConfigError) as e:
        load(tmp_path, '[upstream]\nurls = ["amqp://h"]\n[[security.settings]]\nmatch = "q"\n'
                       '[[security.settings]]\nmatch = "/queues/q"')
    assert e.value.key == "security.settings[1].match"
    assert e.value.reason == ("'/queues/q' in front of RabbitMQ: names the same addresses as security.settings[0] "
                              "(match 'q'): both are /queues/q")


def test_reload_takes_new_settings_and_keeps_the_old_on_error(tmp_path):
    config, args, path = load(tmp_path, """
        [security.roles]
        bob = ["r"]
        [[security.settings]]
        match = "a.#"
        send = ["r"]
    """)
    before = Permissions.from_config(config)
    assert before.allows("bob", None, "send", "a.x") and not before.allows("bob", None, "send", "b.x")
    path.write_text('[security.roles]\nbob = ["r"]\n[[security.settings]]\nmatch = "b.#"\nsend = ["r"]\n'
                    '[limits]\nselector_length = 9\n')
    reloaded = cfg.reload_security(config, args, {})
    assert reloaded.error is None and reloaded.ignored == ("limits.selector_length",)
    assert reloaded.config.limits.selector_length == config.limits.selector_length  # needs a restart
    after = Permissions.from_config(reloaded.config)
    assert after.allows("bob", None, "send", "b.x") and not after.allows("bob", None, "send", "a.x")
    path.write_text('[[security.settings]]\nmatch = "b.#.c"\n')
    failed = cfg.reload_security(reloaded.config, args, {})
    assert failed.config is None
    assert str(failed.error) == "security.settings[0].match: 'b.#.c': `#` may only be the last word (as in Artemis)"
    path.write_text('[[security.settings]\n')
    assert cfg.reload_security(reloaded.config, args, {}).error.key == "config"


def test_reload_takes_users_too(tmp_path):
    config, args, path = load(tmp_path, "[security.roles]\n")
    hashed = ("$scrypt$ln=15,r=8,p=1$MvKqX9NRNf8Mg/0nywDmPw$lDSQxl4zLrlgmYZHp0fAFwB7061Ix7/+Br4Xss7kfck")
    path.write_text(f'[listener.users]\nalice = "{hashed}"\n')
    reloaded = cfg.reload_security(config, args, {})
    assert dict(reloaded.config.listener.users) == {"alice": hashed} and reloaded.ignored == ()


def test_open_warning_beyond_loopback(tmp_path):
    config, _, _ = load(tmp_path, "[listener]\nhost = \"0.0.0.0\"\nallow_anonymous = true\n")
    assert "every client that logs in on 0.0.0.0 may send" in open_warning(config)
    assert open_warning(load(tmp_path, "")[0]) is None
    secured, _, _ = load(tmp_path, "[listener]\nhost = \"0.0.0.0\"\nallow_anonymous = true\n"
                                   "[[security.settings]]\nmatch = \"#\"\n")
    assert open_warning(secured) is None


# The worked example of docs/security.md, as shipped in config/broker-filter-secure.toml.
SHIPPED = [
    ("alice", "send", "/queues/team-a.orders", True),
    ("alice", "consume", "team-a.orders", True),
    ("alice", "manage", "/queues/team-a.orders", True),
    ("bob", "consume", "/queue/team-a.orders", False),
    ("bob", "send", "/queues/team-a%2Eorders", False),
    ("bob", "consume", "/queues/team-b.orders", True),
    ("audit", "browse", "team-a.orders", True),
    ("audit", "consume", "team-a.orders", False),
    ("audit", "browse", "team-a.private.salaries", False),
    ("audit", "browse", "team-b.orders", True),
    ("audit", "browse", "elsewhere", True),
    ("audit", "consume", "/topic/news.today", True),
    ("audit", "send", "/topic/news.today", False),
    ("bob", "send", "/topic/news.today", True),
    ("bob", "durable", "/topic/news.#", True),
    ("bob", "consume", "/topic/#", False),
    ("bob", "manage", "/queues/team-b.orders", False),
    ("anonymous", "browse", "team-a.orders", False),
]


@pytest.mark.parametrize("user, operation, address, expected", SHIPPED)
def test_the_shipped_secure_configuration(user, operation, address, expected):
    path = os.path.join(ROOT, "config", "broker-filter-secure.toml")
    config = cfg.load(argparse.Namespace(config=path), {})
    assert not config.upstream.embedded
    decide = Permissions.from_config(config, "rabbitmq")
    assert decide.allows(user, None, operation, address) is expected


def test_the_worked_example_of_the_docs_is_the_shipped_one():
    text = open(os.path.join(ROOT, "docs", "security.md"), encoding="utf-8").read()
    block = re.search(r"## A worked example.*?```toml\n(.*?)```", text, re.S).group(1)
    documented = tomllib.loads(block)["security"]
    with open(os.path.join(ROOT, "config", "broker-filter-secure.toml"), "rb") as fh:
        shipped = tomllib.load(fh)["security"]
    assert documented == shipped


# ------------------------------------------------------------------------------------------ reference

WORDS = ("a", "b", "")


def ref_matches(pattern: list[str], words: list[str]) -> bool:
    """Word recursion, `*` and `#` anywhere (patterns and addresses alike)."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(ref_matches(rest, words[k:]) for k in range(len(words) + 1))
    return bool(words) and (head == "*" or head == words[0]) and ref_matches(rest, words[1:])


def split(text: str) -> list[str]:
    return [] if text == "" else text.split(".")


def artemis_compare(o1: str, o2: str) -> int:
    """Artemis's MatchComparator, line by line (with Python's split: Java's drops trailing empty
    strings, which makes Artemis's order depend on the argument order for such matches)."""
    if "#" in o1 and "#" not in o2:
        return 1
    if "#" not in o1 and "#" in o2:
        return -1
    if "#" in o1 and "#" in o2:
        return len(o2) - len(o1)
    if "*" in o1 and "*" not in o2:
        return 1
    if "*" not in o1 and "*" in o2:
        return -1
    if "*" in o1 and "*" in o2:
        left, right = o1.split("."), o2.split(".")
        for i in range(len(left)):
            if i >= len(right):
                return -1
            if left[i] == "*" and right[i] != "*":
                return 1
            if left[i] != "*" and right[i] == "*":
                return -1
    return len(o1) - len(o2)


def reference(matches: list[str], grants: list[frozenset], roles: frozenset, address: str) -> bool:
    found = [i for i, m in enumerate(matches) if ref_matches(split(m), split(address))]
    if not found:
        return False
    # ties (the comparator's 0) go to the literal-first star positions, then the file order
    found.sort(key=lambda i: (tuple(w == "*" for w in split(matches[i])), i))
    found.sort(key=functools.cmp_to_key(lambda i, j: artemis_compare(matches[i], matches[j])))
    return not roles.isdisjoint(grants[found[0]])


word = st.sampled_from(WORDS)
pattern = st.builds(lambda ws, tail: ".".join(ws + tail), st.lists(st.sampled_from(("a", "b", "*", "")), max_size=3),
                    st.sampled_from(([], ["#"])))
ROLE_SETS = st.frozensets(st.sampled_from(("r1", "r2")))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(pattern, ROLE_SETS), min_size=1, max_size=8, unique_by=lambda t: t[0]),
       st.lists(word, max_size=4), ROLE_SETS)
def test_the_trie_decides_as_the_reference(rows, address_words, roles):
    rows = [(m, g) for m, g in rows if m]
    address = ".".join(address_words)
    decide = permissions([(m, {"consume": g}) for m, g in rows])
    expected = reference([m for m, _ in rows], [g for _, g in rows], roles, address) if rows else False
    if rows:
        assert decide.allows("u", roles, "consume", address) is expected


CONCRETE = ("a", "b", "z", "")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(pattern, ROLE_SETS), min_size=1, max_size=6, unique_by=lambda t: t[0]),
       st.lists(st.sampled_from(("a", "b", "*", "#", "")), min_size=1, max_size=3), ROLE_SETS)
def test_a_wildcard_address_is_never_granted_more_than_its_addresses(rows, address_words, roles):
    rows = [(m, g) for m, g in rows if m]
    if not rows:
        return
    matches, grants = [m for m, _ in rows], [g for _, g in rows]
    decide = permissions([(m, {"consume": g}) for m, g in rows])
    address = ".".join(address_words)
    if not decide.allows("u", roles, "consume", address):
        return
    wild = split(address)  # (one empty word is no address: "" is zero words)
    for n in range(len(wild) + 3):
        for concrete in itertools.product(CONCRETE, repeat=n):
            if split(".".join(concrete)) == list(concrete) and ref_matches(wild, list(concrete)):
                assert reference(matches, grants, roles, ".".join(concrete)), ".".join(concrete)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab./%#*é 2F"), min_size=1, max_size=12))
def test_v1_v2_and_bare_spellings_of_a_queue_are_one_node(name):
    v2 = "/queues/" + quote(name, safe="")
    v1 = name.replace("/", "%2F")
    if "%2F" in name:  # v1 cannot spell a queue whose name has `%2F` in it
        return
    nodes = {node_of(a, "rabbitmq") for a in (v2, "/queue/" + v1, "/amq/queue/" + v1, v1)}
    assert len(nodes) == 1
