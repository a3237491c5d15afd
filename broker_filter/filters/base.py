"""The compiled-filter objects every backend and the daemon use.

A `Filter` wraps one evaluation function `fn(message, receiver) -> True | False | None` (None is the
JMS UNKNOWN).  `receiver` is the identity of the receiving connection, needed only by no-local.
Evaluation never raises: compiled code catches its own faults and answers UNKNOWN (or FALSE in
dialects that say so).  `reads` names the message sections a filter looks at, so a caller can decode
only those.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from ..amqp.types import symbol

# Message annotation the daemon stamps on every message published through it: "<instance>/<connection>".
ORIGIN_ANNOTATION = symbol("x-opt-broker-filter-origin")

SECTIONS = frozenset(
    {"header", "delivery_annotations", "message_annotations", "properties", "application_properties", "body"}
)

EvalFn = Callable[[Any, Any], "bool | None"]


class Filter:
    """A compiled filter.  `evaluate(message, receiver=None)` -> True / False / None (UNKNOWN);
    `matches(message, receiver=None)` -> bool.  Both are plain functions stored on the instance
    (generated code where the filter is a selector), so a call costs no extra Python frame."""

    __slots__ = ("_fn", "evaluate", "matches", "reads", "description", "_ast", "terms", "hints")

    no_local = False  # whether it depends on the receiving connection (a filter-set's no-local entry)

    def __init__(
        self,
        fn: EvalFn,
        reads: frozenset[str] = frozenset(),
        description: str = "",
        ast: Any = None,
        matches: Callable[..., bool] | None = None,
        terms: tuple | None = None,
        hints: tuple | None = None,
    ):
        self._fn = fn
        self.evaluate = fn if _receiver_optional(fn) else _with_default(fn)
        self.matches = matches if matches is not None else _matcher(fn)
        self.reads = frozenset(reads)
        self.description = description
        self._ast = ast  # the selector AST, or a function that parses it again (see `ast`)
        self.terms = terms  # what a subscription index may look this filter up by (`index.index_terms`)
        self.hints = hints  # a selector's equality hints, found once (`index.equality_hint`); None: from `ast`

    @property
    def ast(self) -> Any:
        """The selector AST where there is one (backends such as Spark compile it).  A cached
        selector keeps only its text and parses it again here: the tree takes more memory than the
        compiled filter (issue 43), and only backends and tools read it, once each."""
        a = self._ast
        return a() if isinstance(a, functools.partial) else a

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"


def _receiver_optional(fn: Callable) -> bool:
    defaults = getattr(fn, "__defaults__", None)
    return bool(defaults) and getattr(getattr(fn, "__code__", None), "co_argcount", 0) == 2


def _with_default(fn: EvalFn) -> Callable[..., "bool | None"]:
    def evaluate(message: Any, receiver: Any = None) -> "bool | None":
        return fn(message, receiver)

    return evaluate


def _matcher(fn: EvalFn) -> Callable[..., bool]:
    def matches(message: Any, receiver: Any = None) -> bool:
        return fn(message, receiver) is True

    return matches


def _true(message: Any, receiver: Any = None) -> bool:
    return True


MATCH_ALL = Filter(_true, frozenset(), "TRUE")


@dataclass(frozen=True)
class FilterNode:
    """One filter of a filter-set as compiled, for a backend to compile again in its own terms.

    `filter` is the core's compiled filter (its `ast` is the selector or SQL AST, or the property
    filter's checks); `value` is the filter's decoded value (selector text, binding key, headers map,
    property map; None for and / or / not); `children` are the filters an and / or / not combines."""

    kind: str  # as FilterEntry.kind
    filter: Filter
    value: Any = None
    children: tuple["FilterNode", ...] = ()


class FilterVisitor:
    """Compiles filter nodes in a backend's terms: `walk(node)` calls `visit_<kind>(node)` for a leaf
    (`visit_no_local` for "no-local") and `visit_and / visit_or / visit_not(node, results)` with the
    children's results, so every backend follows the filter-set's one structure.  A kind without a
    method goes to `unsupported(node)`."""

    def walk(self, node: FilterNode) -> Any:
        method = getattr(self, "visit_" + node.kind.replace("-", "_"), None)
        if method is None:
            return self.unsupported(node)
        if node.kind in LOGICAL_KINDS:
            return method(node, [self.walk(child) for child in node.children])
        return method(node)

    def unsupported(self, node: FilterNode) -> Any:
        raise NotImplementedError(f"{type(self).__name__}: no form for the filter kind {node.kind!r}")


LOGICAL_KINDS = frozenset({"and", "or", "not"})


@dataclass(frozen=True)
class FilterEntry:
    """One applied entry of a filter-set."""

    key: Any  # the client's key, as sent (echo it back unchanged)
    kind: str  # selector | direct | topic | headers | no-local | or | and | not | properties | application-properties | sql
    descriptor: str  # canonical descriptor symbol, e.g. "apache.org:selector-filter:string"
    value: Any  # the client's value, as sent (the Described when it came described)
    filter: Filter
    text: str | None = None  # selector text or binding key, for push-down
    node: FilterNode | None = None  # the filter's tree, as compile_filter_set makes it


@dataclass(frozen=True)
class IgnoredEntry:
    key: Any
    value: Any
    reason: str


class FilterSet(Filter):
    """A compiled filter-set: the AND of its applied entries, plus what was left out and why."""

    __slots__ = ("entries", "ignored")

    def __init__(self, entries: tuple[FilterEntry, ...], ignored: tuple[IgnoredEntry, ...] = ()):
        self.entries = tuple(entries)
        self.ignored = tuple(ignored)
        fns = [e.filter._fn for e in self.entries]
        reads = frozenset().union(*(e.filter.reads for e in self.entries)) if self.entries else frozenset()
        matches = None
        if not fns:
            fn = _true
        elif len(fns) == 1:
            fn, matches = self.entries[0].filter.evaluate, self.entries[0].filter.matches
        else:
            fn = kleene_and(fns)
        super().__init__(fn, reads, " AND ".join(e.filter.description for e in self.entries) or "TRUE", matches=matches)

    @property
    def applied(self) -> dict:
        """key -> the client's original value, for the attach echo."""
        return {e.key: e.value for e in self.entries}

    @property
    def no_local(self) -> bool:
        return any(e.kind == "no-local" for e in self.entries)

    def walk(self, visitor: FilterVisitor) -> list:
        """Each applied entry's tree compiled by `visitor`, in entry order (the set is their AND)."""
        missing = [e.key for e in self.entries if e.node is None]
        if missing:
            raise ValueError(f"filter-set entries {missing!r} have no filter tree (not made by compile_filter_set)")
        return [visitor.walk(e.node) for e in self.entries]

    def subset(self, keep: Callable[[FilterEntry], bool]) -> "FilterSet":
        """The filter-set of the entries `keep` accepts (e.g. what is left after push-down)."""
        return FilterSet(tuple(e for e in self.entries if keep(e)), self.ignored)


def kleene_and(fns: list[EvalFn]) -> EvalFn:
    def fn(message: Any, receiver: Any = None) -> bool | None:
        result: bool | None = True
        for f in fns:
            r = f(message, receiver)
            if r is False:
                return False
            if r is None:
                result = None
        return result

    return fn
