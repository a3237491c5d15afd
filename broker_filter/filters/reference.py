"""The reference interpreter: a plain tree walk over the selector AST, written for clarity, not speed.

Theory of operation: this module restates docs/selectors.md as directly as Python allows, so that
the compiled evaluator can be tested against it (and a reader can check it against the document
line by line).  Nothing here is shared with the compiled evaluator except the message view
(`view.HEADERS`, `view.jms_value`), which both use for identifier lookup.

Every value is a `Value(kind, data)` with kind one of

    null  boolean  int (Java 32-bit)  long (Java 64-bit)  double  string  opaque

(`float` and `double` are one kind: docs/selectors.md computes with doubles whenever either side
is a float or a double, and compares numbers numerically).  Conditions evaluate to True, False or
None (UNKNOWN).  In the `rocketmq` dialect an evaluation error (a type mismatch, a string where a
number is needed...) raises `EvaluationError`, which ends the whole evaluation: the message is not
delivered: the whole selector is FALSE, whatever the rest of it says.  Both operands of
AND / OR are always evaluated, so an error anywhere is seen.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from . import ast
from ..amqp.types import float32
from .view import HEADERS, INT32_TYPES, jms_value


class Value(NamedTuple):
    kind: str  # null | boolean | int | long | double | string | opaque
    data: Any


NULL = Value("null", None)
NUMERIC_KINDS = frozenset({"int", "long", "double"})
INTEGER_KINDS = frozenset({"int", "long"})


class EvaluationError(Exception):
    """A RocketMQ evaluation error: the message is not delivered."""


def evaluate(selector: ast.Selector, message: Any) -> bool | None:
    """TRUE, FALSE or UNKNOWN (None) for `message` under `selector`."""
    if selector.expr is None:
        return True
    if selector.dialect == "amqp-sql":
        return SqlInterpreter(message).condition(selector.expr)
    interpreter = Interpreter(selector.dialect, selector.convert_strings, message)
    try:
        return interpreter.condition(selector.expr)
    except EvaluationError:
        return False  # the whole selector is FALSE, whatever the other operands


# ----------------------------------------------------------------------------- three-valued logic
def logical_not(a: bool | None) -> bool | None:
    return None if a is None else not a


def logical_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def logical_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


# ----------------------------------------------------------------------------- values
def value_of(jms: Any) -> Value:
    """A `Value` for a JMS value as `view.jms_value` or a header getter returns it."""
    if jms is None:
        return NULL
    if isinstance(jms, bool):
        return Value("boolean", jms)
    if isinstance(jms, int):
        return Value("int" if isinstance(jms, INT32_TYPES) else "long", int(jms))
    if isinstance(jms, float):
        return Value("double", jms)  # a float32 keeps its class: `'x' + f` writes it as a Java float
    if isinstance(jms, str):
        return Value("string", str(jms))
    return Value("opaque", jms)


def wrap(n: int, bits: int) -> int:
    """Java's two's-complement overflow: `n` reduced to a signed `bits`-bit integer."""
    modulus = 1 << bits
    n %= modulus
    return n - modulus if n >= modulus // 2 else n


def integer_value(kind: str, n: int) -> Value:
    return Value(kind, wrap(n, 32 if kind == "int" else 64))


# What Java's Long.parseLong and Double.parseDouble accept (ASCII digits; no hexadecimal floats).
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_DOUBLE_TEXT = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)")


def parse_integer(text: str) -> int | None:
    """`text` as Java's Long.parseLong reads it, or None."""
    if _INTEGER_TEXT.fullmatch(text):
        n = int(text)
        if -(2**63) <= n < 2**63:
            return n
    return None


def parse_double(text: str) -> float | None:
    """`text` as Java's Double.parseDouble reads it (surrounding control characters and spaces
    ignored, NaN, Infinity, an f/d suffix), or None."""
    trimmed = _java_trim(text)
    if not _DOUBLE_TEXT.fullmatch(trimmed):
        return None
    body = trimmed.rstrip("fFdD")
    if body.lstrip("+-") == "NaN":
        return math.nan
    if body.lstrip("+-") == "Infinity":
        return -math.inf if body.startswith("-") else math.inf
    return float(body)  # Python rounds like Java and overflows to infinity the same way


def _java_trim(text: str) -> str:
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


def parse_number(text: str) -> Value | None:
    """A string read as a number (integer as long, else decimal as double), or None."""
    n = parse_integer(text)
    if n is not None:
        return Value("long", n)
    d = parse_double(text)
    if d is not None:
        return Value("double", d)
    return None


def parse_boolean(text: str) -> Value | None:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return Value("boolean", lowered == "true")
    return None


def like_match(text: str, pattern: str, escape: str | None) -> bool:
    """SQL LIKE over the whole text: `_` one character, `%` any run.  The escape character makes a
    following `%`, `_` or escape character literal; followed by anything else (or by nothing) it is
    an ordinary pattern character itself (ActiveMQ and Artemis `shouldEscapeNext`)."""
    tokens: list[tuple[str, str]] = []  # ("lit", c) | ("one", "") | ("any", "")
    i = 0
    while i < len(pattern):
        c = pattern[i]
        following = pattern[i + 1 : i + 2]
        if c == escape and following and following in "%_" + escape:
            tokens.append(("lit", following))
            i += 2
            continue
        if c == "%":
            tokens.append(("any", ""))
        elif c == "_":
            tokens.append(("one", ""))
        else:
            tokens.append(("lit", c))
        i += 1
    # matched[j]: the first i characters of text match the first j tokens (dynamic programming).
    matched = [False] * (len(tokens) + 1)
    matched[0] = True
    for j, (kind, _) in enumerate(tokens):
        if kind == "any":
            matched[j + 1] = matched[j]
    for ch in text:
        row = [False] * (len(tokens) + 1)
        for j, (kind, lit) in enumerate(tokens):
            if kind == "any":
                row[j + 1] = row[j] or matched[j + 1]
            elif kind == "one":
                row[j + 1] = matched[j]
            else:
                row[j + 1] = matched[j] and ch == lit
        matched = row
    return matched[len(tokens)]


# ----------------------------------------------------------------------------- the interpreter
class Interpreter:
    def __init__(self, dialect: str, convert_strings: bool, message: Any):
        self.dialect = dialect
        self.convert_strings = convert_strings
        self.message = message

    def fail_or(self, answer: bool | None) -> bool | None:
        """`answer` in `jms` / `artemis`; an evaluation error in `rocketmq`."""
        if self.dialect == "rocketmq":
            raise EvaluationError()
        return answer

    # ------------------------------------------------------------------ conditions
    def condition(self, node: Any) -> bool | None:
        if isinstance(node, ast.Unary) and node.op == "NOT":
            return logical_not(self.condition(node.operand))
        if isinstance(node, ast.Binary) and node.op in ast.LOGICAL_OPS:
            left = self.condition(node.left)
            right = self.condition(node.right)
            return logical_and(left, right) if node.op == "AND" else logical_or(left, right)
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISON_OPS:
            return self.compare(node.op, self.value(node.left), self.value(node.right))
        if isinstance(node, ast.Between):
            return self.between(node)
        if isinstance(node, ast.In):
            return self.member(node)
        if isinstance(node, ast.Like):
            return self.like(node)
        if isinstance(node, ast.IsNull):
            is_null = self.value(node.operand).kind == "null"
            return not is_null if node.negated else is_null
        if isinstance(node, ast.StringTest):
            return self.string_test(node)
        if isinstance(node, ast.Tags):
            return self.tags(node)
        return self.truth(self.value(node))

    def truth(self, v: Value) -> bool | None:
        """A value used as a condition: a boolean is itself, NULL is UNKNOWN, anything else FALSE."""
        if v.kind == "boolean":
            return v.data
        if v.kind == "null":
            return None
        return False

    def compare(self, op: str, left: Value, right: Value) -> bool | None:
        if self.dialect == "artemis":
            return self.compare_artemis(op, left, right)
        if self.dialect == "rocketmq":
            return self.compare_rocketmq(op, left, right)
        return self.compare_jms(op, left, right)

    def compare_jms(self, op: str, left: Value, right: Value) -> bool | None:
        if left.kind == "null" or right.kind == "null":
            return None
        if left.kind in NUMERIC_KINDS and right.kind in NUMERIC_KINDS:
            return numeric_compare(op, left.data, right.data)
        if left.kind == right.kind and left.kind in ("string", "boolean"):
            if op == "=":
                return left.data == right.data
            if op == "<>":
                return left.data != right.data
            return False  # strings and booleans have no order
        return False  # non-like types: FALSE for every operator, <> included

    def compare_artemis(self, op: str, left: Value, right: Value) -> bool | None:
        if self.convert_strings:
            left, right = self.converted(left, right), self.converted(right, left)
        if op in ("=", "<>"):
            if left.kind == "null" and right.kind != "null":
                return None  # a NULL left operand alone: UNKNOWN, for `<>` (NOT `=`) too
            if left.kind == "null" or right.kind == "null":
                equal = left.kind == right.kind  # both NULL: TRUE; a NULL right operand alone: FALSE
            elif left.kind in NUMERIC_KINDS and right.kind in NUMERIC_KINDS:
                equal = numeric_compare("=", left.data, right.data)
            elif left.kind == right.kind and left.kind in ("string", "boolean"):
                equal = left.data == right.data
            else:
                equal = False
            return equal if op == "=" else not equal
        if left.kind == "null" or right.kind == "null":
            return None
        if left.kind in NUMERIC_KINDS and right.kind in NUMERIC_KINDS:
            return numeric_compare(op, left.data, right.data)
        return False

    def converted(self, v: Value, other: Value) -> Value:
        """Artemis `convert_string_expressions:`: a string read as the other side's kind."""
        if v.kind != "string":
            return v
        if other.kind in NUMERIC_KINDS:
            return parse_number(v.data) or v
        if other.kind == "boolean":
            return parse_boolean(v.data) or v
        return v

    def compare_rocketmq(self, op: str, left: Value, right: Value) -> bool | None:
        if left.kind == "null" or right.kind == "null":
            return None
        if left.kind == "string" and right.kind == "boolean":
            left = Value("boolean", left.data.lower() == "true")  # Boolean.valueOf(string)
        if left.kind == right.kind == "string" and op not in ("=", "<>"):
            left, right = Value("double", parse_double(left.data)), Value("double", parse_double(right.data))
            if left.data is None or right.data is None:
                raise EvaluationError()  # strings order only as numbers (Double.valueOf)
        left, right = self.coerced(left, right), self.coerced(right, left)
        if left.kind in NUMERIC_KINDS and right.kind in NUMERIC_KINDS:
            return numeric_compare(op, left.data, right.data)
        if left.kind == right.kind and left.kind in ("string", "boolean") and op in ("=", "<>"):
            return (left.data == right.data) == (op == "=")
        raise EvaluationError()

    def coerced(self, v: Value, other: Value) -> Value:
        """RocketMQ: a string compared with a number is read as that number's type, or fails."""
        if v.kind != "string" or other.kind not in NUMERIC_KINDS:
            return v
        if other.kind in INTEGER_KINDS:
            n = parse_integer(v.data)
            if n is None:
                raise EvaluationError()
            return Value("long", n)
        d = parse_double(v.data)
        if d is None:
            raise EvaluationError()
        return Value("double", d)

    def between(self, node: ast.Between) -> bool | None:
        v, low, high = self.value(node.operand), self.value(node.low), self.value(node.high)
        inside = logical_and(self.compare(">=", v, low), self.compare("<=", v, high))
        if not node.negated:
            return inside
        if self.dialect == "jms" and (mismatched(v, low) or mismatched(v, high)):
            return False
        return logical_not(inside)

    def member(self, node: ast.In) -> bool | None:
        v = self.value(node.operand)
        if self.dialect == "rocketmq":
            # Each item is an `=` comparison; a string item needs a string operand (IN on a
            # non-string is an error), a number item compares as `=` does (with coercion).
            found: bool | None = False
            for literal in node.values:
                item = self.value(literal)
                if item.kind == "string" and v.kind not in ("string", "null"):
                    raise EvaluationError()
                found = logical_or(found, self.compare("=", v, item))
            return logical_not(found) if node.negated else found
        if v.kind == "null":
            return None
        if v.kind != "string":
            return node.negated if self.dialect == "artemis" else False
        found = any(literal.type == "string" and literal.value == v.data for literal in node.values)
        return not found if node.negated else found

    def like(self, node: ast.Like) -> bool | None:
        v = self.value(node.operand)
        if v.kind == "null":
            return None
        if v.kind != "string":
            return self.fail_or(node.negated if self.dialect == "artemis" else False)
        found = like_match(v.data, node.pattern, node.escape)
        return not found if node.negated else found

    def string_test(self, node: ast.StringTest) -> bool | None:
        """RocketMQ: an empty search string, a NULL and a non-string are all FALSE (NOT forms too)."""
        v = self.value(node.operand)
        if node.value == "" or v.kind != "string":
            return False
        if node.op == "CONTAINS":
            found = node.value in v.data
        elif node.op == "STARTSWITH":
            found = v.data.startswith(node.value)
        else:
            found = v.data.endswith(node.value)
        return not found if node.negated else found

    def tags(self, node: ast.Tags) -> bool:
        if node.tags is None:
            return True
        tag = HEADERS["TAGS"][1](self.message)
        return tag is not None and tag in node.tags

    # ------------------------------------------------------------------ values
    def value(self, node: Any) -> Value:
        if isinstance(node, ast.Literal):
            if node.type == "string":
                return Value("string", node.value)
            if node.type == "boolean":
                return Value("boolean", bool(node.value))
            if node.type in INTEGER_KINDS:
                return Value(node.type, int(node.value))
            return Value("double", float(node.value))
        if isinstance(node, ast.Ident):
            return self.lookup(node)
        if isinstance(node, ast.Unary) and node.op in ("+", "-"):
            return self.negate(self.value(node.operand)) if node.op == "-" else self.plus(self.value(node.operand))
        if isinstance(node, ast.Binary) and node.op in ast.ARITHMETIC_OPS:
            return self.arithmetic(node.op, self.value(node.left), self.value(node.right))
        # A condition used as a value (the parser refuses most of these): its truth value.
        truth = self.condition(node)
        return NULL if truth is None else Value("boolean", truth)

    def lookup(self, ident: ast.Ident) -> Value:
        m = self.message
        if ident.kind == "header":
            return value_of(HEADERS[ident.key][1](m))
        if ident.kind == "annotation":
            section = m.message_annotations
        else:
            section = m.application_properties
        if not section:
            return NULL
        return value_of(jms_value(section.get(ident.key)))

    def number(self, v: Value) -> Value:
        """An arithmetic operand: a number or NULL; anything else is UNKNOWN (an error in rocketmq)."""
        if v.kind == "string" and self.convert_strings:
            v = parse_number(v.data) or v
        if v.kind == "null" or v.kind in NUMERIC_KINDS:
            return v
        if self.dialect == "rocketmq":
            raise EvaluationError()
        return NULL

    def plus(self, v: Value) -> Value:
        return self.number(v)

    def negate(self, v: Value) -> Value:
        v = self.number(v)
        if v.kind == "null":
            return NULL
        if v.kind == "double":
            return Value("double", -v.data)
        return integer_value(v.kind, -v.data)

    def arithmetic(self, op: str, left: Value, right: Value) -> Value:
        if op == "+" and left.kind == "string":
            text = java_string(right)  # createPlus: a string on the left concatenates
            return NULL if text is None else Value("string", left.data + text)
        left, right = self.number(left), self.number(right)
        if left.kind == "null" or right.kind == "null":
            return NULL
        if op == "/":  # ArithmeticExpression.divide: always as doubles
            return Value("double", float_divide(float(left.data), float(right.data)))
        if left.kind == "double" or right.kind == "double":
            a, b = float(left.data), float(right.data)
            if op == "+":
                return Value("double", a + b)
            if op == "-":
                return Value("double", a - b)
            if op == "*":
                return Value("double", a * b)
            return Value("double", float_divide(a, b))
        kind = "long" if "long" in (left.kind, right.kind) else "int"
        a, b = left.data, right.data
        if op == "+":
            return integer_value(kind, a + b)
        if op == "-":
            return integer_value(kind, a - b)
        return integer_value(kind, a * b)


def java_string(v: Value) -> str | None:
    """String.valueOf of a value, or None for NULL and for values JMS has no type for."""
    if v.kind == "string":
        return v.data
    if v.kind == "boolean":
        return str(v.data).lower()
    if v.kind in INTEGER_KINDS:
        return str(v.data)
    if v.kind == "double":
        return java_decimal(v.data, isinstance(v.data, float32))
    return None


def java_decimal(x: float, single: bool) -> str:
    """Double.toString / Float.toString: NaN, (-)Infinity, else the fewest significant digits that
    read back as `x`, plain when 0.001 <= |x| < 10^7, else one digit, a point and `E` exponent."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "-Infinity" if x < 0 else "Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    digits, exponent = "", 0
    for significant in range(1, 18):
        mantissa, _, power = f"{abs(x):.{significant - 1}e}".partition("e")
        candidate = float(f"{mantissa}e{power}")
        if (float32(candidate) == float32(abs(x))) if single else candidate == abs(x):
            digits, exponent = mantissa.replace(".", "").rstrip("0") or "0", int(power)
            break
    sign = "-" if x < 0 else ""
    if 1e-3 <= abs(x) < 1e7:
        if exponent < 0:
            return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
        whole, fraction = digits[: exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1 :]
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def mismatched(a: Value, b: Value) -> bool:
    """Two non-NULL values of non-like types (JMS NOT BETWEEN): two numbers, two strings or two
    booleans are alike; an opaque value is like nothing."""
    if a.kind == "null" or b.kind == "null":
        return False
    if a.kind in NUMERIC_KINDS and b.kind in NUMERIC_KINDS:
        return False
    return not (a.kind == b.kind and a.kind in ("string", "boolean"))


def numeric_compare(op: str, a: Any, b: Any) -> bool:
    """Numbers compared as Java does: an integer against a double is widened to double first; NaN
    equals NaN and is greater than every other number (`Double.compareTo`); -0.0 equals 0.0."""
    if isinstance(a, float) or isinstance(b, float):
        order = double_order(float(a), float(b))
    else:
        order = (a > b) - (a < b)
    if op == "=":
        return order == 0
    if op == "<>":
        return order != 0
    if op == "<":
        return order < 0
    if op == "<=":
        return order <= 0
    if op == ">":
        return order > 0
    return order >= 0


def double_order(a: float, b: float) -> int:
    """-1, 0 or 1: the order of two doubles with NaN above everything (and equal to itself)."""
    if math.isnan(a) or math.isnan(b):
        return int(math.isnan(a)) - int(math.isnan(b))
    return (a > b) - (a < b)


def float_divide(a: float, b: float) -> float:
    """IEEE 754 division: x/0 is +-Infinity, 0/0 and NaN/0 are NaN."""
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


# ----------------------------------------------------------------------------- amqp-sql
class SqlInterpreter:
    """amqp-sql (docs/selectors.md, "The amqp-sql dialect") restated over Erlang-like terms, as
    RabbitMQ evaluates it: ("null",), ("bool", b), ("num", x), ("bytes", b) for strings, symbols and
    binaries alike (strings as their UTF-8 bytes), ("other", v).  Conditions are True/False/None."""

    PROPERTY_FIELDS = (
        "message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
        "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
        "reply_to_group_id",
    )  # fmt: skip

    def __init__(self, message: Any):
        self.message = message

    @staticmethod
    def term(v: Any) -> tuple:
        import uuid

        if v is None:
            return ("null",)
        if v is True or v is False:
            return ("bool", v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
                return ("other", v)
            return ("num", v)
        if isinstance(v, str):
            return ("bytes", v.encode("utf-8", "surrogatepass"))
        if isinstance(v, (bytes, bytearray, memoryview)):
            return ("bytes", bytes(v))
        if isinstance(v, uuid.UUID):
            return ("bytes", v.bytes)
        return ("other", v)

    def lookup(self, node: ast.Ident) -> tuple:
        m = self.message
        if node.kind == "property":
            props = m.application_properties or {}
            return self.term(props.get(node.key))
        if node.key == "priority":
            h = m.header
            return ("num", 4 if h is None or h.priority is None else int(h.priority))
        p = m.properties
        return self.term(None if p is None else getattr(p, node.key))

    def value(self, node: Any) -> tuple:
        if isinstance(node, ast.Literal):
            return self.term(node.value)
        if isinstance(node, ast.Ident):
            return self.lookup(node)
        if isinstance(node, ast.Call):
            import time

            return ("num", int(time.time() * 1000))
        if isinstance(node, ast.Unary) and node.op in ("+", "-"):
            v = self.value(node.operand)
            if v[0] != "num":
                return ("null",)
            return ("num", -v[1] if node.op == "-" else v[1])
        if isinstance(node, ast.Binary) and node.op in ast.ARITHMETIC_OPS:
            return self.arithmetic(node.op, self.value(node.left), self.value(node.right))
        c = self.condition(node)
        return ("null",) if c is None else ("bool", c)

    @staticmethod
    def arithmetic(op: str, a: tuple, b: tuple) -> tuple:
        if a[0] != "num" or b[0] != "num":
            return ("null",)
        x, y = a[1], b[1]
        if op == "+":
            r = x + y
        elif op == "-":
            r = x - y
        elif op == "*":
            r = x * y
        elif op == "/":
            if y == 0:
                return ("null",)
            try:
                r = float(x) / float(y) if not (isinstance(x, int) and isinstance(y, int)) else x / y
            except OverflowError:
                return ("null",)
        else:  # % : integers only, the remainder takes the dividend's sign (Erlang rem)
            if not (isinstance(x, int) and isinstance(y, int)) or y == 0:
                return ("null",)
            r = abs(x) % abs(y) if x >= 0 else -(abs(x) % abs(y))
        if isinstance(r, float) and (math.isinf(r) or math.isnan(r)):
            return ("null",)
        return ("num", r)

    @staticmethod
    def equal(a: tuple, b: tuple) -> bool:
        # num 1 == num 1.0; bool only with bool; a value without operations (NaN, a list...) equals nothing
        return a[0] == b[0] != "other" and a[1] == b[1]

    def condition(self, node: Any) -> bool | None:
        if isinstance(node, ast.Unary) and node.op == "NOT":
            return logical_not(self.condition(node.operand))
        if isinstance(node, ast.Binary) and node.op == "AND":
            return logical_and(self.condition(node.left), self.condition(node.right))
        if isinstance(node, ast.Binary) and node.op == "OR":
            return logical_or(self.condition(node.left), self.condition(node.right))
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISON_OPS:
            a, b = self.value(node.left), self.value(node.right)
            if a[0] == "null" or b[0] == "null":
                return None
            if node.op == "=":
                return self.equal(a, b)
            if node.op == "<>":
                return not self.equal(a, b)
            if a[0] != b[0] or a[0] not in ("num", "bytes"):
                return False
            x, y = a[1], b[1]
            return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[node.op]
        if isinstance(node, ast.IsNull):
            is_null = self.value(node.operand)[0] == "null"
            return not is_null if node.negated else is_null
        if isinstance(node, ast.Like):
            v = self.value(node.operand)
            if v[0] != "bytes":
                return None
            try:
                text = v[1].decode("utf-8")
            except UnicodeDecodeError:
                return None
            hit = re.fullmatch(_sql_like_regex(node.pattern, node.escape), text, re.DOTALL) is not None
            return not hit if node.negated else hit
        if isinstance(node, ast.In):
            v = self.value(node.operand)
            if v[0] == "null":
                return None
            hit = any(self.equal(v, self.value(x)) for x in node.values)
            return not hit if node.negated else hit
        v = self.value(node)
        return v[1] if v[0] == "bool" else None


def _sql_like_regex(pattern: str, escape: str | None) -> str:
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return "".join(out)
