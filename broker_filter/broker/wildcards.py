"""Wildcard subscriptions: which subscription patterns match a published address.

Theory of operation: AMQ address wildcards split a name into words on the delimiter (default `.`);
in a pattern `*` matches exactly one word and `#` zero or more words (`news.#` matches `news`,
`news.uk` and `news.uk.sport`; `news.*.sport` matches `news.uk.sport` only).  Patterns live in a
token trie, so matching an address costs O(words x branches actually present), independent of how
many subscriptions exist; `#` is handled by trying every split point, memoized per (node, word) so
a pattern such as `#.a.#.b` cannot go exponential.  Results are cached per address (bounded, and
dropped whenever the set of patterns changes) because publishers reuse a few addresses.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable

ANY_WORDS = "#"
ONE_WORD = "*"


def is_wildcard(name: str, delimiter: str = ".") -> bool:
    """True if `name` contains a wildcard word."""
    return any(w in (ANY_WORDS, ONE_WORD) for w in name.split(delimiter))


class _Node:
    __slots__ = ("children", "values")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.values: dict[Hashable, Any] = {}


class WildcardTrie:
    """Pattern -> values; `match(address)` returns every value whose pattern matches the address."""

    def __init__(self, delimiter: str = ".", cache_size: int = 4096):
        self.delimiter = delimiter
        self._root = _Node()
        self._cache: dict[str, tuple[Any, ...]] = {}
        self._cache_size = cache_size
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, pattern: str, key: Hashable, value: Any) -> None:
        node = self._root
        for word in pattern.split(self.delimiter):
            node = node.children.setdefault(word, _Node())
        if key not in node.values:
            self._count += 1
        node.values[key] = value
        self._cache.clear()

    def remove(self, pattern: str, key: Hashable) -> None:
        path = [self._root]
        words = pattern.split(self.delimiter)
        for word in words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        if path[-1].values.pop(key, None) is not None:
            self._count -= 1
        for depth in range(len(words), 0, -1):  # prune empty branches
            node = path[depth]
            if node.values or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._cache.clear()

    def match(self, address: str) -> tuple[Any, ...]:
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        found: dict[Hashable, Any] = {}
        if self._count:
            self._walk(self._root, address.split(self.delimiter), 0, found, set())
        result = tuple(found.values())
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[address] = result
        return result

    def _walk(self, node: _Node, words: list[str], i: int, found: dict, seen: set) -> None:
        if (id(node), i) in seen:
            return
        seen.add((id(node), i))
        children = node.children
        hash_child = children.get(ANY_WORDS)
        if hash_child is not None:
            for j in range(i, len(words) + 1):  # '#' swallows words[i:j]
                self._walk(hash_child, words, j, found, seen)
        if i == len(words):
            found.update(node.values)
            return
        word = words[i]
        exact = children.get(word) if word not in (ANY_WORDS, ONE_WORD) else None
        if exact is not None:
            self._walk(exact, words, i + 1, found, seen)
        star = children.get(ONE_WORD)
        if star is not None:
            self._walk(star, words, i + 1, found, seen)

    def patterns(self) -> Iterable[str]:
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, words = stack.pop()
            if node.values:
                yield self.delimiter.join(words)
            for w, child in node.children.items():
                stack.append((child, words + [w]))
