"""What the JMS compiler (compile.py) and the amqp-sql compiler (amqpsql.py) share: the names of the
hidden columns they materialize in projection layers, the layering of a value's components, and the
SQL LIKE -> Java regex translation.  A leaf: it imports neither compiler, so `compile` may call
`amqpsql` (for amqp-sql selectors and property filters) without the two importing each other.
"""

from __future__ import annotations

import itertools
from typing import Any

# One counter for both compilers' hidden columns (`__bf<n>`, `__bfq<n>`): names stay unique in a
# context both fill (a filter-set mixing the dialects).
hidden_names = itertools.count()


def keep_fields(define: Any, level: int, v: Any, out: Any, fields: tuple) -> Any:
    """`out` with each of `v`'s `fields` materialized by `define(level, expr)` as a hidden column;
    `out.level` is the highest layer they landed in."""
    for field in fields:
        c = getattr(v, field)
        if c is not None:
            ref, at = define(level, c)
            setattr(out, field, ref)
            out.level = max(out.level, at)
    return out


def like_regex(pattern: str, escape: str | None) -> str:
    """The Java regex (for `rlike`) equal to SQL LIKE `pattern` over the whole (multi-line) text."""
    out = [r"(?s)\A"]
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and pattern[i + 1 : i + 2] in ("%", "_", escape):  # ActiveMQ / Artemis rule
            out.append(regex_literal(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            out.append(".*")
        elif c == "_":
            out.append(".")
        else:
            out.append(regex_literal(c))
        i += 1
    out.append(r"\z")
    return "".join(out)


def regex_literal(c: str) -> str:
    return c if c.isascii() and c.isalnum() else "\\x{%x}" % ord(c)
