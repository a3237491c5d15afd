"""Candidate indexes for queue consumers with selectors.

Theory of operation: a selector whose top-level conjunction contains `key = 'text'` or
`key IN ('a', 'b')` (an application property against string literals) can only be TRUE for a message
whose application property `key` is a string equal to one of those literals.  Such a selector gets
an `EqualityHint` (the filter core's, `broker_filter.filters.index`, shared with the subscription
index); the queue keeps a `PropertyIndex` for `key` (value -> sorted message sequence
numbers) while at least one consumer uses it, and the consumer walks only the candidate sequence
numbers instead of every message.  The index yields a superset: the consumer's full filter still
decides every candidate, so the index can never change a result, only skip messages that cannot
match.  Selectors without such a conjunct (ranges, LIKE, OR at the top) are scanned message by
message, each message at most once per consumer (see `queue`).
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any, Iterator

from ..filters.index import EqualityHint, equality_hint, index_key

__all__ = ["EqualityHint", "PropertyIndex", "equality_hint", "index_key"]


class PropertyIndex:
    """Application property `key` -> ascending sequence numbers of the messages holding each value.

    Sequence numbers only grow at enqueue, so postings are plain appended lists (a lone seq is kept
    as a bare int: unique values such as ids are the common case and cost no list); removed messages
    are dropped lazily (readers skip seqs no longer in the queue) and a posting is compacted once
    half of it is dead, which keeps memory linear in the queue depth.

    An index over a deep queue is built in steps (`build_step`, a bounded amount of work per
    dispatch turn) over a snapshot of the seqs present when it was created; messages enqueued
    meanwhile are appended when the snapshot is done.  Until then (`ready` False) its consumers
    scan, which is always correct."""

    __slots__ = ("key", "users", "_postings", "_dead", "_todo", "_pos", "_pending")

    def __init__(self, key: str, entries: Any):
        self.key = key
        self.users = 0
        self._postings: dict[Any, int | list[int]] = {}
        self._dead: dict[Any, int] = {}
        self._todo: list[int] | None = list(entries)  # dict keys: ascending seqs
        self._pos = 0
        self._pending: list[int] = []

    @property
    def ready(self) -> bool:
        return self._todo is None

    def build_step(self, entries: Any, budget: int) -> int:
        """Index up to `budget` more messages; returns the work done."""
        todo = self._todo
        if todo is None:
            return 0
        postings = self._postings
        key = self.key
        stop = min(len(todo), self._pos + budget)
        get = entries.get
        for i in range(self._pos, stop):
            seq = todo[i]
            entry = get(seq)
            if entry is None:
                continue
            m = entry.stored.message
            props = getattr(m, "application_properties", None) if m is not None else None
            if props:
                value = props.get(key)
                k = value if type(value) is str else index_key(value)
                if k is not None:
                    posting = postings.get(k)
                    if posting is None:
                        postings[k] = seq
                    elif type(posting) is int:
                        postings[k] = [posting, seq]
                    else:
                        posting.append(seq)
        done = stop - self._pos
        self._pos = stop
        if stop == len(todo):
            self._todo = None
            pending, self._pending = self._pending, []
            for seq in pending:
                entry = get(seq)
                if entry is not None:
                    self.add(seq, entry.stored.message_properties())
        return done

    def add(self, seq: int, props: Any) -> None:
        if self._todo is not None:
            self._pending.append(seq)
            return
        if props:
            k = index_key(props.get(self.key))
            if k is not None:
                posting = self._postings.get(k)
                if posting is None:
                    self._postings[k] = seq
                elif type(posting) is int:
                    self._postings[k] = [posting, seq]
                else:
                    posting.append(seq)

    def discard(self, seq: int, props: Any, alive: Any) -> None:
        """Note that `seq` left the queue; `alive(seq)` tells which seqs are still there."""
        if props:
            k = index_key(props.get(self.key))
            posting = self._postings.get(k) if k is not None else None
            if posting is None:
                return
            if type(posting) is int:
                if posting == seq:
                    del self._postings[k]
                return
            dead = self._dead.get(k, 0) + 1
            if dead * 2 >= len(posting):
                live = [s for s in posting if s != seq and alive(s)]
                if len(live) > 1:
                    self._postings[k] = live
                elif live:
                    self._postings[k] = live[0]
                else:
                    del self._postings[k]
                self._dead.pop(k, None)
            else:
                self._dead[k] = dead

    def candidates(self, values: frozenset, after: int) -> Iterator[int]:
        """Sequence numbers > after whose value is in `values`, ascending (may include removed ones)."""
        lists = []
        for v in values:
            p = self._postings.get(v)
            if p is None:
                continue
            if type(p) is int:
                if p > after:
                    lists.append((p,))
            else:
                lists.append(p[bisect.bisect_right(p, after):])
        if not lists:
            return iter(())
        if len(lists) == 1:
            return iter(lists[0])
        return heapq.merge(*lists)
