"""The filter core: selectors (JMS, Artemis and RocketMQ dialects), legacy bindings, no-local and the
and/or/not combinators, compiled to fast evaluators.  Pure Python: imports neither proton nor pyspark.

Public API (stable):
    compile_selector(text, dialect="jms") -> Filter
    compile_filter_set(obj, dialect="jms") -> FilterSet
    Filter.evaluate(message, receiver=None) -> True | False | None      (None = UNKNOWN)
    Filter.matches(message, receiver=None) -> bool
    SelectorError, FilterError
"""

from .base import MATCH_ALL, ORIGIN_ANNOTATION, Filter, FilterEntry, FilterNode, FilterSet, FilterVisitor, IgnoredEntry
from .errors import FilterError, LimitError, SelectorError
from .dialects import DIALECTS, Dialect, get_dialect
from .selector import compile_selector, parse_selector, render_selector
from .filterset import compile_filter_set

__all__ = [
    "DIALECTS",
    "Dialect",
    "Filter",
    "FilterEntry",
    "FilterNode",
    "FilterError",
    "FilterSet",
    "FilterVisitor",
    "IgnoredEntry",
    "LimitError",
    "MATCH_ALL",
    "ORIGIN_ANNOTATION",
    "SelectorError",
    "compile_filter_set",
    "compile_selector",
    "get_dialect",
    "parse_selector",
    "render_selector",
]
