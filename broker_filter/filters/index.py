"""The subscription index: which of many registered filters select one message, without evaluating
every filter.

Theory of operation
-------------------
Each registered filter (a compiled `Filter` or `FilterSet`, under a caller's key) is reduced to its
*terms*: a small set of postings, at least one of which a message must hit for the filter to be
able to select it.  A filter-set is the AND of its entries, so any one entry's terms will do; the
index takes the entry with the fewest.  Terms come from

* a selector's top-level AND: a conjunct `prop = 'text'`, `prop = 5` or `prop IN ('a', 'b')` (JMS
  and Artemis dialects without string conversion) -> postings on the application property `prop`,
  under `index_key` of the literal (strings under themselves, integral numbers under their int, so
  `5 = 5.0` shares a key and `'5'` never meets 5);
* a direct binding -> the subject; a topic binding -> its pattern in a `WildcardTrie` (`#` alone
  matches every message and is not indexed);
* a headers binding (`all`: one pair; `any`: every pair) and the OASIS properties and
  application-properties filters (one exact field value) -> postings under `exact_key` of the value.
  NULL (presence), `&p:` prefix and `&s:` suffix values are not indexable.

A filter without terms (ranges, LIKE, OR at the top, no-local alone, or no filter) is a candidate
for every message.  For a message the index looks up, for each indexed field, the message's value
in that field's hash (one lookup per field, whatever the number of filters), walks the trie with
the subject, and adds the filters without terms: these are the candidates.
The full filter then decides every candidate, so the index never changes a result: it only skips
filters that cannot select the message (never a false negative, never a false positive).

Candidate lists are cached (as NATS's sublist caches per subject) under the tuple of the message's
values in the indexed fields, bounded by `cache_size` (the oldest entry leaves first), and dropped
whenever a filter is registered or removed.

Counters (`stats()`) are plain numbers: messages, candidates and evaluations per message, cache hit
rate.  Pure Python: imports neither proton nor pyspark.
"""

from __future__ import annotations

import decimal
import math
import operator
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator

from ..amqp.types import timestamp
from . import ast
from .wildcards import ANY_WORDS, WildcardTrie

# Dialects whose `=` on strings is plain string equality (no implicit conversions).
_STRICT_DIALECTS = frozenset({"jms", "artemis"})

# Posting tables: (kind, field).  kind "jms": application property under `index_key`; "app" /
# "prop": application property / properties field under `exact_key`; "subject": direct binding.
JMS, APP, PROP, SUBJECT = "jms", "app", "prop", "subject"
TOPIC = "topic"


# ------------------------------------------------------------------------------------ selector hints
@dataclass(frozen=True)
class EqualityHint:
    """Only messages whose application property `key` has an `index_key` in `values` can match."""

    key: str
    values: frozenset


def equality_hint(filter_: Any) -> EqualityHint | None:
    """The most selective equality hint of a compiled filter or filter-set, or None."""
    hints = [h for h in _hints(filter_) if h is not None]
    if not hints:
        return None
    return min(hints, key=lambda h: len(h.values))


def _hints(filter_: Any) -> Iterator[EqualityHint | None]:
    if filter_ is None:
        return
    entries = getattr(filter_, "entries", None)
    if entries is not None:  # a FilterSet is the AND of its entries
        for entry in entries:
            yield from _hints(entry.filter)
        return
    yield from _selector_hints(filter_)


def _selector_hints(filter_: Any) -> Iterator[EqualityHint | None]:
    found = getattr(filter_, "hints", None)
    if found is not None:  # found once when the selector was compiled
        yield from found
        return
    yield from selector_hints(getattr(filter_, "ast", None))


def selector_hints(selector: Any) -> Iterator[EqualityHint | None]:
    """The equality hints of a selector's top-level AND conjuncts (None where a conjunct has none)."""
    if not isinstance(selector, ast.Selector) or selector.expr is None:
        return
    if selector.dialect not in _STRICT_DIALECTS or selector.convert_strings:
        return
    for conjunct in ast.chain_items("AND", selector.expr):
        yield _conjunct_hint(conjunct)


def _conjunct_hint(node: Any) -> EqualityHint | None:
    def prop(n: Any) -> str | None:
        return n.key if isinstance(n, ast.Ident) and n.kind == "property" and isinstance(n.key, str) else None

    def text(n: Any) -> Any:
        if not isinstance(n, ast.Literal):
            return None
        if n.type == "string" and isinstance(n.value, str):
            return n.value
        if n.type in ("int", "long") and isinstance(n.value, int) and not isinstance(n.value, bool):
            return int(n.value)
        return None

    if isinstance(node, ast.Binary) and node.op == "=":
        for a, b in ((node.left, node.right), (node.right, node.left)):
            key, value = prop(a), text(b)
            if key is not None and value is not None:
                return EqualityHint(key, frozenset({value}))
    if isinstance(node, ast.In) and not node.negated:
        key = prop(node.operand)
        values = [text(v) for v in node.values]
        if key is not None and values and all(v is not None for v in values):
            return EqualityHint(key, frozenset(values))
    return None


def index_key(value: Any) -> Any:
    """The key a property value is indexed under, or None if no hinted literal can equal it.

    Strings (and symbols) under themselves; integral numbers under their int value, so 5, long 5,
    ubyte 5 and 5.0 share a key as they compare equal in JMS."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, (float, decimal.Decimal)):
        try:
            return int(value) if value == value and value == int(value) else None
        except (OverflowError, ValueError, decimal.InvalidOperation):
            return None
    return None


# ------------------------------------------------------------------------------------ exact values
def exact_key(value: Any) -> Hashable | None:
    """The key of a value as the headers binding and the OASIS property filters compare it, or None
    if it has none (NaN, maps, described values...).  Values that match share a key: strings and
    symbols by text, all numbers by their float value (uint 10 and double 10.0), booleans,
    timestamps, binary and uuids apart from each other and from numbers."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (bytes, bytearray)):
        return ("binary", bytes(value))
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, timestamp):
        return ("timestamp", int(value))
    if isinstance(value, (int, float, decimal.Decimal)):
        try:
            f = float(value)
        except (OverflowError, ValueError, decimal.InvalidOperation):
            return None
        return None if math.isnan(f) else f
    return None


def exact_terms(table: str, pairs: list[tuple[str, Any]], *, any_of: bool = False) -> tuple | None:
    """Terms for `pairs` (field, reference value) that must all match (or, with `any_of`, one of
    them): one posting for AND, every posting for OR; None when that is not possible.  A reference
    of None (presence, prefix or suffix: the caller's to say) is not indexable."""
    postings = []
    for name, ref in pairs:
        k = exact_key(ref) if ref is not None else None
        if k is None:
            if any_of:
                return None
            continue
        postings.append((table, name, k))
        if not any_of:
            break
    return tuple(postings) or None


# ------------------------------------------------------------------------------------ terms
def index_terms(filter_: Any) -> tuple | None:
    """The postings one of which a message must hit to be selected by `filter_`, or None (every
    message is a candidate).  A posting is (kind, field, key) or ("topic", None, pattern)."""
    if filter_ is None:
        return None
    entries = getattr(filter_, "entries", None)
    if entries is not None:
        best = None
        for entry in entries:
            t = index_terms(entry.filter)
            if t is not None and (best is None or _cost(t) < _cost(best)):
                best = t
        return best
    terms = getattr(filter_, "terms", None)
    if terms is not None:
        return terms
    hints = [h for h in _selector_hints(filter_) if h is not None]
    if not hints:
        return None
    hint = min(hints, key=lambda h: len(h.values))
    return tuple((JMS, hint.key, v) for v in sorted(hint.values, key=repr))


def _cost(terms: tuple) -> tuple[int, int]:
    return len(terms), sum(1 for t in terms if t[0] == TOPIC)


def topic_terms(pattern: str) -> tuple | None:
    return None if pattern == ANY_WORDS else ((TOPIC, None, pattern),)


# ------------------------------------------------------------------------------------ the index
class _Registration:
    __slots__ = ("key", "filter", "receiver", "seq", "terms")

    def __init__(self, key: Hashable, filter_: Any, receiver: Any, seq: int, terms: tuple | None):
        self.key = key
        self.filter = filter_
        self.receiver = receiver
        self.seq = seq
        self.terms = terms


def _selects(reg: "_Registration", message: Any, receiver: Any) -> bool:
    """Whether the registration's filter selects `message` (with its own receiver, else `receiver`)."""
    try:
        return reg.filter.evaluate(message, reg.receiver if reg.receiver is not None else receiver) is True
    except Exception:  # a broken filter or message selects nothing, and stops nothing
        return False


class SubscriptionIndex:
    """Key -> compiled filter; `match(message)` returns the keys whose filter selects the message.

    `indexed=False` evaluates every filter (the reference behaviour); `cache_size=0` turns the
    candidate cache off."""

    def __init__(self, *, indexed: bool = True, cache_size: int = 1024):
        self.indexed = indexed
        self.cache_size = cache_size
        self._regs: dict[Hashable, _Registration] = {}
        self._only: _Registration | None = None  # the registration when there is exactly one
        self._always: dict[Hashable, _Registration] = {}
        self._tables: dict[tuple[str, str], dict[Hashable, dict[Hashable, _Registration]]] = {}
        self._trie = WildcardTrie(".", cache_size=cache_size)  # topic bindings split on `.`, whatever the broker's delimiter
        self._topics = 0
        self._cache: OrderedDict[tuple, tuple[_Registration, ...]] = OrderedDict()
        self._seq = 0
        self.messages = 0
        self.candidates_total = 0
        self.evaluations_total = 0
        self.cache_hits = 0
        self.cache_lookups = 0

    def __len__(self) -> int:
        return len(self._regs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._regs

    # -------------------------------------------------------------- registration
    def register(self, key: Hashable, filter_: Any, receiver: Any = None) -> None:
        """Add (or replace) the filter under `key`; `receiver` is handed to its evaluation (no-local)."""
        if key in self._regs:
            self.unregister(key)
        self._seq += 1
        terms = index_terms(filter_) if self.indexed else None
        reg = _Registration(key, filter_, receiver, self._seq, terms)
        self._regs[key] = reg
        self._only = reg if len(self._regs) == 1 else None
        if terms is None:
            self._always[key] = reg
        else:
            for kind, field, value in terms:
                if kind == TOPIC:
                    self._trie.add(value, key, reg)
                    self._topics += 1
                else:
                    self._tables.setdefault((kind, field), {}).setdefault(value, {})[key] = reg
        self._cache.clear()

    def unregister(self, key: Hashable) -> None:
        reg = self._regs.pop(key, None)
        if reg is None:
            return
        self._only = next(iter(self._regs.values())) if len(self._regs) == 1 else None
        if reg.terms is None:
            self._always.pop(key, None)
        else:
            for kind, field, value in reg.terms:
                if kind == TOPIC:
                    self._trie.remove(value, key)
                    self._topics -= 1
                    continue
                table = self._tables.get((kind, field))
                posting = table.get(value) if table is not None else None
                if posting is not None:
                    posting.pop(key, None)
                    if not posting:
                        del table[value]
                        if not table:
                            del self._tables[(kind, field)]
        self._cache.clear()

    # -------------------------------------------------------------- lookup
    def candidates(self, message: Any) -> list:
        """The keys whose filter may select `message` (a superset of `match`), in registration order."""
        return [r.key for r in sorted(self._candidates(message), key=_by_seq)]

    def match(self, message: Any, receiver: Any = None,
              check: Callable[[Hashable], bool] | None = None) -> list:
        """The keys whose filter selects `message`, in registration order.  Each candidate's filter
        is evaluated with its own receiver (or `receiver`); `check(key)`, when given, decides
        instead (for callers that evaluate themselves, e.g. on a lazily decoded body)."""
        only = self._only
        if only is not None and check is None:
            # One filter: evaluating it costs less than looking the message up (the usual
            # single subscriber; counted as its one candidate).
            self.messages += 1
            self.candidates_total += 1
            if only.filter is None:
                return [only.key]
            self.evaluations_total += 1
            return [only.key] if _selects(only, message, receiver) else []
        regs = self._candidates(message)
        selected = []
        evaluations = 0
        for reg in regs:
            if check is not None:
                evaluations += 1
                ok = check(reg.key)
            elif reg.filter is None:
                ok = True
            else:
                evaluations += 1
                ok = _selects(reg, message, receiver)
            if ok:
                selected.append(reg)
        self.evaluations_total += evaluations
        if len(selected) > 1:
            selected.sort(key=_by_seq)
        return [r.key for r in selected]

    def _candidates(self, message: Any) -> tuple[_Registration, ...] | list[_Registration]:
        """The registrations that may select `message`, in no particular order."""
        self.messages += 1
        if message is None or len(self._always) == len(self._regs):
            found = list(self._regs.values())  # nothing indexed, or nothing to look a message up by
            self.candidates_total += len(found)
            return found
        try:
            values, subject = self._values(message)
        except Exception:  # a message the index cannot read: every filter decides for itself
            found = list(self._regs.values())
            self.candidates_total += len(found)
            return found
        cache = self._cache if self.cache_size else None
        if cache is not None:
            cache_key = (values, subject)
            self.cache_lookups += 1
            hit = cache.get(cache_key)
            if hit is not None:
                self.cache_hits += 1
                self.candidates_total += len(hit)
                return hit
        # Unordered (callers order what they return): a filter sits in one posting per indexed
        # field, so only a message hitting several postings can meet it twice.
        found: list[_Registration] = []
        hit = 0
        for table, value in zip(self._tables.values(), values):
            if value is not None:
                posting = table.get(value)
                if posting:
                    found.extend(posting.values())
                    hit += 1
        if hit > 1:
            found = list(dict.fromkeys(found))
        if self._topics and subject is not None:
            found.extend(self._trie.match(subject))  # topic filters are in no posting
        found.extend(self._always.values())
        result = tuple(found)
        if cache is not None:
            if len(cache) >= self.cache_size:
                cache.popitem(last=False)  # the oldest leaves first
            cache[cache_key] = result
        self.candidates_total += len(result)
        return result

    def _values(self, message: Any) -> tuple[tuple, str | None]:
        """(the message's key in each indexed field, in table order; its subject as text)."""
        app = message.application_properties or {}
        props = message.properties
        s = props.subject if props is not None else None
        subject = None if s is None else s if type(s) is str else str(s)
        out = []
        for kind, field in self._tables:
            if kind == JMS:
                v = app.get(field)
                out.append(v if type(v) is str else index_key(v))
            elif kind == APP:
                out.append(exact_key(app.get(field)))
            elif kind == PROP:
                out.append(exact_key(getattr(props, field, None)) if props is not None else None)
            else:  # SUBJECT
                out.append(subject)
        return tuple(out), subject

    # -------------------------------------------------------------- counters
    def stats(self) -> dict[str, float]:
        n = self.messages
        return {
            "filters": len(self._regs),
            "unindexed_filters": len(self._always),
            "messages": n,
            "candidates_per_message": self.candidates_total / n if n else 0.0,
            "evaluations_per_message": self.evaluations_total / n if n else 0.0,
            "cache_hit_rate": self.cache_hits / self.cache_lookups if self.cache_lookups else 0.0,
        }


_by_seq = operator.attrgetter("seq")


__all__ = ["EqualityHint", "SubscriptionIndex", "equality_hint", "exact_key", "index_key", "index_terms"]
