"""Selector entry points: parse, render, compile (cached by dialect and text, within a byte budget).

Theory of operation (issue 43: memory per client is bounded): a compiled selector's memory is
bounded by its text's length (at most about `BYTES_PER_CHARACTER` bytes a character plus
`BYTES_PER_FILTER`: `compile.py` keeps no per-node closures, and a cached filter keeps no parse
tree, only its text, which `Filter.ast` parses again when a backend asks).  The cache of compiled
selectors is bounded in those estimated bytes, not in entries: the least recently used leave first
once the estimates add up to more than `cache_budget()`, so that after every link that held
selectors is gone, the cache holds at most its budget whatever the selectors were.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

from . import ast
from .base import Filter
from .compile import compile_ast
from .dialects import Dialect, get_dialect
from .parser import DEFAULT_LIMITS, Limits, parse
from .render import render

# Upper bounds of a compiled selector's memory, measured with tracemalloc over the costliest shapes
# at the length limit (bench/abuse_bench.py): LIKE chains take up to 30 bytes a character,
# arithmetic 21, comparisons 11-13; a small selector's generated functions about 6 KiB.
BYTES_PER_CHARACTER = 40
BYTES_PER_FILTER = 8 * 1024
DEFAULT_CACHE_BYTES = 16 * 1024 * 1024


def parse_selector(text: str, dialect: "str | Dialect" = "jms", limits: Limits = DEFAULT_LIMITS) -> ast.Selector:
    """Selector text -> AST; raises SelectorError with line and column."""
    return parse(text, dialect, limits)


def render_selector(selector: "ast.Selector | str", dialect: "str | Dialect" = "jms") -> str:
    """The canonical text of a selector (an AST, or text that is parsed first)."""
    if isinstance(selector, str):
        selector = parse(selector, dialect)
    return render(selector)


def compile_selector(text: str, dialect: "str | Dialect" = "jms", limits: Limits = DEFAULT_LIMITS) -> Filter:
    """Compile a selector to a `Filter`.  Compiled selectors are cached by (dialect, text, limits)."""
    d = get_dialect(dialect)
    return _CACHE.get(text, d, limits)


def estimated_size(text: str) -> int:
    """An upper bound of the bytes a compiled selector of this text holds."""
    return BYTES_PER_FILTER + BYTES_PER_CHARACTER * len(text)


class _SelectorCache:
    """(text, dialect, limits) -> compiled Filter, least recently used first, bounded in bytes."""

    def __init__(self, budget: int):
        self.budget = budget
        self.bytes = 0
        self._entries: OrderedDict[tuple, tuple[Filter, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str, dialect: Dialect, limits: Limits) -> Filter:
        key = (text, dialect, limits)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit[0]
        f = _compile(text, dialect, limits)  # outside the lock: errors propagate, nothing is cached
        size = estimated_size(text)
        with self._lock:
            self.misses += 1
            if key not in self._entries and size <= self.budget:
                self._entries[key] = (f, size)
                self.bytes += size
                while self.bytes > self.budget:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self.bytes -= dropped
        return f

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


_CACHE = _SelectorCache(DEFAULT_CACHE_BYTES)


def cache_budget() -> int:
    """Bytes (estimated) the compiled-selector cache may hold."""
    return _CACHE.budget


def set_cache_budget(budget: int) -> None:
    """Bound the compiled-selector cache to `budget` estimated bytes (0: no cache); drops what is over."""
    with _CACHE._lock:
        _CACHE.budget = max(0, int(budget))
        while _CACHE.bytes > _CACHE.budget and _CACHE._entries:
            _, (_, dropped) = _CACHE._entries.popitem(last=False)
            _CACHE.bytes -= dropped


def cache_stats() -> dict[str, int]:
    """Entries, estimated bytes, budget, hits and misses of the compiled-selector cache."""
    with _CACHE._lock:
        return {"entries": len(_CACHE._entries), "bytes": _CACHE.bytes, "budget": _CACHE.budget,
                "hits": _CACHE.hits, "misses": _CACHE.misses}


def clear_cache() -> None:
    _CACHE.clear()


def _compile(text: str, dialect: Dialect, limits: Limits) -> Filter:
    selector = parse(text, dialect, limits)
    fn, reads, _source = compile_ast(selector, dialect)
    # keep the text, not the tree: `Filter.ast` parses again when asked
    return Filter(fn, reads, selector.text.strip() or "TRUE", ast=functools.partial(parse, text, dialect, limits),
                  matches=getattr(fn, "matches", None), hints=_hints(selector))


def _hints(selector: ast.Selector) -> tuple:
    from .index import selector_hints

    return tuple(h for h in selector_hints(selector) if h is not None)


def compile_parsed(selector: ast.Selector) -> Filter:
    """Compile an already parsed selector (no cache)."""
    d = get_dialect(selector.dialect)
    fn, reads, _source = compile_ast(selector, d)
    return Filter(fn, reads, selector.text.strip() or "TRUE", ast=selector, matches=getattr(fn, "matches", None))
