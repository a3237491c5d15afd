"""Candidate indexes for queue consumers with selectors.

Theory of operation: a selector whose top-level conjunction contains `key = 'text'` or
`key IN ('a', 'b')` (an application property against string literals) can only be TRUE for a message
whose application property `key` is a string equal to one of those literals.  Such a selector gets
an `EqualityHint`; the queue keeps a `PropertyIndex` for `key` (value -> sorted message sequence
numbers) while at least one consumer uses it, and the consumer walks only the candidate sequence
numbers instead of every message.  The index yields a superset: the consumer's full filter still
decides every candidate, so the index can never change a result, only skip messages that cannot
match.  Selectors without such a conjunct (ranges, LIKE, OR at the top) are scanned message by
message, each message at most once per consumer (see `queue`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Iterator

from sortedcontainers import SortedList

# Dialects whose `=` on strings is plain string equality (no implicit conversions).
_STRICT_DIALECTS = frozenset({"jms", "artemis"})


@dataclass(frozen=True)
class EqualityHint:
    """Only messages whose application property `key` is a string in `values` can match."""

    key: str
    values: frozenset[str]


def equality_hint(filter_: Any) -> EqualityHint | None:
    """The most selective equality hint of a compiled filter or filter-set, or None."""
    hints = [h for h in _hints(filter_) if h is not None]
    if not hints:
        return None
    return min(hints, key=lambda h: len(h.values))


def _hints(filter_: Any) -> Iterator[EqualityHint | None]:
    if filter_ is None:
        return
    entries = getattr(filter_, "entries", None)
    if entries is not None:  # a FilterSet is the AND of its entries
        for entry in entries:
            yield from _hints(entry.filter)
        return
    selector = getattr(filter_, "ast", None)
    if selector is None:
        return
    try:
        from ..filters import ast
    except ImportError:  # pragma: no cover - filter core absent
        return
    if not isinstance(selector, ast.Selector) or selector.expr is None:
        return
    if selector.dialect not in _STRICT_DIALECTS or selector.convert_strings:
        return
    for conjunct in _conjuncts(selector.expr, ast):
        yield _conjunct_hint(conjunct, ast)


def _conjuncts(node: Any, ast: Any) -> Iterator[Any]:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Binary) and n.op == "AND":
            stack.extend((n.right, n.left))
        else:
            yield n


def _conjunct_hint(node: Any, ast: Any) -> EqualityHint | None:
    def prop(n: Any) -> str | None:
        return n.key if isinstance(n, ast.Ident) and n.kind == "property" and isinstance(n.key, str) else None

    def text(n: Any) -> str | None:
        return n.value if isinstance(n, ast.Literal) and n.type == "string" and isinstance(n.value, str) else None

    if isinstance(node, ast.Binary) and node.op == "=":
        for a, b in ((node.left, node.right), (node.right, node.left)):
            key, value = prop(a), text(b)
            if key is not None and value is not None:
                return EqualityHint(key, frozenset({value}))
    if isinstance(node, ast.In) and not node.negated:
        key = prop(node.operand)
        values = [text(v) for v in node.values]
        if key is not None and values and all(v is not None for v in values):
            return EqualityHint(key, frozenset(values))
    return None


class PropertyIndex:
    """Application property `key` (string values only) -> sorted sequence numbers of messages."""

    __slots__ = ("key", "users", "_postings")

    def __init__(self, key: str):
        self.key = key
        self.users = 0
        self._postings: dict[str, SortedList] = {}

    def build(self, entries: Any) -> None:
        """Index `entries` (seq -> entry, in ascending seq order)."""
        lists: dict[str, list[int]] = {}
        key = self.key
        for seq, entry in entries.items():
            props = entry.stored.message_properties()
            if props:
                value = props.get(key)
                if isinstance(value, str):
                    lists.setdefault(str(value), []).append(seq)
        self._postings = {v: SortedList(seqs) for v, seqs in lists.items()}

    def add(self, seq: int, props: Any) -> None:
        if props:
            value = props.get(self.key)
            if isinstance(value, str):
                posting = self._postings.get(value)
                if posting is None:
                    posting = self._postings[str(value)] = SortedList()
                posting.add(seq)

    def discard(self, seq: int, props: Any) -> None:
        if props:
            value = props.get(self.key)
            if isinstance(value, str):
                posting = self._postings.get(value)
                if posting is not None:
                    posting.discard(seq)
                    if not posting:
                        del self._postings[value]

    def candidates(self, values: frozenset[str], after: int) -> Iterator[int]:
        """Sequence numbers > after whose value is in `values`, ascending."""
        lists = [self._postings[v] for v in values if v in self._postings]
        if not lists:
            return iter(())
        if len(lists) == 1:
            return lists[0].irange(minimum=after, inclusive=(False, True))
        return heapq.merge(*(p.irange(minimum=after, inclusive=(False, True)) for p in lists))
