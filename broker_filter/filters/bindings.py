"""Legacy AMQP exchange bindings as filters: direct, topic and headers (RabbitMQ is the reference).

Theory of operation:
* direct: the binding key equals `properties.subject` exactly; no subject never matches.
* topic: subject and key are `.`-separated words; `""` is zero words and empty words count (`a..b` is
  three words).  `*` matches exactly one word, `#` zero or more, both only as whole words (`a#b` is a
  literal word); the rule and its NFA matcher are `wildcards.wildcard_matcher`, shared with the AMQ
  address wildcards, linear in the subject's words.  A message without a subject matches only the
  key `#`.  A key has at most `Limits.max_pattern_words` words (128, RabbitMQ's 255-byte keys);
  a longer one is refused (amqp:invalid-field).
* headers: `x-match` (the key in any case: Broker-J clients send `X-match`) is `all` (default), `any`,
  `all-with-x` or `any-with-x`; in the plain modes other `x-` keys are ignored.  A pair matches when
  the application properties hold the key with an equal value of the same class: the eight integer
  types by numeric value, float and double by value, string and symbol by text, anything else only
  with the same AMQP type (RabbitMQ compares the values once the AMQP type is dropped, qpid-cpp reads
  integers as int64); an integer never equals a floating value, nor a boolean anything else.  A null
  binding value tests presence only.  `all` over no pairs matches every message, `any` over no pairs
  none.
Binding filters answer TRUE or FALSE, never UNKNOWN.
"""

from __future__ import annotations

from typing import Any

from ..amqp.types import amqp_type
from .base import Filter
from .errors import FilterError
from .index import APP, SUBJECT, exact_terms, topic_terms
from .wildcards import MAX_PATTERN_WORDS, check_pattern, wildcard_matcher

X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")
X_MATCH = "x-match"

# Headers equality classes: values of one class compare by value (integers, floating values) or text.
INTEGER_TYPES = frozenset({"ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long"})
FLOAT_TYPES = frozenset({"float", "double"})
TEXT_TYPES = frozenset({"string", "symbol"})


def equality_class(amqp_type_name: str) -> str:
    """The class a headers binding compares values within: integer, float, text, or the type itself."""
    if amqp_type_name in INTEGER_TYPES:
        return "integer"
    if amqp_type_name in FLOAT_TYPES:
        return "float"
    if amqp_type_name in TEXT_TYPES:
        return "text"
    return amqp_type_name


def headers_equal(got: Any, want: Any) -> bool:
    """Whether a property value matches a binding value: same class, equal value."""
    try:
        if equality_class(amqp_type(got)) != equality_class(amqp_type(want)):
            return False
    except TypeError:
        return False
    return got == want


def _subject(m: Any) -> Any:
    p = m.properties
    return None if p is None else p.subject


def direct_binding(key: Any) -> Filter:
    if not isinstance(key, str):
        raise FilterError(f"a direct binding key is a string, not {_kind(key)}")
    key = str(key)

    def fn(m: Any, r: Any = None) -> bool:
        p = m.properties
        return p is not None and p.subject is not None and str(p.subject) == key

    return Filter(fn, frozenset({"properties"}), f"subject = {key!r}", terms=((SUBJECT, None, key),))


def topic_binding(key: Any, max_words: int = MAX_PATTERN_WORDS) -> Filter:
    if not isinstance(key, str):
        raise FilterError(f"a topic binding key is a string, not {_kind(key)}")
    key = str(key)
    check_pattern(key, "topic binding key", max_words)
    match = wildcard_matcher(key)
    only_hash = key == "#"

    def fn(m: Any, r: Any = None) -> bool:
        s = _subject(m)
        if s is None:
            return only_hash
        return match(str(s))

    return Filter(fn, frozenset({"properties"}), f"subject matches topic {key!r}", terms=topic_terms(key))


def headers_binding(binding: Any) -> Filter:
    if not isinstance(binding, dict):
        raise FilterError(f"a headers binding is a map, not {_kind(binding)}")
    mode, seen_mode = "all", None
    pairs: list[tuple[str, Any]] = []
    for k, v in binding.items():
        if not isinstance(k, str):
            raise FilterError(f"headers binding keys are strings, not {_kind(k)}")
        if k.lower() == X_MATCH:
            if not isinstance(v, str) or str(v) not in X_MATCH_MODES:
                raise FilterError(f"{k} must be one of {', '.join(X_MATCH_MODES)}, not {v!r}")
            if seen_mode is not None and str(v) != mode:
                raise FilterError(f"{seen_mode} and {k} disagree ({mode!r}, {str(v)!r})")
            mode, seen_mode = str(v), str(k)
            continue
        if isinstance(v, (dict, list)):
            raise FilterError(f"headers binding value for {k!r} must be a simple type, not {_kind(v)}")
        pairs.append((str(k), v))
    with_x = mode.endswith("-with-x")
    if not with_x:
        pairs = [(k, v) for k, v in pairs if not k.startswith("x-")]
    want_all = mode.startswith("all")
    _missing = object()

    def pair_matches(props: dict, k: str, v: Any) -> bool:
        got = props.get(k, _missing)
        if got is _missing:
            return False
        return True if v is None else headers_equal(got, v)

    def fn(m: Any, r: Any = None) -> bool:
        props = m.application_properties or {}
        if want_all:
            return all(pair_matches(props, k, v) for k, v in pairs)
        return any(pair_matches(props, k, v) for k, v in pairs)

    desc = f"headers {mode} {{{', '.join(f'{k}={v!r}' for k, v in pairs)}}}"
    terms = exact_terms(APP, pairs, any_of=not want_all) if pairs else None
    return Filter(fn, frozenset({"application_properties"}), desc, terms=terms)


def _kind(v: Any) -> str:
    try:
        return amqp_type(v)
    except TypeError:
        return type(v).__name__
