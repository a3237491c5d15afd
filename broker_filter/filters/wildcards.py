"""Word wildcards: the one matching rule of legacy topic bindings, AMQ address wildcards (embedded
broker subscriptions, the journal's addresses) and the daemon's address rules.

The rule (RabbitMQ's topic exchange; AMQ's address wildcards are the same on every address a node
can have): a name is split into words on the delimiter (`.` by default), `""` is zero words and empty
words count (`a..b` is three words).  In a pattern `*` matches exactly one word and `#` zero or more
words, both only as whole words (`a#b` is a literal word): `news.#` matches `news`, `news.uk` and
`news.uk.sport`; `news.*.sport` matches `news.uk.sport` only; `#.a.b` matches `a.x.a.b`.

Theory of operation: patterns live in a token trie and an address is matched by running the trie as
an NFA: the state is the set of trie nodes reached so far; each word moves every node to its child
for that word and its `*` child, and a node reached through `#` also stays where it is (`#` takes
one more word).  After each step every node's `#` child joins the set (`#` takes no word).  The cost
is O(words x live nodes), independent of how many patterns exist and with no backtracking, so a
pattern such as `#.a.#.b` cannot go exponential.  One pattern is a trie with one path
(`wildcard_matcher`).  Results may be cached per address (bounded, dropped whenever the patterns
change) because publishers reuse a few addresses.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable

ANY_WORDS = "#"
ONE_WORD = "*"


def words(name: str, delimiter: str = ".") -> list[str]:
    """The words of a name or pattern: `""` is zero words, empty words count."""
    return [] if name == "" else name.split(delimiter)


def is_wildcard(name: str, delimiter: str = ".") -> bool:
    """True if `name` contains a wildcard word."""
    return any(w in (ANY_WORDS, ONE_WORD) for w in words(name, delimiter))


class _Node:
    __slots__ = ("children", "values", "loops")

    def __init__(self, loops: bool) -> None:
        self.children: dict[str, _Node] = {}
        self.values: dict[Hashable, Any] = {}
        self.loops = loops  # reached through `#`: may take further words


class WildcardTrie:
    """Pattern -> values; `match(address)` returns every value whose pattern matches the address.

    `cache_size`: addresses whose result is remembered (0: none)."""

    def __init__(self, delimiter: str = ".", cache_size: int = 4096):
        self.delimiter = delimiter
        self._root = _Node(False)
        self._cache: dict[str, tuple[Any, ...]] = {}
        self._cache_size = cache_size
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, pattern: str, key: Hashable, value: Any) -> None:
        node = self._root
        for word in words(pattern, self.delimiter):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == ANY_WORDS)
            node = child
        if key not in node.values:
            self._count += 1
        node.values[key] = value
        self._cache.clear()

    def remove(self, pattern: str, key: Hashable) -> None:
        path = [self._root]
        pattern_words = words(pattern, self.delimiter)
        for word in pattern_words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        if path[-1].values.pop(key, None) is not None:
            self._count -= 1
        for depth in range(len(pattern_words), 0, -1):  # prune empty branches
            node = path[depth]
            if node.values or node.children:
                break
            del path[depth - 1].children[pattern_words[depth - 1]]
        self._cache.clear()

    def match(self, address: str) -> tuple[Any, ...]:
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        found: dict[Hashable, Any] = {}
        if self._count:
            for node in self._states(words(address, self.delimiter)):
                found.update(node.values)
        result = tuple(found.values())
        if self._cache_size:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[address] = result
        return result

    def _states(self, address_words: list[str]) -> Iterable[_Node]:
        root = self._root
        states: Iterable[_Node] = _closure({id(root): root}) if ANY_WORDS in root.children else (root,)
        for word in address_words:
            step: list[_Node] = []
            for node in states:
                if node.loops:
                    step.append(node)
                children = node.children
                if children:
                    child = children.get(word)
                    if child is not None:
                        step.append(child)
                    child = children.get(ONE_WORD)
                    if child is not None:
                        step.append(child)
            if not step:
                return ()
            if len(step) > 1 or ANY_WORDS in step[0].children:  # dedupe, and `#` taking no word
                states = _closure({id(n): n for n in step})
            else:
                states = step
        return states

    def patterns(self) -> Iterable[str]:
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            if node.values:
                yield self.delimiter.join(path)
            for w, child in node.children.items():
                stack.append((child, path + [w]))


def _closure(nodes: dict[int, _Node]) -> Iterable[_Node]:
    """`nodes` (by id) plus every node reachable from them through `#` children (`#` taking no word)."""
    for node in list(nodes.values()):
        child = node.children.get(ANY_WORDS)
        while child is not None and id(child) not in nodes:
            nodes[id(child)] = child
            child = child.children.get(ANY_WORDS)
    return nodes.values()


def wildcard_matcher(pattern: str, delimiter: str = ".") -> Callable[[str], bool]:
    """A predicate on names: does `pattern` match the name?"""
    if not is_wildcard(pattern, delimiter):
        return lambda name: name == pattern
    if pattern == ANY_WORDS:
        return lambda name: True
    trie = WildcardTrie(delimiter, cache_size=0)
    trie.add(pattern, True, True)
    return lambda name: bool(trie.match(name))
