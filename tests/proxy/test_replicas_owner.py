"""The owner of a queue among replicas (rendezvous hashing, proxy/replicas.py): the same wherever it
is computed, spread over the replicas, and only the queues of a replica that left move."""

from __future__ import annotations

from collections import Counter

from broker_filter.proxy.replicas import normal, owner_of

PEERS = ["bf-0.bf:5672", "bf-1.bf:5672", "bf-2.bf:5672", "bf-3.bf:5672"]
QUEUES = [f"/queue/orders-{i}" for i in range(2000)]


def test_every_replica_computes_the_same_owner_whatever_the_order_of_its_list():
    for q in QUEUES[:200]:
        assert owner_of(q, PEERS) == owner_of(q, list(reversed(PEERS))) == owner_of(q, PEERS[2:] + PEERS[:2])


def test_queues_spread_over_the_replicas():
    counts = Counter(owner_of(q, PEERS) for q in QUEUES)
    assert set(counts) == set(PEERS)
    assert min(counts.values()) > len(QUEUES) / len(PEERS) * 0.8


def test_only_the_queues_of_a_replica_that_left_move_and_they_come_back_when_it_returns():
    before = {q: owner_of(q, PEERS) for q in QUEUES}
    rest = [p for p in PEERS if p != PEERS[1]]
    after = {q: owner_of(q, rest) for q in QUEUES}
    for q in QUEUES:
        if before[q] != PEERS[1]:
            assert after[q] == before[q], q
        else:
            assert after[q] in rest
    assert {q: owner_of(q, PEERS) for q in QUEUES} == before


def test_no_live_replica_no_owner_and_peer_names_are_normalised():
    assert owner_of("/queue/a", []) is None
    assert normal(" bf-0.bf:5672") == "bf-0.bf:5672"
    assert normal("[::1]:5672") == "[::1]:5672"
