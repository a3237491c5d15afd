"""AMQP filter-sets -> compiled filters: descriptor dispatch, and/or/not, no-local.

Theory of operation: a filter-set maps client-chosen keys to described values.  The key means nothing
(clients use `jms-selector`, `selector`, the descriptor name, anything), so dispatch is on the
descriptor only, in any of its forms: the registry symbol, the draft symbol, the 64-bit code as an
integer, or the `0x0000468C:0x00000004` text.  The input is either what proton decodes (a dict of
symbol -> Described, duck-typed here as any object with `.descriptor` and `.value`) or the JSON form
`{key: {"descriptor": D, "value": V}}`.

Each entry is applied (and echoed under the client's key with the client's value), ignored (an
unknown or unsupported filter: left out of the echo, with a reason), or invalid (`FilterError`,
which refuses the link).  0x0000468C00000005 is an or-filter when its value is a list of described
filters and an xquery filter (unsupported) when it is a string.  A logical filter containing an
unsupported filter is unsupported as a whole: applying part of it would change its meaning.
"""

from __future__ import annotations

import json
from typing import Any

from ..amqp.types import Described
from .base import ORIGIN_ANNOTATION, Filter, FilterEntry, FilterNode, FilterSet, IgnoredEntry, kleene_and
from .bindings import direct_binding, headers_binding, topic_binding
from .errors import FilterError, LimitError, SelectorError
from .filtex import application_properties_filter, properties_filter
from .parser import DEFAULT_LIMITS, Limits
from .selector import compile_selector

CODE_PREFIX = 0x0000468C << 32

# canonical name, kind, numeric code, accepted symbols
DESCRIPTORS: tuple[tuple[str, str, int, tuple[str, ...]], ...] = (
    ("apache.org:legacy-amqp-direct-binding:string", "direct", CODE_PREFIX | 0, ()),
    ("apache.org:legacy-amqp-topic-binding:string", "topic", CODE_PREFIX | 1, ()),
    ("apache.org:legacy-amqp-headers-binding:map", "headers", CODE_PREFIX | 2, ()),
    ("apache.org:no-local-filter:list", "no-local", CODE_PREFIX | 3, ("apache.org:jms-no-local-filter:list",)),
    ("apache.org:selector-filter:string", "selector", CODE_PREFIX | 4, ("apache.org:jms-selector-filter:string",)),
    ("apache.org:or-filter:list", "or", CODE_PREFIX | 5, ()),
    ("apache.org:and-filter:list", "and", CODE_PREFIX | 6, ()),
    ("apache.org:not-filter:list", "not", CODE_PREFIX | 7, ()),
    # OASIS AMQP Filter Expressions (filtex)
    ("amqp:properties-filter", "properties", 0x173, ()),
    ("amqp:application-properties-filter", "application-properties", 0x174, ()),
    ("amqp:sql-filter", "sql", 0x120, ()),
)
XQUERY_SYMBOL = "apache.org:xquery-filter:string"

BY_SYMBOL: dict[str, tuple[str, str]] = {}
BY_CODE: dict[int, tuple[str, str]] = {}
for _name, _kind, _code, _aliases in DESCRIPTORS:
    for _sym in (_name, *_aliases):
        BY_SYMBOL[_sym] = (_name, _kind)
    BY_CODE[_code] = (_name, _kind)
BY_SYMBOL[XQUERY_SYMBOL] = (XQUERY_SYMBOL, "xquery")

DEFAULT_MAX_FILTER_DEPTH = 32


class _Unsupported(Exception):
    """A filter this implementation does not apply (left out of the echo)."""


def _code_from_text(text: str) -> int | None:
    t = text.strip().lower()
    try:
        if ":" in t:
            hi, lo = t.split(":", 1)
            if hi.startswith("0x") and lo.startswith("0x"):
                return (int(hi, 16) << 32) | int(lo, 16)
        elif t.startswith("0x"):
            return int(t, 16)
    except ValueError:
        return None
    return None


def resolve_descriptor(descriptor: Any) -> tuple[str, str]:
    """Descriptor (symbol, code, code text) -> (canonical name, kind); raises _Unsupported."""
    if isinstance(descriptor, bool):
        raise _Unsupported(f"descriptor {descriptor!r} is not a symbol or code")
    if isinstance(descriptor, int):
        found = BY_CODE.get(int(descriptor))
        if found is None:
            raise _Unsupported(f"unknown filter descriptor 0x{int(descriptor):016X}")
        return found
    if isinstance(descriptor, str):
        found = BY_SYMBOL.get(str(descriptor))
        if found is None:
            code = _code_from_text(descriptor)
            if code is not None and code in BY_CODE:
                return BY_CODE[code]
            raise _Unsupported(f"unknown filter descriptor {str(descriptor)!r}")
        return found
    raise _Unsupported(f"descriptor {descriptor!r} is not a symbol or code")


def _split(value: Any, json_form: bool) -> tuple[Any, Any] | None:
    """(descriptor, value) of a described filter in either form, or None if it is not described."""
    if json_form and isinstance(value, dict) and "descriptor" in value:
        if set(value) - {"descriptor", "value"}:
            raise FilterError(f"a JSON filter has only 'descriptor' and 'value', not {sorted(set(value))}")
        from ..amqp.message import MessageFormatError, value_from_json

        try:
            inner = value.get("value")
            if isinstance(inner, list):
                return value["descriptor"], [x if _looks_described(x) else value_from_json(x) for x in inner]
            return value["descriptor"], value_from_json(inner)
        except MessageFormatError as e:
            raise FilterError(f"bad JSON filter value: {e}") from None
    if hasattr(value, "descriptor") and hasattr(value, "value"):
        return value.descriptor, value.value
    return None


def _looks_described(x: Any) -> bool:
    return (isinstance(x, dict) and "descriptor" in x) or (hasattr(x, "descriptor") and hasattr(x, "value"))


class _Compiler:
    def __init__(self, dialect: Any, limits: Limits, max_depth: int, json_form: bool):
        self.dialect = dialect
        self.limits = limits
        self.max_depth = max_depth
        self.json_form = json_form

    def filter(self, described: Any, depth: int) -> tuple[str, FilterNode, str | None]:
        """-> (canonical descriptor, the filter's node, text)."""
        if depth > self.max_depth:
            raise LimitError(f"filters are nested more than {self.max_depth} deep")
        parts = _split(described, self.json_form)
        if parts is None:
            raise _Unsupported("not a described filter")
        descriptor, value = parts
        name, kind = resolve_descriptor(descriptor)
        if kind == "or" and isinstance(value, str):
            if isinstance(descriptor, str) and descriptor in BY_SYMBOL:  # named or-filter: malformed
                raise FilterError("an or-filter's value is a list of filters, not a string")
            raise _Unsupported("0x0000468C00000005 with a string value is an xquery filter (not supported)")
        if kind == "xquery":
            raise _Unsupported("xquery filters are not supported")
        if kind in ("selector", "sql"):  # sql: always the amqp-sql dialect, whatever the link's selector dialect
            if not isinstance(value, str):
                what = "a selector filter" if kind == "selector" else "an SQL filter"
                raise FilterError(f"{what}'s value is a string, not {type(value).__name__}")
            f = compile_selector(str(value), self.dialect if kind == "selector" else "amqp-sql", self.limits)
            return name, FilterNode(kind, f, str(value)), str(value)
        text = value if kind in ("direct", "topic") and isinstance(value, str) else None
        if kind == "topic":
            return name, FilterNode(kind, topic_binding(value, self.limits.max_pattern_words), value), text
        leaf = LEAVES.get(kind)
        if leaf is not None:
            return name, FilterNode(kind, leaf(value), value), text
        # logical filters
        items = value
        if kind == "not" and not isinstance(items, (list, tuple)):
            items = [items]
        if not isinstance(items, (list, tuple)):
            raise FilterError(f"an {kind}-filter's value is a list of filters, not {type(value).__name__}")
        if kind == "not" and len(items) != 1:
            raise FilterError(f"a not-filter holds exactly one filter, not {len(items)}")
        if not items:
            raise FilterError(f"an {kind}-filter needs at least one filter")
        children = tuple(self.filter(item, depth + 1)[1] for item in items)
        return name, FilterNode(kind, _logical(kind, [c.filter for c in children]), None, children), None


def _no_local() -> Filter:
    key = ORIGIN_ANNOTATION

    def fn(m: Any, receiver: Any = None) -> bool:
        if receiver is None:
            return True
        ma = m.message_annotations
        return ma is None or ma.get(key) != receiver

    return Filter(fn, frozenset({"message_annotations"}), "NOT from this connection")


# the leaf kinds other than the selector dialects: their filter from the entry's value
LEAVES = {
    "direct": direct_binding,
    "topic": topic_binding,
    "headers": headers_binding,
    "no-local": lambda value: _no_local(),
    "properties": properties_filter,
    "application-properties": application_properties_filter,
}


def _logical(kind: str, children: list[Filter]) -> Filter:
    fns = [c._fn for c in children]
    reads = frozenset().union(*(c.reads for c in children))
    if kind == "not":
        inner = fns[0]

        def fn_not(m: Any, r: Any = None) -> Any:
            v = inner(m, r)
            return None if v is None else not v

        return Filter(fn_not, reads, f"NOT ({children[0].description})")
    if kind == "and":
        return Filter(kleene_and(fns), reads, " AND ".join(f"({c.description})" for c in children))

    def fn_or(m: Any, r: Any = None) -> Any:
        result: Any = False
        for f in fns:
            v = f(m, r)
            if v is True:
                return True
            if v is None:
                result = None
        return result

    return Filter(fn_or, reads, " OR ".join(f"({c.description})" for c in children))


def compile_filter_set(
    obj: Any,
    dialect: Any = "jms",
    limits: Limits = DEFAULT_LIMITS,
    max_depth: int = DEFAULT_MAX_FILTER_DEPTH,
) -> FilterSet:
    """A filter-set (proton-decoded, JSON form, or JSON text) -> FilterSet; raises FilterError."""
    if obj is None:
        return FilterSet(())
    json_form = False
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except ValueError as e:
            raise FilterError(f"filter-set JSON does not parse: {e}") from None
        json_form = True
    if not isinstance(obj, dict):
        raise FilterError(f"a filter-set is a map, not {type(obj).__name__}")
    if not json_form:
        json_form = any(isinstance(v, dict) and "descriptor" in v for v in obj.values())
    compiler = _Compiler(dialect, limits, max_depth, json_form)
    entries: list[FilterEntry] = []
    ignored: list[IgnoredEntry] = []
    for key, value in obj.items():
        try:
            name, node, text = compiler.filter(value, 1)
        except _Unsupported as e:
            ignored.append(IgnoredEntry(key, value, str(e)))
            continue
        except SelectorError as e:
            e.key = str(key)
            raise
        except FilterError as e:
            e.key = str(key)
            raise
        except (TypeError, ValueError, AttributeError) as e:  # malformed beyond what the checks name
            raise FilterError(f"malformed filter: {e}", key=str(key)) from None
        entries.append(FilterEntry(key, node.kind, name, value, node.filter, text, node))
    return FilterSet(tuple(entries), tuple(ignored))


__all__ = ["DESCRIPTORS", "Described", "compile_filter_set", "resolve_descriptor"]
