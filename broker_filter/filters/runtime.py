"""Run-time semantics of selector operations, per dialect (docs/selectors.md, "Typing").

Theory of operation: the compiler inlines the common cases (a string property against a string
literal, a number against a number literal of the same kind) and calls these functions for every
other case: NULLs, symbols, decimals, type mismatches, coercions, NaN.  Every function returns
True / False / None (UNKNOWN) or a value; in the RocketMQ dialect a type error raises `Abort`, which
the compiled selector turns into "not delivered".

Numbers follow Java: an integer compared with a floating value is widened to double; NaN equals NaN
and is greater than every other number (Double.compareTo, as Java brokers and Spark do); integer
arithmetic wraps at 32 bits (byte/short/int operands) or 64 bits; `/` always divides as doubles (the
Java peers' ArithmeticExpression.divide).  `+` with a string on the left concatenates the right
operand's Java `String.valueOf` text (`java_text`).
"""

from __future__ import annotations

import decimal
import time as _time
import uuid as _uuid
import math
import re
from typing import Any, Callable

from ..amqp import types as t
from .view import INT32_TYPES, Opaque, jms_value


def kleene_all(values: tuple) -> Any:
    """AND over operands that were all evaluated (RocketMQ: an error anywhere decides first)."""
    result: Any = True
    for v in values:
        if v is False:
            return False
        if v is None:
            result = None
    return result


def kleene_any(values: tuple) -> Any:
    """OR over operands that were all evaluated."""
    result: Any = False
    for v in values:
        if v is True:
            return True
        if v is None:
            result = None
    return result


class Abort(Exception):
    """An evaluation error in a dialect where errors mean 'not delivered' (RocketMQ)."""


def category(v: Any) -> str:
    if v is True or v is False:
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    if isinstance(v, str) and not isinstance(v, t.char):
        return "str"
    return "other"


def _wrap(value: int, bits: int) -> int:
    half = 1 << (bits - 1)
    return ((value + half) % (1 << bits)) - half


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_DOUBLE_TEXT = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")


def _java_float_from_string(s: str) -> float:
    """Double.parseDouble: surrounding control characters and spaces ignored, optional f/d suffix,
    NaN / Infinity; ASCII digits only."""
    start, end = 0, len(s)
    while start < end and s[start] <= " ":
        start += 1
    while end > start and s[end - 1] <= " ":
        end -= 1
    text = s[start:end]
    if not _DOUBLE_TEXT.fullmatch(text):
        raise ValueError(s)
    body = text.rstrip("fFdD") if not text.endswith("Infinity") else text
    return float(body.replace("Infinity", "inf"))


def _java_long_from_string(s: str) -> int:
    """Long.parseLong: optional sign, ASCII decimal digits only, 64-bit range."""
    if not _INTEGER_TEXT.fullmatch(s):
        raise ValueError(s)
    value = int(s)
    if not -(2**63) <= value < 2**63:
        raise ValueError(s)
    return value


def _num_cmp(a: Any, b: Any) -> int:
    """Java-style three-way comparison of two numbers (NaN largest and equal to itself)."""
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        an, bn = a != a, b != b
        if an or bn:
            return 0 if an and bn else (1 if an else -1)
    return (a > b) - (a < b)


_ORDER = {
    "=": lambda c: c == 0,
    "<>": lambda c: c != 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
}


class Semantics:
    """The operations of one dialect (and the Artemis `convert_string_expressions:` flag)."""

    def __init__(self, dialect: Any, convert_strings: bool = False):
        self.d = dialect
        self.convert = convert_strings
        self.error = dialect.mismatch == "error"

    # ------------------------------------------------------------------ coercion
    def _coerce(self, s: str, other: Any, left: bool) -> Any:
        """A string converted to the other operand's type (raises ValueError when it cannot be)."""
        if other is True or other is False:
            if self.d.string_coercion and left:  # RocketMQ: Boolean.valueOf(string)
                return s.lower() == "true"
            if self.convert and s.lower() in ("true", "false"):
                return s.lower() == "true"
            raise ValueError(s)
        if self.convert:  # Artemis convert_string_expressions: any number the string spells
            try:
                return _java_long_from_string(s)
            except ValueError:
                return _java_float_from_string(s)
        if isinstance(other, float):  # RocketMQ: the other side's number type
            return _java_float_from_string(s)
        return _java_long_from_string(s)

    def _mismatch(self, op: str) -> bool:
        if self.error:
            raise Abort(f"cannot compare values of different types with {op}")
        if self.d.mismatch == "not" and op == "<>":
            return True
        return False

    # ------------------------------------------------------------------ comparison
    def compare(self, op: str, a: Any, b: Any) -> bool | None:
        a = jms_value(a)
        b = jms_value(b)
        if a is None or b is None:
            if self.d.null_equality == "artemis" and op in ("=", "<>") and b is None:
                # Artemis: a NULL right operand alone is FALSE, both NULL TRUE (a NULL left operand
                # alone stays UNKNOWN); `<>` is NOT `=`
                equal = a is None
                return equal if op == "=" else not equal
            return None
        ca, cb = category(a), category(b)
        if ca != cb:
            if (self.convert or self.d.string_coercion) and (ca == "str" or cb == "str") and "other" not in (ca, cb):
                try:
                    if ca == "str":
                        a = self._coerce(a, b, True)
                    else:
                        b = self._coerce(b, a, False)
                except ValueError:
                    if self.error:
                        raise Abort("string does not convert to a number") from None
                    return self._mismatch(op) if self.d.mismatch == "not" else False
                ca = cb = category(a)
                if ca != category(b):
                    return self._mismatch(op)
            else:
                return self._mismatch(op)
        if ca == "num":
            return _ORDER[op](_num_cmp(a, b))
        if ca in ("str", "bool"):
            if op == "=":
                return a == b
            if op == "<>":
                return a != b
            if self.d.string_coercion and ca == "str":  # RocketMQ: two strings order as doubles
                try:
                    return _ORDER[op](_num_cmp(_java_float_from_string(a), _java_float_from_string(b)))
                except ValueError:
                    raise Abort(f"{op} on strings that are not numbers") from None
            if self.error:
                raise Abort(f"{op} needs numbers")
            return False
        return self._mismatch(op)  # opaque values have no operations

    def comparator(self, op: str) -> Callable[[Any, Any], Any]:
        compare = self.compare

        def cmp(a: Any, b: Any) -> Any:
            return compare(op, a, b)

        return cmp

    # ------------------------------------------------------------------ arithmetic
    def _number(self, v: Any) -> Any:
        v = jms_value(v)
        if v is None:
            return None
        c = category(v)
        if c == "num":
            return v
        if c == "str" and self.convert:  # Artemis convert_string_expressions: (RocketMQ: an error)
            try:
                return _java_long_from_string(v)
            except ValueError:
                try:
                    return _java_float_from_string(v)
                except ValueError:
                    pass
        if self.error:
            raise Abort("arithmetic needs numbers")
        return _NOT_A_NUMBER

    def arith(self, op: str, a: Any, b: Any) -> Any:
        if op == "+":
            a = jms_value(a)
            if a.__class__ is str:  # Java's createPlus: a string on the left concatenates
                text = java_text(jms_value(b))
                return None if text is None else a + text
        a = self._number(a)
        b = self._number(b)
        if a is None or b is None or a is _NOT_A_NUMBER or b is _NOT_A_NUMBER:
            return None
        if isinstance(a, float) or isinstance(b, float) or op == "/":
            a, b = float(a), float(b)
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if b == 0.0:
                if a != a or a == 0.0:
                    return math.nan
                return math.copysign(math.inf, a) * math.copysign(1.0, b)
            return a / b
        bits = 32 if isinstance(a, INT32_TYPES) and isinstance(b, INT32_TYPES) else 64
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        else:
            r = a * b
        r = _wrap(int(r), bits)
        return t.int32(r) if bits == 32 else r

    def plus(self, a: Any) -> Any:
        """Unary `+`: the number itself (a byte or short promoted to int, as in Java); UNKNOWN for a
        non-number.  Not `a + 0`: a string on the left of a binary `+` concatenates."""
        a = self._number(a)
        if a is None or a is _NOT_A_NUMBER:
            return None
        if isinstance(a, INT32_TYPES):
            return t.int32(a)
        return a

    def negate(self, a: Any) -> Any:
        a = self._number(a)
        if a is None or a is _NOT_A_NUMBER:
            return None
        if isinstance(a, float):
            return -a
        if isinstance(a, INT32_TYPES):
            return t.int32(_wrap(-int(a), 32))
        return _wrap(-int(a), 64)

    def arithmetic(self, op: str) -> Callable[[Any, Any], Any]:
        arith = self.arith

        def fn(a: Any, b: Any) -> Any:
            return arith(op, a, b)

        return fn

    # ------------------------------------------------------------------ predicates
    def string_of(self, v: Any) -> Any:
        """The string a LIKE / IN / string test looks at, or _MISMATCH."""
        v = jms_value(v)
        if isinstance(v, str):
            return v
        if self.error:
            raise Abort("a string operation needs a string")
        return _MISMATCH

    def predicate_of(self, negated: bool) -> Callable[[Callable[[str], bool], Any], Any]:
        """`predicate` taking the match as its first argument: one function for every LIKE and IN of
        a selector (the compact node tree of large selectors shares it)."""
        string_of = self.string_of
        artemis = self.d.mismatch == "not"

        def pred(match: Callable[[str], bool], v: Any) -> Any:
            if v is None:
                return None
            s = string_of(v)
            if s is _MISMATCH:
                return negated if artemis else False
            return (not match(s)) if negated else match(s)

        return pred

    def predicate(self, match: Callable[[str], bool], negated: bool) -> Callable[[Any], Any]:
        """LIKE / IN / string test over a value, with the dialect's NULL and mismatch rules."""
        string_of = self.string_of
        artemis = self.d.mismatch == "not"

        def pred(v: Any) -> Any:
            if v is None:
                return None
            s = string_of(v)
            if s is _MISMATCH:
                return negated if artemis else False
            return (not match(s)) if negated else match(s)

        return pred

    def string_test(self, match: Callable[[str], bool], negated: bool) -> Callable[[Any], Any]:
        """RocketMQ CONTAINS / STARTSWITH / ENDSWITH (and NOT forms) over a non-empty search string:
        a NULL or non-string value is FALSE, never UNKNOWN or an error."""

        def test(v: Any) -> bool:
            v = jms_value(v)
            if v.__class__ is not str:
                return False
            return (not match(v)) if negated else match(v)

        return test

    def numeric_in(self, values: tuple, negated: bool) -> Callable[[Any], Any]:
        """RocketMQ IN, whose list may hold numbers: each element compared with `=`."""
        compare = self.compare

        def pred(v: Any) -> Any:
            if v is None:
                return None
            found: Any = False
            for item in values:  # every element: an error in any of them decides (RocketMQ)
                r = compare("=", v, item)
                if r is True:
                    found = True
                elif r is None and found is False:
                    found = None
            if found is None:
                return None
            return (not found) if negated else found

        return pred

    def between(self, negated: bool) -> Callable[[Any, Any, Any], Any]:
        compare = self.compare
        strict_mismatch = self.d.mismatch == "false"

        def fn(v: Any, low: Any, high: Any) -> Any:
            ge = compare(">=", v, low)
            le = compare("<=", v, high)
            if ge is False or le is False:
                result: Any = False
                if negated and strict_mismatch and _mismatched(v, low, high):
                    return False
            elif ge is None or le is None:
                result = None
            else:
                result = True
            if not negated or result is None:
                return result
            return not result

        return fn

    def condition(self, v: Any) -> Any:
        """A bare identifier used as a condition: its boolean value, NULL, or FALSE for other types."""
        if v is True or v is False or v is None:
            return v
        return False


def _mismatched(v: Any, low: Any, high: Any) -> bool:
    cv = category(jms_value(v))
    return any(x is not None and category(jms_value(x)) != cv for x in (low, high))


def java_text(v: Any) -> str | None:
    """Java's `String.valueOf` of a JMS value (None for NULL and for values with no JMS type)."""
    if v is None:
        return None
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return java_float_text(v, isinstance(v, t.float32))
    if v.__class__ is str:
        return v
    return None


def java_float_text(x: float, single: bool = False) -> str:
    """Double.toString (Float.toString when `single`): the shortest digits that read back, written
    plain for 10^-3 <= |x| < 10^7 and as `d.dddE<n>` otherwise."""
    if x != x:
        return "NaN"
    if x in (math.inf, -math.inf):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    if single:
        for precision in range(9):
            text = f"{x:.{precision}e}"
            if t.float32(float(text)) == x:
                break
    else:
        text = repr(x)
    sign, digits, exponent = decimal.Decimal(text).as_tuple()
    digits_text = "".join(map(str, digits)).rstrip("0") or "0"
    point = len(digits) + exponent  # the decimal point sits after this many of the digits
    head = "-" if sign else ""
    if 1e-3 <= abs(x) < 1e7:
        if point <= 0:
            return f"{head}0.{'0' * -point}{digits_text}"
        whole = digits_text[:point].ljust(point, "0")
        return f"{head}{whole}.{digits_text[point:] or '0'}"
    return f"{head}{digits_text[0]}.{digits_text[1:] or '0'}E{point - 1}"


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_MISMATCH = _Sentinel("MISMATCH")
_NOT_A_NUMBER = _Sentinel("NOT_A_NUMBER")


def string_test_matcher(op: str, search: str) -> Callable[[str], bool]:
    """RocketMQ CONTAINS / STARTSWITH / ENDSWITH as a test of a string."""
    if op == "CONTAINS":
        return lambda s: search in s
    if op == "STARTSWITH":
        return lambda s: s.startswith(search)
    return lambda s: s.endswith(search)


# ---------------------------------------------------------------------- LIKE
def like_form(pattern: str, escape: str | None) -> tuple[str, str] | None:
    """("equals" | "prefix" | "suffix" | "contains", text) for patterns that are one of those, else None."""
    chars: list = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == escape and i + 1 < n and pattern[i + 1] in ("%", "_", escape):
            chars.append(pattern[i + 1])
            i += 2
            continue
        chars.append(None if ch == "_" else ("%" if ch == "%" else ch) if ch != "%" else _PERCENT)
        i += 1
    if any(c is None for c in chars):
        return None
    wild = [k for k, c in enumerate(chars) if c is _PERCENT]
    text = "".join(c for c in chars if c is not _PERCENT)
    last = len(chars) - 1
    if not wild:
        return ("equals", text)
    if wild == [last]:
        return ("prefix", text)
    if wild == [0] and last > 0:
        return ("suffix", text)
    if wild == [0, last] and last > 1:
        return ("contains", text)
    return None


_PERCENT = object()


def like_segments(pattern: str, escape: str | None) -> list[list]:
    """A LIKE pattern cut at each `%`: lists of characters, None for `_`."""
    segments: list[list] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == escape and i + 1 < n and pattern[i + 1] in ("%", "_", escape):
            segments[-1].append(pattern[i + 1])
            i += 2
            continue
        if ch == "%":
            segments.append([])
        elif ch == "_":
            segments[-1].append(None)
        else:
            segments[-1].append(ch)
        i += 1
    return segments


def like_search_chars(pattern: str, escape: str | None) -> int:
    """Characters of the pattern's segments between two `%` that mix `_` with other characters: the
    only ones searched for by a regex, at a cost of up to their length per character of the value
    (every other segment is a linear `str.find`, a fixed-offset check or a skip).  The parser bounds
    their sum per selector (`Limits.max_like_search`)."""
    segments = like_segments(pattern, escape)
    return sum(len(s) for s in segments[1:-1] if None in s and any(c is not None for c in s))


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A matcher for a LIKE pattern, linear in the value for a fixed pattern.

    The escape character (ActiveMQ / Artemis rule) quotes only a following `%`, `_` or itself;
    anywhere else, at the end included, it is an ordinary pattern character (so `ESCAPE '%'` works).

    The pattern is cut at each `%` into segments (with `_` as a one-character wildcard).  The first
    segment must match at the start, the last at the end, and each middle one is found leftmost after
    the previous: greedy leftmost placement is optimal for `%`-separated segments, so no backtracking.
    """
    segments = like_segments(pattern, escape)

    def plain(seg: list) -> str | None:
        return None if any(c is None for c in seg) else "".join(seg)

    if len(segments) == 1:
        seg = segments[0]
        text = plain(seg)
        if text is not None:
            return text.__eq__
        rx = _segment_regex(seg)
        return lambda s: rx.fullmatch(s) is not None

    first, middle, last = segments[0], segments[1:-1], segments[-1]
    pf, pl = plain(first), plain(last)
    middle = [m for m in middle if m]
    if not middle and pf is not None and pl is not None:
        if not pl:
            return (lambda s: True) if not pf else (lambda s: s.startswith(pf))
        if not pf:
            return lambda s: s.endswith(pl)
        lf, ll = len(pf), len(pl)
        return lambda s: len(s) >= lf + ll and s.startswith(pf) and s.endswith(pl)
    if not first and not last and len(middle) == 1 and plain(middle[0]) is not None:
        needle = plain(middle[0])
        return lambda s: needle in s

    finders = tuple((plain(m), None if all(c is None for c in m) else _segment_regex(m), len(m)) for m in middle)
    return _LikeSegments(len(first), len(last), _pieces(first), _pieces(last), finders)


def _pieces(seg: list) -> tuple:
    """A fixed-length segment as its literal runs: ((offset, text), ...); `_` is what lies between."""
    out, start = [], None
    for k, c in enumerate(seg + [None]):
        if c is not None and start is None:
            start = k
        elif c is None and start is not None:
            out.append((start, "".join(seg[start:k])))
            start = None
    return tuple(out)


class _LikeSegments:
    """The general LIKE matcher: a slotted record called with the value (a fraction of a closure's
    memory: a selector may hold hundreds of LIKEs, issue 43)."""

    __slots__ = ("lf", "ll", "first", "last", "finders")

    def __init__(self, lf: int, ll: int, first: tuple, last: tuple, finders: tuple):
        self.lf, self.ll, self.first, self.last, self.finders = lf, ll, first, last, finders

    def __call__(self, s: str) -> bool:
        n, lf, ll = len(s), self.lf, self.ll
        if n < lf + ll:
            return False
        for offset, text in self.first:
            if not s.startswith(text, offset):
                return False
        end = n - ll
        for offset, text in self.last:
            if not s.startswith(text, end + offset):
                return False
        pos = lf
        for text, rx, size in self.finders:
            if text is not None:
                found = s.find(text, pos, end)
            elif rx is None:  # only `_`: the next `size` characters, whatever they are
                found = pos
            else:
                m = rx.search(s, pos, end)
                found = -1 if m is None else m.start()
            if found < 0:
                return False
            pos = found + size
        return pos <= end


def _segment_regex(seg: list) -> "re.Pattern[str]":
    return re.compile("".join("." if c is None else re.escape(c) for c in seg), re.DOTALL)


# ----------------------------------------------------------------------------- amqp-sql
# OASIS filtex §6 as RabbitMQ 4.2 evaluates it (rabbit_amqp_filter_sql.erl): values are compared as
# Erlang terms.  Strings, symbols and binaries are all byte strings (a string equals the binary of
# its UTF-8 bytes), integers of any width and doubles compare by value, booleans only with booleans;
# `=` between unlike types is FALSE and `<>` TRUE; < <= > >= order two numbers or two byte strings,
# anything else is FALSE; arithmetic takes numbers only (`/` always divides to a double, `%` takes
# integers), division by zero and any other mismatch give UNKNOWN.


def sql_value(v: Any) -> Any:
    """The amqp-sql value of an AMQP value: None, bool, int, float, str, bytes or an `Opaque`."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, _uuid.UUID):
        return v.bytes  # RabbitMQ reads a uuid as its 16 bytes
    return Opaque(v)


def _sql_field_getter(key: str) -> Callable[[Any], Any]:
    if key == "priority":

        def priority(m: Any) -> Any:
            h = m.header
            return 4 if h is None or h.priority is None else int(h.priority)

        return priority

    def get(m: Any) -> Any:
        p = m.properties
        return None if p is None else sql_value(getattr(p, key))

    return get


SQL_FIELD_SECTIONS = {"priority": frozenset({"header"})}


def sql_field(key: str) -> tuple[frozenset, Callable[[Any], Any]]:
    """(sections read, getter) for an amqp-sql `header.` / `properties.` field."""
    return SQL_FIELD_SECTIONS.get(key, frozenset({"properties"})), _sql_field_getter(key)


def _sql_bytes(v: Any) -> Any:
    return v.encode("utf-8", "surrogatepass") if v.__class__ is str else v


def _sql_number(v: Any) -> bool:
    # Erlang has no NaN or infinities: such a double is no number here (compared, it is unlike all)
    return v.__class__ is int or (v.__class__ is float and math.isfinite(v))


def sql_equal(a: Any, b: Any) -> bool:
    """Erlang `==` on two (non-NULL) amqp-sql values."""
    ca, cb = a.__class__, b.__class__
    if ca is bool or cb is bool:
        return ca is cb and a is b
    if _sql_number(a) and _sql_number(b):
        return a == b
    if ca is cb and ca is not Opaque and ca is not float:  # an opaque value, NaN or infinity equals nothing
        return a == b
    if (ca is str or ca is bytes) and (cb is str or cb is bytes):
        return _sql_bytes(a) == _sql_bytes(b)
    return False


def _sql_order(op: str) -> Callable[[Any, Any], Any]:
    import operator

    fn = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}[op]

    def order(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        if _sql_number(a) and _sql_number(b):
            return fn(a, b)
        ca, cb = a.__class__, b.__class__
        if ca is str and cb is str:
            return fn(a, b)  # code point order is UTF-8 byte order
        if (ca is str or ca is bytes) and (cb is str or cb is bytes):
            return fn(_sql_bytes(a), _sql_bytes(b))
        return False

    return order


def _sql_eq(a: Any, b: Any) -> Any:
    return None if a is None or b is None else sql_equal(a, b)


def _sql_ne(a: Any, b: Any) -> Any:
    return None if a is None or b is None else not sql_equal(a, b)


SQL_COMPARATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": _sql_eq,
    "<>": _sql_ne,
    **{op: _sql_order(op) for op in ("<", "<=", ">", ">=")},
}


def _sql_finite(x: Any) -> Any:
    if x.__class__ is float and (x != x or x in (math.inf, -math.inf)):
        return None  # Erlang has no infinities: the evaluation fails, UNKNOWN here
    return x


def _sql_arith(op: str) -> Callable[[Any, Any], Any]:
    def arith(a: Any, b: Any) -> Any:
        if not (_sql_number(a) and _sql_number(b)):
            return None
        try:
            if op == "+":
                return _sql_finite(a + b)
            if op == "-":
                return _sql_finite(a - b)
            if op == "*":
                return _sql_finite(a * b)
            if op == "/":
                return None if b == 0 else _sql_finite(a / b)
            if a.__class__ is not int or b.__class__ is not int or b == 0:  # %
                return None
            r = abs(a) % abs(b)  # Erlang rem: the sign of the dividend
            return -r if a < 0 else r
        except OverflowError:
            return None

    return arith


SQL_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {op: _sql_arith(op) for op in ("+", "-", "*", "/", "%")}


def sql_sign(op: str) -> Callable[[Any], Any]:
    if op == "-":
        return lambda v: -v if _sql_number(v) else None
    return lambda v: v if _sql_number(v) else None


def sql_condition(v: Any) -> Any:
    """A value used as a condition: a boolean is itself, anything else UNKNOWN."""
    return v if v is True or v is False else None


def sql_like_pattern(pattern: str, escape: str | None) -> str:
    """The JMS-rule LIKE pattern equal to an amqp-sql one: in amqp-sql (RabbitMQ) the escape character
    makes whatever follows it literal, in JMS only a following `%`, `_` or escape character."""
    if escape is None or escape not in pattern:
        return pattern
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == escape and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(ch + nxt if nxt in ("%", "_", escape) else nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def sql_like(pattern: str, escape: str | None, negated: bool) -> Callable[[Any], Any]:
    match = like_matcher(sql_like_pattern(pattern, escape), escape)

    def like(v: Any) -> Any:
        if v.__class__ is bytes:
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if v.__class__ is not str:
            return None  # NULL or not a string: UNKNOWN
        return not match(v) if negated else match(v)

    return like


def sql_in(values: tuple, negated: bool) -> Callable[[Any], Any]:
    def is_in(v: Any) -> Any:
        if v is None:
            return None
        found = any(sql_equal(v, x) for x in values)
        return not found if negated else found

    return is_in


def sql_utc() -> int:
    return _time.time_ns() // 1_000_000
