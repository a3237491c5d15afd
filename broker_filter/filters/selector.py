"""Selector entry points: parse, render, compile (cached by dialect and text)."""

from __future__ import annotations

import functools

from . import ast
from .base import Filter
from .compile import compile_ast
from .dialects import Dialect, get_dialect
from .parser import DEFAULT_LIMITS, Limits, parse
from .render import render


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
    return _compile_cached(text, d, limits)


@functools.lru_cache(maxsize=4096)
def _compile_cached(text: str, dialect: Dialect, limits: Limits) -> Filter:
    selector = parse(text, dialect, limits)
    fn, reads, _source = compile_ast(selector, dialect)
    return Filter(fn, reads, selector.text.strip() or "TRUE", ast=selector, matches=getattr(fn, "matches", None))


def compile_parsed(selector: ast.Selector) -> Filter:
    """Compile an already parsed selector (no cache)."""
    d = get_dialect(selector.dialect)
    fn, reads, _source = compile_ast(selector, d)
    return Filter(fn, reads, selector.text.strip() or "TRUE", ast=selector, matches=getattr(fn, "matches", None))
