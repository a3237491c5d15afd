"""The compiled-filter objects every backend and the daemon use.

A `Filter` wraps one evaluation function `fn(message, receiver) -> True | False | None` (None is the
JMS UNKNOWN).  `receiver` is the identity of the receiving connection, needed only by no-local.
Evaluation never raises: compiled code catches its own faults and answers UNKNOWN (or FALSE in
dialects that say so).  `reads` names the message sections a filter looks at, so a caller can decode
only those.
"""

from __future__ import annotations

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

    __slots__ = ("_fn", "evaluate", "matches", "reads", "description", "ast", "terms")

    def __init__(
        self,
        fn: EvalFn,
        reads: frozenset[str] = frozenset(),
        description: str = "",
        ast: Any = None,
        matches: Callable[..., bool] | None = None,
        terms: tuple | None = None,
    ):
        self._fn = fn
        self.evaluate = fn if _receiver_optional(fn) else _with_default(fn)
        self.matches = matches if matches is not None else _matcher(fn)
        self.reads = frozenset(reads)
        self.description = description
        self.ast = ast  # the selector AST where there is one (backends such as Spark compile it)
        self.terms = terms  # what a subscription index may look this filter up by (`index.index_terms`)

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
class FilterEntry:
    """One applied entry of a filter-set."""

    key: Any  # the client's key, as sent (echo it back unchanged)
    kind: str  # selector | direct | topic | headers | no-local | or | and | not | properties | application-properties | sql
    descriptor: str  # canonical descriptor symbol, e.g. "apache.org:selector-filter:string"
    value: Any  # the client's value, as sent (the Described when it came described)
    filter: Filter
    text: str | None = None  # selector text or binding key, for push-down


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
