"""Word wildcards: the one matching rule of legacy topic bindings, AMQ address wildcards (embedded
broker subscriptions, the journal's addresses) and the daemon's address rules.

The rule (RabbitMQ's topic exchange; AMQ's address wildcards are the same on every address a node
can have): a name is split into words on the delimiter (`.` by default), `""` is zero words and empty
words count (`a..b` is three words).  In a pattern `*` matches exactly one word and `#` zero or more
words, both only as whole words (`a#b` is a literal word): `news.#` matches `news`, `news.uk` and
`news.uk.sport`; `news.*.sport` matches `news.uk.sport` only; `#.a.b` matches `a.x.a.b`.

Theory of operation.  Every pattern is first put in canonical form (`canonical`): a run of wildcard
words holding k `*` and at least one `#` means "k or more words", so it becomes k `*` then one `#`
(`#.#` is `#`, `#.*.#` is `*.#`).  The cost of matching is then bounded by construction:
* one pattern (`wildcard_matcher`: topic bindings, address rules) is matched like a LIKE pattern
  over words: the pattern's literal words become characters of their own, `*` one-character
  wildcard and `#` a `%`, the name's words the same characters (an unknown word a filler), and
  `runtime.like_matcher`'s greedy leftmost segment placement decides in one pass, in C, without
  backtracking: O(name words x longest `#`-free segment) at worst, with a tiny constant.
* many patterns (`WildcardTrie`: the broker's subscriptions, the subscription index, the journal)
  live in a token trie run as an NFA: the state is the set of trie nodes reached so far; each word
  moves every node to its child for that word and its `*` child, and a node reached through `#`
  also stays where it is.  A pattern with more than one `#` would keep one live state per `#` for
  every word; such patterns are kept beside the trie and matched one by one as above, so the trie's
  patterns have at most one `#` and a publish costs O(words x live nodes) with one loop node per
  pattern at most, independent of how many patterns exist.  Results may be cached per address
  (bounded, dropped whenever the patterns change) because publishers reuse a few addresses.
Patterns are bounded in words where a client gives them (`check_pattern`, `MAX_PATTERN_WORDS`);
`steps` counts the trie's state visits, so tests can check the cost without a clock.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable

from .errors import LimitError
from .runtime import like_matcher

ANY_WORDS = "#"
ONE_WORD = "*"
# Words a pattern a client gives may have: RabbitMQ caps routing and binding keys at 255 bytes, so a
# key of more than 128 words is no key any broker could route; bounds the cost of one pattern.
MAX_PATTERN_WORDS = 128


def words(name: str, delimiter: str = ".") -> list[str]:
    """The words of a name or pattern: `""` is zero words, empty words count."""
    return [] if name == "" else name.split(delimiter)


def is_wildcard(name: str, delimiter: str = ".") -> bool:
    """True if `name` contains a wildcard word."""
    return any(w in (ANY_WORDS, ONE_WORD) for w in words(name, delimiter))


def canonical_words(pattern_words: list[str]) -> list[str]:
    """The pattern's words with every run of wildcards that holds a `#` as its `*`s then one `#`:
    the run matches "as many words as it has `*`, or more" either way."""
    out: list[str] = []
    i, n = 0, len(pattern_words)
    while i < n:
        w = pattern_words[i]
        if w != ANY_WORDS and w != ONE_WORD:
            out.append(w)
            i += 1
            continue
        stars, hashes = 0, 0
        while i < n and pattern_words[i] in (ANY_WORDS, ONE_WORD):
            if pattern_words[i] == ANY_WORDS:
                hashes += 1
            else:
                stars += 1
            i += 1
        out.extend([ONE_WORD] * stars)
        if hashes:
            out.append(ANY_WORDS)
    return out


def canonical(pattern: str, delimiter: str = ".") -> str:
    """The canonical form of a pattern: same matches, no `#` next to another wildcard's `#`, the
    `*`s of a run before its `#` (`#.#` -> `#`, `#.*` -> `*.#`, `a.#.*.#` -> `a.*.#`)."""
    ws = words(pattern, delimiter)
    if ANY_WORDS not in ws:
        return pattern
    return delimiter.join(canonical_words(ws))


def check_pattern(pattern: str, what: str, max_words: int = MAX_PATTERN_WORDS, delimiter: str = ".") -> None:
    """Refuse (`LimitError`: amqp:invalid-field) a pattern of more than `max_words` words."""
    count = 0 if pattern == "" else pattern.count(delimiter) + 1
    if count > max_words:
        raise LimitError(f"{what} has {count} words; the limit is {max_words} words")


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
        # canonical patterns with more than one `#`: pattern -> (matcher, {key: value})
        self._apart: dict[str, tuple[Callable[[list[str]], bool], dict[Hashable, Any]]] = {}
        self._cache: dict[str, tuple[Any, ...]] = {}
        self._cache_size = cache_size
        self._count = 0
        self.steps = 0  # trie states visited (one per live node and word) since creation

    def __len__(self) -> int:
        return self._count

    def add(self, pattern: str, key: Hashable, value: Any) -> None:
        pattern_words = canonical_words(words(pattern, self.delimiter))
        self._cache.clear()
        if pattern_words.count(ANY_WORDS) > 1:
            text = self.delimiter.join(pattern_words)
            entry = self._apart.get(text)
            if entry is None:
                entry = self._apart[text] = (_words_matcher(pattern_words), {})
            if key not in entry[1]:
                self._count += 1
            entry[1][key] = value
            return
        node = self._root
        for word in pattern_words:
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == ANY_WORDS)
            node = child
        if key not in node.values:
            self._count += 1
        node.values[key] = value

    def remove(self, pattern: str, key: Hashable) -> None:
        pattern_words = canonical_words(words(pattern, self.delimiter))
        self._cache.clear()
        if pattern_words.count(ANY_WORDS) > 1:
            text = self.delimiter.join(pattern_words)
            entry = self._apart.get(text)
            if entry is not None and entry[1].pop(key, _MISSING) is not _MISSING:
                self._count -= 1
                if not entry[1]:
                    del self._apart[text]
            return
        path = [self._root]
        for word in pattern_words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        if path[-1].values.pop(key, _MISSING) is not _MISSING:
            self._count -= 1
        for depth in range(len(pattern_words), 0, -1):  # prune empty branches
            node = path[depth]
            if node.values or node.children:
                break
            del path[depth - 1].children[pattern_words[depth - 1]]

    def match(self, address: str) -> tuple[Any, ...]:
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        found: dict[Hashable, Any] = {}
        if self._count:
            address_words = words(address, self.delimiter)
            for node in self._states(address_words):
                found.update(node.values)
            for matches, values in self._apart.values():
                if matches(address_words):
                    found.update(values)
        result = tuple(found.values())
        if self._cache_size:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[address] = result
        return result

    def _states(self, address_words: list[str]) -> Iterable[_Node]:
        root = self._root
        states: Iterable[_Node] = _closure({id(root): root}) if ANY_WORDS in root.children else (root,)
        steps = 0
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
            steps += len(step)
            if not step:
                self.steps += steps
                return ()
            if len(step) > 1 or ANY_WORDS in step[0].children:  # dedupe, and `#` taking no word
                states = _closure({id(n): n for n in step})
            else:
                states = step
        self.steps += steps
        return states

    def patterns(self) -> Iterable[str]:
        """The canonical patterns held."""
        yield from self._apart
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            if node.values:
                yield self.delimiter.join(path)
            for w, child in node.children.items():
                stack.append((child, path + [w]))


_MISSING = object()


def _closure(nodes: dict[int, _Node]) -> Iterable[_Node]:
    """`nodes` (by id) plus every node reachable from them through `#` children (`#` taking no word)."""
    for node in list(nodes.values()):
        child = node.children.get(ANY_WORDS)
        while child is not None and id(child) not in nodes:
            nodes[id(child)] = child
            child = child.children.get(ANY_WORDS)
    return nodes.values()


# The LIKE form of a pattern: `%` and `_` are the wildcards, each literal word a character of the
# private use area (a pattern has fewer literal words than the area has characters), a name's word
# that no literal is the filler, which only `_` and `%` match.
_FIRST_CODE = 0xE000
_FILLER = "\x00"


def _words_matcher(pattern_words: list[str]) -> Callable[[list[str]], bool]:
    """A predicate on a name's words for one canonical pattern, linear in the words (no backtracking)."""
    codes: dict[str, str] = {}
    like = []
    for w in pattern_words:
        if w == ANY_WORDS:
            like.append("%")
        elif w == ONE_WORD:
            like.append("_")
        else:
            c = codes.get(w)
            if c is None:
                c = codes[w] = chr(_FIRST_CODE + len(codes))
            like.append(c)
    match = like_matcher("".join(like), None)
    code = codes.get
    if len(pattern_words) == 1 and pattern_words[0] == ANY_WORDS:
        return lambda name_words: True
    return lambda name_words: match("".join([code(w, _FILLER) for w in name_words]))


def wildcard_matcher(pattern: str, delimiter: str = ".") -> Callable[[str], bool]:
    """A predicate on names: does `pattern` match the name?  Linear in the name (see the module's
    theory of operation); callers that take patterns from clients bound them with `check_pattern`."""
    if not is_wildcard(pattern, delimiter):
        return lambda name: name == pattern
    pattern_words = canonical_words(words(pattern, delimiter))
    if pattern_words == [ANY_WORDS]:
        return lambda name: True
    match = _words_matcher(pattern_words)
    return lambda name: match([] if name == "" else name.split(delimiter))
