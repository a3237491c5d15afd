"""Selector AST -> one native Spark SQL Column (no Python UDF), with the core's exact semantics.

Theory of operation: a condition compiles to a boolean Column whose SQL NULL is the JMS UNKNOWN, so
Spark's own three-valued AND / OR / NOT are the selector's.  A value compiles to a `Val`: a dynamic
kind tag (a string Column: boolean, int, long, double, string, opaque; NULL for a NULL value) plus
one Column per representation (`l` bigint for int/long, `d` double, `s` string, `b` boolean).  The
archive's typed maps (broker_filter.archive.parquet.TYPED) carry the AMQP type name, from which the tag
follows the AMQP -> JMS table of docs/selectors.md.  Each `Val` also knows statically which kinds it
can have, so a header that is always a long or a literal needs no run-time tag tests at all.

Rules mirrored from the reference interpreter (broker_filter.filters.reference):
* float and double are one kind (double); numbers compare as Java does (an integer against a double
  is widened to double; NaN equals NaN and sorts above every number; -0.0 equals 0.0), which is
  exactly Spark's double comparison;
* int arithmetic wraps at 32 bits, long at 64 (the session must run with spark.sql.ansi.enabled=false,
  which `configure` sets); `/` always divides as doubles, and by zero gives +-Infinity or NaN
  (Spark's `/` would give NULL); `+` with a string on the left concatenates the right operand's
  Java text (Spark's casts to string write doubles and floats as Java's toString does);
* rocketmq: every condition whose evaluation fails (a type mismatch, an unparsable string...) is
  collected, and the selector is FALSE when any of them holds, as AND / OR evaluate both sides.

The session needs `spark.sql.ansi.enabled=false` for Java's wrapping arithmetic (`configure`).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

from .layers import hidden_names, keep_fields, like_regex, regex_literal
from .sqlexpr import E as Column
from .sqlexpr import functions as F

from ..filters import FilterNode, FilterVisitor, ast
from ..filters.wildcards import canonical

KINDS = frozenset({"boolean", "int", "long", "double", "string", "opaque"})
NUMERIC = frozenset({"int", "long", "double"})
INTEGER = frozenset({"int", "long"})
# A Val's run-time tag is a small integer (cheaper per row than a string); NULL for a NULL value.
CODE = {"boolean": 1, "int": 2, "long": 3, "double": 4, "string": 5, "opaque": 6}

# AMQP type name (archive TYPED.type) -> JMS kind
_AMQP_KIND = {
    **{n: "int" for n in ("ubyte", "ushort", "byte", "short", "int")},
    **{n: "long" for n in ("uint", "ulong", "long", "timestamp")},
    **{n: "double" for n in ("float", "double", "decimal32", "decimal64", "decimal128")},
    "string": "string",
    "symbol": "string",
    "boolean": "boolean",
}

_INTEGER_TEXT = r"\A[+-]?[0-9]+\z"
# What Java's Double.parseDouble accepts after trimming (no hexadecimal floats), as the core reads it.
_DOUBLE_TEXT = r"\A[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)\z"  # Double.valueOf: no suffix after NaN or Infinity
_JAVA_TRIM = r"\A[\x{0}-\x{20}]+|[\x{0}-\x{20}]+\z"
ROCKETMQ_FAILURE = False  # what the core answers when a rocketmq evaluation fails (not delivered)


class UnsupportedError(ValueError):
    """A filter the Spark backend cannot express (says which part)."""


def configure(spark: Any) -> None:
    """Session settings the compiled expressions rely on (Java wrapping integer arithmetic)."""
    spark.conf.set("spark.sql.ansi.enabled", "false")


# ----------------------------------------------------------------------------- static conditions
# A condition during compilation is a Python bool (known statically) or a boolean Column.
def _and(*cs: Any) -> Any:
    out: Any = True
    for c in cs:
        if c is False:
            return False
        if c is True:
            continue
        out = c if out is True else (out & c)
    return out


def _or(*cs: Any) -> Any:
    out: Any = False
    for c in cs:
        if c is True:
            return True
        if c is False:
            continue
        out = c if out is False else (out | c)
    return out


def _not(c: Any) -> Any:
    return (not c) if isinstance(c, bool) else ~c


def _col(c: Any) -> Column:
    return c if isinstance(c, Column) else F.lit(c)


def _case(branches: list[tuple[Any, Any]], otherwise: Any) -> Column:
    """CASE WHEN ... with statically known conditions folded away.  Values: Column or constant."""
    expr = None
    for cond, value in branches:
        if cond is False:
            continue
        if cond is True:
            return _col(value) if expr is None else expr.otherwise(_col(value))
        expr = F.when(cond, _col(value)) if expr is None else expr.when(cond, _col(value))
    if expr is None:
        return _col(otherwise)
    return expr.otherwise(_col(otherwise))


def _safe(c: Any) -> Any:
    """A condition with NULL read as false (for folding failures and guards)."""
    return c if isinstance(c, bool) else F.coalesce(c, F.lit(False))


# ----------------------------------------------------------------------------- values
@dataclass
class Val:
    kinds: frozenset  # statically possible kinds of a non-NULL value
    nullable: bool
    tag: Column | None  # kind name, NULL when the value is NULL (None when kinds is one kind, not nullable)
    l: Column | None = None
    d: Column | None = None
    s: Column | None = None
    b: Column | None = None
    f32: Column | None = None  # TRUE when a double is an AMQP float (Java Float: `'x' + f` writes it so)
    level: int = 0  # projection layer that holds the materialized components (0: literal, no layer)

    def is_(self, kinds: frozenset | set) -> Any:
        possible = self.kinds & frozenset(kinds)
        if not possible:
            return False
        if possible == self.kinds:
            return True if not self.nullable else self.tag.isNotNull()
        return self.tag.isin(*sorted(CODE[k] for k in possible))

    def kind_possible(self, kind: str) -> bool:
        return kind in self.kinds

    def is_null(self) -> Any:
        return self.tag.isNull() if self.nullable else False

    def as_double(self) -> Column:
        """The numeric value as a double (for a value known to be numeric)."""
        return _case([(self.is_(INTEGER), self.l.cast("double") if self.l is not None else None)], self.d)


def _null_val() -> Val:
    return Val(frozenset(), True, F.lit(None).cast("int"))


def _static(kind: str, **cols: Column) -> Val:
    return Val(frozenset({kind}), False, _tag(kind), **cols)


def _nullable(kind: str, value: Column, field: str) -> Val:
    return Val(frozenset({kind}), True, F.when(value.isNotNull(), _tag(kind)), **{field: value})


def _tag(kind: str) -> Column:
    return F.lit(CODE[kind])


def typed_val(v: Column) -> Val:
    """The JMS value of an archive TYPED struct column (NULL struct or type 'null' is NULL)."""
    t = v.getField("type")
    tag = F.when(t.isNull() | (t == "null"), F.lit(None).cast("int"))
    for kind in ("int", "long", "double", "string", "boolean"):
        names = sorted(n for n, k in _AMQP_KIND.items() if k == kind)
        tag = tag.when(t.isin(*names), _tag(kind))
    tag = tag.otherwise(_tag("opaque"))
    return Val(
        KINDS,
        True,
        tag,
        l=v.getField("long"),
        d=v.getField("double"),
        s=v.getField("string"),
        b=v.getField("boolean"),
        f32=t == "float",
    )


# ----------------------------------------------------------------------------- headers (view.HEADERS)
def _props(name: str) -> Column:
    return F.col("properties").getField(name)


def _header(name: str) -> Column:
    return F.col("header").getField(name)


def _jms_type() -> Val:
    ma = F.col("message_annotations")
    annotated = F.when(
        F.map_contains_key(ma, F.lit("x-opt-jms-type")), F.try_element_at(ma, F.lit("x-opt-jms-type"))
    ).otherwise(F.try_element_at(ma, F.lit("jms-type")))
    from_annotation = F.when(
        annotated.getField("type").isin("string", "symbol", "char"), annotated.getField("string")
    )
    return _nullable("string", F.coalesce(_props("subject"), from_annotation), "s")


def _message_id(field: str) -> Val:
    v = _props(field)
    t = v.getField("type")
    text = (
        F.when(t.isin("string", "symbol", "char"), v.getField("string"))
        .when(t == "uuid", F.concat(F.lit("ID:AMQP_UUID:"), v.getField("string")))
        .when(
            t.isin("ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp"),
            F.concat(F.lit("ID:AMQP_ULONG:"), F.coalesce(v.getField("string"), v.getField("long").cast("string"))),
        )
        .when(t == "binary", F.concat(F.lit("ID:AMQP_BINARY:"), F.hex(v.getField("binary"))))
    )
    return _nullable("string", text, "s")


def _durable() -> Column:
    return F.coalesce(_header("durable"), F.lit(False))


def _user_id() -> Val:
    text = _props("user_id").cast("string")
    return _nullable("string", F.when(F.is_valid_utf8(text), text), "s")


def _header_val(name: str) -> Val:
    if name == "JMSType":
        return _jms_type()
    if name in ("JMSMessageID", "AMQUserID"):
        return _message_id("message_id")
    if name == "JMSCorrelationID":
        return _message_id("correlation_id")
    if name == "JMSDeliveryMode":
        return _static("string", s=F.when(_durable(), F.lit("PERSISTENT")).otherwise(F.lit("NON_PERSISTENT")))
    if name == "AMQDurable":
        return _static("string", s=F.when(_durable(), F.lit("DURABLE")).otherwise(F.lit("NON_DURABLE")))
    if name in ("JMSPriority", "AMQPriority"):
        return _static("long", l=F.coalesce(_header("priority").cast("long"), F.lit(4).cast("long")))
    if name in ("JMSTimestamp", "AMQTimestamp"):
        return _nullable("long", _props("creation_time"), "l")
    if name in ("JMSExpiration", "AMQExpiration"):
        return _static("long", l=F.coalesce(_props("absolute_expiry_time"), F.lit(0).cast("long")))
    if name == "JMSRedelivered":
        return _static("boolean", b=F.coalesce(_header("delivery_count"), F.lit(0).cast("long")) != 0)
    if name == "JMSReplyTo":
        return _nullable("string", _props("reply_to"), "s")
    if name in ("JMSDestination", "AMQAddress"):
        return _nullable("string", _props("to"), "s")
    if name in ("JMSXGroupID", "AMQGroupID"):
        return _nullable("string", _props("group_id"), "s")
    if name == "JMSXUserID":
        return _user_id()
    if name == "JMSXGroupSeq":
        return _nullable("long", _props("group_sequence"), "l")
    if name == "JMSXDeliveryCount":
        return _static("long", l=F.coalesce(_header("delivery_count"), F.lit(0).cast("long")) + F.lit(1))
    if name == "AMQSize":
        return _nullable("long", F.col("encoded_size"), "l")
    if name == "TAGS":
        return _nullable("string", _props("subject"), "s")
    raise UnsupportedError(f"unknown header identifier {name!r}")


# ----------------------------------------------------------------------------- the compiler
class _Compiler:
    def __init__(self, selector: ast.Selector, context: dict | None = None):
        self.context = {} if context is None else context  # SQL text -> (hidden column, layer)
        self.dialect = selector.dialect
        self.convert = selector.convert_strings
        self.failures: list[Any] = []  # rocketmq: conditions under which evaluation fails
        self.defs: list[tuple[int, str, Column]] = []
        self.top = 0

    def define(self, level: int, expr: Column) -> tuple[Column, int]:
        """Materialize `expr` as a hidden column in projection layer `level` (once per distinct
        expression); a reference to it and its actual layer."""
        if expr.cheap:
            return expr, 0
        known = self.context.get(expr.sql)
        if known is None:
            known = self.context[expr.sql] = (f"__bf{next(hidden_names)}", level)
            self.defs.append((level, known[0], expr))
        self.top = max(self.top, known[1])
        return F.col(known[0]), known[1]

    def keep(self, v: Val, level: int) -> Val:
        """`v` with its components materialized at `level`, so parents reference, not copy, them."""
        return keep_fields(self.define, level, v, Val(v.kinds, v.nullable, v.tag, level=0), ("tag", "l", "d", "s", "b", "f32"))

    def fail_when(self, cond: Any) -> None:
        cond = _safe(cond)
        if cond is not False:
            self.failures.append(cond)

    # ------------------------------------------------------------------ conditions
    def cond(self, node: Any) -> Any:
        if isinstance(node, ast.Unary) and node.op == "NOT":
            return _not(self.cond(node.operand))
        if isinstance(node, ast.Binary) and node.op in ast.LOGICAL_OPS:
            left, right = self.cond(node.left), self.cond(node.right)
            if node.op == "AND":
                return _col(left) & _col(right) if not (left is False or right is False) else False
            return _col(left) | _col(right) if not (left is True or right is True) else True
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISON_OPS:
            return self.compare(node.op, self.value(node.left), self.value(node.right))
        if isinstance(node, ast.Between):
            return self.between(node)
        if isinstance(node, ast.In):
            return self.member(node)
        if isinstance(node, ast.Like):
            return self.like(node)
        if isinstance(node, ast.IsNull):
            n = self.value(node.operand).is_null()
            return _not(n) if node.negated else n
        if isinstance(node, ast.StringTest):
            return self.string_test(node)
        if isinstance(node, ast.Tags):
            if node.tags is None:
                return True
            return _safe(_props("subject").isin(*node.tags))
        v = self.value(node)
        return _case([(v.is_null(), None), (v.is_({"boolean"}), v.b)], False)

    def compare(self, op: str, left: Val, right: Val) -> Any:
        if self.dialect == "artemis":
            if self.convert:
                left, right = self.converted(left, right), self.converted(right, left)
            if op in ("=", "<>"):
                # a NULL left operand alone is UNKNOWN, a NULL right operand alone FALSE, both TRUE
                equal = _case(
                    [
                        (_and(left.is_null(), right.is_null()), True),
                        (left.is_null(), None),
                        (right.is_null(), False),
                    ],
                    self.equal_non_null(left, right),
                )
                return equal if op == "=" else ~equal
            return _case(
                [(_or(left.is_null(), right.is_null()), None), (_and(left.is_(NUMERIC), right.is_(NUMERIC)), _numeric(op, left, right))],
                False,
            )
        if self.dialect == "rocketmq":
            if op not in ("=", "<>"):
                left, right = self.strings_as_doubles(left, right)
            equality = op in ("=", "<>")  # only there can a string on the left become a boolean
            l2, r2 = self.coerced(left, right, equality), self.coerced(right, left, False)
            both_num = _and(l2.is_(NUMERIC), r2.is_(NUMERIC))
            same = _or(
                _and(l2.is_({"string"}), r2.is_({"string"})), _and(l2.is_({"boolean"}), r2.is_({"boolean"}))
            )
            nonnull = _and(_not(left.is_null()), _not(right.is_null()))
            if op in ("=", "<>"):
                self.fail_when(_and(nonnull, _not(both_num), _not(same)))
            else:
                self.fail_when(_and(nonnull, _not(both_num)))
            return _case(
                [(_or(left.is_null(), right.is_null()), None), (both_num, _numeric(op, l2, r2))],
                self.same_kind_compare(op, l2, r2),
            )
        return _case(
            [
                (_or(left.is_null(), right.is_null()), None),
                (_and(left.is_(NUMERIC), right.is_(NUMERIC)), _numeric(op, left, right)),
            ],
            self.same_kind_compare(op, left, right),
        )

    def same_kind_compare(self, op: str, left: Val, right: Val) -> Column:
        """Strings and booleans: = and <> compare, ordering is FALSE; other kinds FALSE."""
        if op not in ("=", "<>"):
            return F.lit(False)
        branches = []
        for kind, field in (("string", "s"), ("boolean", "b")):
            both = _and(left.is_({kind}), right.is_({kind}))
            if both is not False:
                a, b = getattr(left, field), getattr(right, field)
                branches.append((both, (a == b) if op == "=" else (a != b)))
        return _case(branches, False)

    def equal_non_null(self, left: Val, right: Val) -> Column:
        return _case(
            [(_and(left.is_(NUMERIC), right.is_(NUMERIC)), _numeric("=", left, right))],
            self.same_kind_compare("=", left, right),
        )

    def converted(self, v: Val, other: Val) -> Val:
        """Artemis convert_string_expressions: a string read as the other side's kind when it parses."""
        if not v.kind_possible("string"):
            return v
        s = v.s
        is_str = v.is_({"string"})
        as_int = _and(is_str, other.is_(NUMERIC), _int_text_ok(s))
        as_dbl = _and(is_str, other.is_(NUMERIC), _not(_int_text_ok(s)), _double_text_ok(s))
        as_bool = _and(is_str, other.is_({"boolean"}), F.lower(s).isin("true", "false"))
        out = Val(
            v.kinds | {"long", "double", "boolean"},
            v.nullable,
            _case([(as_int, _tag("long")), (as_dbl, _tag("double")), (as_bool, _tag("boolean"))], v.tag),
            l=_case([(as_int, s.cast("long"))], v.l),
            d=_case([(as_dbl, _double_of_text(s))], v.d),
            s=s,
            b=_case([(as_bool, F.lower(s) == "true")], v.b),
        )
        return self.keep(out, max(v.level, other.level) + 1)

    def coerced(self, v: Val, other: Val, to_boolean: bool) -> Val:
        """RocketMQ: a string compared with a number is read as that number's type, or fails; with
        `to_boolean` (a string left of `=` / `<>`), a string against a boolean is Boolean.valueOf."""
        to_bool = _and(v.is_({"string"}), other.is_({"boolean"})) if to_boolean else False
        if not v.kind_possible("string") or not (other.kinds & NUMERIC or to_bool is not False):
            return v
        s = v.s
        is_str = v.is_({"string"})
        to_long = _and(is_str, other.is_(INTEGER))
        to_double = _and(is_str, other.is_({"double"}))
        self.fail_when(_and(to_long, _not(_int_text_ok(s))))
        self.fail_when(_and(to_double, _not(_double_text_ok(s))))
        out = Val(
            v.kinds | {"long", "double", "boolean"},
            v.nullable,
            _case([(to_long, _tag("long")), (to_double, _tag("double")), (to_bool, _tag("boolean"))], v.tag),
            l=_case([(to_long, s.cast("long"))], v.l),
            d=_case([(to_double, _double_of_text(s))], v.d),
            s=s,
            b=_case([(to_bool, F.lower(s) == "true")], v.b),
        )
        return self.keep(out, max(v.level, other.level) + 1)

    def strings_as_doubles(self, left: Val, right: Val) -> tuple[Val, Val]:
        """RocketMQ `< <= > >=` on two strings: both read as doubles (Double.valueOf), or fail."""
        both = _and(left.is_({"string"}), right.is_({"string"}))
        if both is False:
            return left, right
        level = max(left.level, right.level) + 1
        if not isinstance(both, bool):
            both, level = self.define(level, both)
        out = []
        for v in (left, right):
            number, _ = self.define(level, F.when(_col(both) & _double_text_ok(v.s), _double_of_text(v.s)))
            self.fail_when(_and(both, number.isNull()))  # the text does not read as a double
            tag = _case([(both, _tag("double"))], v.tag)
            out.append(self.keep(Val(v.kinds | {"double"}, v.nullable, tag, l=v.l, d=F.coalesce(number, v.d), s=v.s, b=v.b), level + 1))
        return out[0], out[1]

    def between(self, node: ast.Between) -> Any:
        v, low, high = self.value(node.operand), self.value(node.low), self.value(node.high)
        inside = _col(self.compare(">=", v, low)) & _col(self.compare("<=", v, high))
        if not node.negated:
            return inside
        if self.dialect == "jms":
            return _case([(_or(_mismatched(v, low), _mismatched(v, high)), False)], ~inside)
        return ~inside

    def member(self, node: ast.In) -> Any:
        v = self.value(node.operand)
        if self.dialect == "rocketmq":
            found: Any = False
            if any(literal.type == "string" for literal in node.values):
                self.fail_when(_and(_not(v.is_null()), _not(v.is_({"string"}))))
            for literal in node.values:
                found = _col(found) | _col(self.compare("=", v, self.value(literal)))
            return _not(found) if node.negated else found
        strings = [lit.value for lit in node.values if lit.type == "string"]
        found = v.s.isin(*strings) if (strings and v.s is not None) else F.lit(False)
        mismatch = node.negated if self.dialect == "artemis" else False
        return _case([(v.is_null(), None), (v.is_({"string"}), ~found if node.negated else found)], mismatch)

    def like(self, node: ast.Like) -> Any:
        v = self.value(node.operand)
        mismatch = node.negated if self.dialect == "artemis" else False
        if self.dialect == "rocketmq":
            self.fail_when(_and(_not(v.is_null()), _not(v.is_({"string"}))))
        if v.s is None:
            return _case([(v.is_null(), None)], mismatch)
        found = v.s.rlike(like_regex(node.pattern, node.escape))
        return _case([(v.is_null(), None), (v.is_({"string"}), ~found if node.negated else found)], mismatch)

    def string_test(self, node: ast.StringTest) -> Any:
        """RocketMQ: an empty search string, a NULL and a non-string value are all FALSE."""
        v = self.value(node.operand)
        if v.s is None or not node.value:
            return False
        text = F.lit(node.value)
        if node.op == "CONTAINS":
            found = v.s.contains(text)
        elif node.op == "STARTSWITH":
            found = v.s.startswith(text)
        else:
            found = v.s.endswith(text)
        return _case([(v.is_({"string"}), ~found if node.negated else found)], False)

    # ------------------------------------------------------------------ values
    def value(self, node: Any) -> Val:
        if isinstance(node, ast.Literal):
            if node.type == "string":
                return _static("string", s=F.lit(node.value))
            if node.type == "boolean":
                return _static("boolean", b=F.lit(bool(node.value)))
            if node.type in INTEGER:
                # A folded `-(-9223372036854775808)` is 2**63: Java wraps it to Long.MIN_VALUE.
                n = (int(node.value) + 2**63) % 2**64 - 2**63
                return _static(node.type, l=F.lit(n).cast("long"))
            return _static("double", d=F.lit(float(node.value)).cast("double"))
        if isinstance(node, ast.Ident):
            if node.kind == "header":
                return self.header(node.key)
            section = "message_annotations" if node.kind == "annotation" else "application_properties"
            struct, _ = self.define(1, F.try_element_at(F.col(section), F.lit(node.key)))
            v = typed_val(struct)
            v.tag, v.level = self.define(2, v.tag)
            return v
        if isinstance(node, ast.Unary) and node.op in ("+", "-"):
            v = self.number(self.value(node.operand))
            return v if node.op == "+" else self.keep(_negate(v), v.level + 1)
        if isinstance(node, ast.Binary) and node.op in ast.ARITHMETIC_OPS:
            return self.arithmetic(node.op, self.value(node.left), self.value(node.right))
        truth = _col(self.cond(node))
        v = Val(frozenset({"boolean"}), True, F.when(truth.isNotNull(), _tag("boolean")), b=truth)
        return self.keep(v, self.top + 1)

    def header(self, name: str) -> Val:
        """A header's value (one component, one static kind) materialized once; its tag reads it."""
        v = _header_val(name)
        (kind,) = v.kinds
        field = next(f for f in ("l", "d", "s", "b") if getattr(v, f) is not None)
        ref, level = self.define(1, getattr(v, field))
        out = Val(v.kinds, v.nullable, _tag(kind), level=level)
        setattr(out, field, ref)
        if v.nullable:
            out.tag, tag_level = self.define(level + 1, F.when(ref.isNotNull(), _tag(kind)))
            out.level = max(level, tag_level)
        return out

    def number(self, v: Val) -> Val:
        """An arithmetic operand: the number, or NULL for anything else (a failure in rocketmq)."""
        if self.convert and v.kind_possible("string"):
            s = v.s
            is_str = v.is_({"string"})
            as_int = _and(is_str, _int_text_ok(s))
            as_dbl = _and(is_str, _not(_int_text_ok(s)), _double_text_ok(s))
            v = Val(
                v.kinds | {"long", "double"},
                v.nullable,
                _case([(as_int, _tag("long")), (as_dbl, _tag("double"))], v.tag),
                l=_case([(as_int, s.cast("long"))], v.l),
                d=_case([(as_dbl, _double_of_text(s))], v.d),
                s=s,
                b=v.b,
                level=v.level,
            )
            v = self.keep(v, v.level + 1)
        if not (v.kinds - NUMERIC):
            return v
        if self.dialect == "rocketmq":
            self.fail_when(_and(_not(v.is_null()), _not(v.is_(NUMERIC))))
        kinds = v.kinds & NUMERIC
        if not kinds:
            return _null_val()
        return self.keep(
            Val(kinds, True, _case([(v.is_(NUMERIC), v.tag)], None), l=v.l, d=v.d, f32=v.f32, level=v.level),
            v.level + 1,
        )

    def plus_string(self, left: Val, right: Val) -> Val:
        """`+` whose left operand may be a string: concatenation when it is one (a NULL or typeless
        right operand gives NULL), numeric addition otherwise."""
        added = self.arithmetic("+", _without_strings(left), right)
        text = _java_text(right)
        is_str = left.is_({"string"})
        out = Val(
            added.kinds | {"string"},
            True,
            _case([(is_str, F.when(text.isNotNull(), _tag("string"))), (left.is_null(), None)], added.tag),
            l=added.l,
            d=added.d,
            s=F.concat(left.s, text),
        )
        return self.keep(out, max(left.level, right.level, added.level) + 1)

    def arithmetic(self, op: str, left: Val, right: Val) -> Val:
        if op == "+" and left.kind_possible("string"):
            return self.plus_string(left, right)
        left, right = self.number(left), self.number(right)
        if not left.kinds or not right.kinds:
            return _null_val()
        nullable = left.nullable or right.nullable
        null = _or(left.is_null(), right.is_null())
        if op == "/":
            d = _float_divide(left.as_double(), right.as_double())
            level = max(left.level, right.level) + 1
            return self.keep(Val(frozenset({"double"}), nullable, _case([(null, None)], _tag("double")), d=d), level)
        any_double = _or(left.is_({"double"}), right.is_({"double"}))
        any_long = _or(left.is_({"long"}), right.is_({"long"}))
        kinds = set()
        if any_double is not False:
            kinds.add("double")
        if any_double is not True:
            if any_long is not False:
                kinds.add("long")
            if any_long is not True:
                kinds.add("int")
        d = None
        if "double" in kinds:
            a, b = left.as_double(), right.as_double()
            d = {"+": a + b, "-": a - b, "*": a * b}[op]
        lcol = None
        if kinds & INTEGER:
            a, b = _long_or_null(left.l), _long_or_null(right.l)
            if op == "+":
                raw = a + b
            elif op == "-":
                raw = a - b
            else:
                raw = a * b
            lcol = _case([(any_long, raw)], _wrap32(raw))
        tag = _case([(null, None), (any_double, _tag("double")), (any_long, _tag("long"))], _tag("int"))
        return self.keep(Val(frozenset(kinds), nullable, tag, l=lcol, d=d), max(left.level, right.level) + 1)


def _without_strings(v: Val) -> Val:
    """`v` with its string kind taken away (a string there is handled by the caller)."""
    if "string" not in v.kinds:
        return v
    tag = _case([(v.is_({"string"}), None)], v.tag)
    return Val(v.kinds - {"string"}, True, tag, l=v.l, d=v.d, b=v.b, f32=v.f32, level=v.level)


def _java_text(v: Val) -> Column:
    """Java's String.valueOf of a value (NULL for NULL and for values with no JMS type)."""
    branches: list[tuple[Any, Any]] = []
    if "string" in v.kinds:
        branches.append((v.is_({"string"}), v.s))
    if "boolean" in v.kinds:
        branches.append((v.is_({"boolean"}), F.when(v.b, F.lit("true")).otherwise(F.lit("false"))))
    if v.kinds & INTEGER:
        branches.append((v.is_(INTEGER), v.l.cast("string")))
    if "double" in v.kinds:
        single = _safe(v.f32) if v.f32 is not None else False
        branches.append((v.is_({"double"}), _case([(single, _java_decimal(v.d, True))], _java_decimal(v.d, False))))
    return _case(branches, F.lit(None).cast("string"))


def _java_decimal(d: Column, single: bool) -> Column:
    """Double.toString (Float.toString when `single`) with the shortest digits that read back, as
    the core writes it (Spark's own cast follows the running JVM, which before Java 19 sometimes
    writes more digits): the first `%.Ne` that round-trips, laid out as Java does."""
    kind = "float" if single else "double"
    target = d.cast(kind)
    candidates = [F.call_function("format_string", F.lit(f"%.{n}e"), d) for n in range(9 if single else 17)]
    sci = _case([(c.cast(kind) == target, c) for c in candidates], candidates[-1])
    digits = F.regexp_replace(F.regexp_replace(F.call_function("split_part", sci, F.lit("e"), F.lit(1)), r"[-.]", ""), "0+$", "")
    digits = F.when(digits == F.lit(""), F.lit("0")).otherwise(digits)
    exponent = F.call_function("split_part", sci, F.lit("e"), F.lit(2)).cast("int")
    sign = F.when(d < F.lit(0.0), F.lit("-")).otherwise(F.lit(""))
    magnitude = F.call_function("abs", d)
    small = F.concat(sign, F.lit("0."), F.call_function("repeat", F.lit("0"), -exponent - F.lit(1)), digits)
    whole = F.call_function("rpad", F.call_function("substr", digits, F.lit(1), exponent + F.lit(1)), exponent + F.lit(1), F.lit("0"))
    rest = F.call_function("substr", digits, exponent + F.lit(2))
    plain = F.concat(sign, whole, F.lit("."), F.when(rest == F.lit(""), F.lit("0")).otherwise(rest))
    head = F.call_function("substr", digits, F.lit(1), F.lit(1))
    tail = F.call_function("substr", digits, F.lit(2))
    scientific = F.concat(sign, head, F.lit("."), F.when(tail == F.lit(""), F.lit("0")).otherwise(tail), F.lit("E"), exponent.cast("string"))
    special = F.isnan(d) | (magnitude == F.lit(float("inf"))) | (d == F.lit(0.0))
    return (
        F.when(special, d.cast(kind).cast("string"))
        .when((magnitude >= F.lit(1e-3)) & (magnitude < F.lit(1e7)) & (exponent < F.lit(0)), small)
        .when((magnitude >= F.lit(1e-3)) & (magnitude < F.lit(1e7)), plain)
        .otherwise(scientific)
    )


def _int_text_ok(s: Column) -> Column:
    return s.rlike(_INTEGER_TEXT) & s.cast("long").isNotNull()


def _trimmed(s: Column) -> Column:
    return F.regexp_replace(s, _JAVA_TRIM, "")


def _double_text_ok(s: Column) -> Column:
    return _trimmed(s).rlike(_DOUBLE_TEXT)


def _double_of_text(s: Column) -> Column:
    """The double of text `_double_text_ok` accepts (the suffix dropped, as the core reads it)."""
    return F.regexp_replace(_trimmed(s), r"[fFdD]\z", "").cast("double")


def _mismatched(a: Val, b: Val) -> Any:
    alike = _or(
        _and(a.is_(NUMERIC), b.is_(NUMERIC)),
        _and(a.is_({"string"}), b.is_({"string"})),
        _and(a.is_({"boolean"}), b.is_({"boolean"})),
    )
    return _and(_not(a.is_null()), _not(b.is_null()), _not(alike))


def _long_or_null(c: Column | None) -> Column:
    return F.lit(None).cast("long") if c is None else c


def _wrap32(x: Column) -> Column:
    return x.cast("int").cast("long")


def _negate(v: Val) -> Val:
    if not v.kinds:
        return v
    lcol = None
    if v.kinds & INTEGER:
        lcol = _case([(v.is_({"long"}), -v.l)], _wrap32(-v.l))
    d = -v.d if "double" in v.kinds else None
    return Val(v.kinds, v.nullable, v.tag, l=lcol, d=d)


def _float_divide(a: Column, b: Column) -> Column:
    # x / 0.0 is x * (1 / 0.0); pow(+-0.0, -1) is +-Infinity (Spark's `/` answers NULL).
    return F.when(b == 0.0, a * F.pow(b, F.lit(-1.0))).otherwise(a / b)


def _direct(op: str, a: Column, b: Column) -> Column:
    return {"=": a == b, "<>": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _numeric(op: str, left: Val, right: Val) -> Column:
    """Comparison of two non-NULL numbers as Java does: two integers as longs, otherwise both widened
    to double, where NaN equals NaN and is above every other number and -0.0 equals 0.0
    (`Double.compareTo` without the zero sign), which is Spark's own double ordering."""
    both_int = _and(left.is_(INTEGER), right.is_(INTEGER))
    branches: list[tuple[Any, Any]] = []
    if both_int is not False:
        branches.append((both_int, _direct(op, left.l, right.l)))
    return _case(branches, _direct(op, left.as_double(), right.as_double()))


# ----------------------------------------------------------------------------- public API
class CompiledSelector:
    """A selector compiled for Spark: hidden helper columns in layers, then one boolean result column.

    Intermediate values are materialized as hidden columns (one projection per nesting level), so
    the plan grows linearly with the selector, not exponentially: Spark does not inline a non-trivial
    column that is read more than once.  `apply` adds the result to a DataFrame of archive rows.
    """

    def __init__(self, defs: list[tuple[int, str, Column]], result: Column, selector: ast.Selector | None = None):
        self.defs = defs
        self.result = result
        self.selector = selector

    def apply(self, frame: Any, name: str = "matched") -> Any:
        """`frame` plus the boolean column `name` (TRUE / FALSE / NULL for UNKNOWN)."""
        return apply_all(frame, {name: self})

    def where(self, frame: Any) -> Any:
        """The rows of `frame` the selector selects (TRUE only).

        Spark pushes this filter into the scan, inlining the helper columns into one condition: right,
        but slower for large selectors than counting the `apply` column with count_if (as backtest does).
        """
        return self.apply(frame, "__bf_match").where("`__bf_match`").drop("__bf_match")


def apply_all(frame: Any, compiled: dict[str, "CompiledSelector"]) -> Any:
    """`frame` plus one result column per name, all evaluated in the same projections."""
    layers: dict[int, dict[str, str]] = {}
    for c in compiled.values():
        for level, name, expr in c.defs:
            layers.setdefault(level, {})[name] = f"{expr.sql} AS `{name}`"
    columns = [f"`{c}`" for c in frame.columns]
    for level in sorted(layers):
        frame = frame.selectExpr("*", *layers[level].values())
    return frame.selectExpr(*columns, *[f"{c.result.sql} AS `{name}`" for name, c in compiled.items()])


def compile_selector(selector: ast.Selector, context: dict | None = None) -> CompiledSelector:
    """A selector AST compiled to Spark: TRUE, FALSE or NULL (UNKNOWN), exactly as the core evaluates.

    Selectors compiled with one shared `context` dict share their common helper columns (apply them
    together with `apply_all`)."""
    if selector.expr is None:
        return CompiledSelector([], F.lit(True), selector)
    if selector.dialect == "amqp-sql":
        from .amqpsql import compile_sql

        defs, result = compile_sql(selector, context)
        return CompiledSelector(defs, result, selector)
    compiler = _Compiler(selector, context)
    result = _col(compiler.cond(selector.expr))
    failed = _or(*compiler.failures)
    if failed is True:
        result = F.lit(ROCKETMQ_FAILURE)
    elif failed is not False:
        result = F.when(failed, F.lit(ROCKETMQ_FAILURE)).otherwise(result)
    return CompiledSelector(compiler.defs, result, selector)


def compile_text(text: str, dialect: str = "jms") -> CompiledSelector:
    """Parse (with the core's parser, same errors) and compile selector text."""
    from ..filters import parse_selector

    return compile_selector(parse_selector(text, dialect))


# ----------------------------------------------------------------------------- filter-sets
def compile_filter_set(filter_set: Any, dialect: str = "jms", context: dict | None = None) -> CompiledSelector:
    """A compiled `FilterSet` (broker_filter.filters.compile_filter_set) as one Spark condition: the
    Kleene AND of its applied entries, each entry's filter tree walked as the core compiled it.
    Selector, SQL, property, direct, topic and headers filters and the and / or / not combinators
    compile to expressions; no-local is TRUE offline (an archive has no receiving connection, and the
    core answers TRUE without a receiver too).  `dialect` is the one the filter-set was compiled in
    (the trees carry their parsed selectors)."""
    visitor = _SparkFilters({} if context is None else context)
    result: Any = True
    for cond in filter_set.walk(visitor):
        result = _and(result, cond)
    return CompiledSelector(visitor.defs, _col(result))


class _SparkFilters(FilterVisitor):
    """Filter nodes -> Spark conditions (Columns, or Python booleans where the answer is fixed)."""

    def __init__(self, context: dict):
        self.context = context
        self.defs: list[tuple[int, str, Column]] = []

    def _selector(self, node: FilterNode) -> Column:
        compiled = compile_selector(node.filter.ast, self.context)
        self.defs.extend(compiled.defs)
        return compiled.result

    visit_selector = visit_sql = _selector

    def visit_properties(self, node: FilterNode) -> Any:
        from .amqpsql import property_filter_condition

        return property_filter_condition(node.filter.ast)

    visit_application_properties = visit_properties

    def visit_no_local(self, node: FilterNode) -> Any:
        return True

    def visit_direct(self, node: FilterNode) -> Any:
        return _safe(_props("subject") == F.lit(str(node.value)))

    def visit_topic(self, node: FilterNode) -> Any:
        return topic_condition(str(node.value))

    def visit_headers(self, node: FilterNode) -> Any:
        return headers_condition(node.value)

    def visit_and(self, node: FilterNode, conds: list) -> Column:
        return functools.reduce(operator.and_, map(_col, conds))

    def visit_or(self, node: FilterNode, conds: list) -> Column:
        return functools.reduce(operator.or_, map(_col, conds))

    def visit_not(self, node: FilterNode, conds: list) -> Column:
        return ~_col(conds[0])

    def unsupported(self, node: FilterNode) -> Any:
        raise UnsupportedError(f"filter kind {node.kind!r} has no Spark form")


def topic_regex(key: str) -> str:
    """Java regex over "." + subject (every word then reads `.word`) equal to the RabbitMQ topic key."""
    parts = []
    for word in ([] if key == "" else key.split(".")):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + "".join(regex_literal(c) for c in word))
    return r"(?s)\A" + "".join(parts) + r"\z"


def topic_condition(key: str) -> Any:
    """TRUE / FALSE: the subject matches the topic binding key (no subject: only `#` matches).  The
    regular expression is made from the key's canonical form (runs of `#` collapsed,
    `filters.wildcards.canonical`): it then has no repeated nested quantifiers for Java's engine to
    backtrack over."""
    words = [] if key == "" else key.split(".")
    if words == ["#"]:
        return True
    subject = _props("subject")
    if "#" not in words and "*" not in words:
        return _safe(subject == F.lit(key))
    empty_matches = all(w == "#" for w in words)  # "" is zero words
    return _safe(
        F.when(subject == F.lit(""), F.lit(empty_matches)).otherwise(
            F.concat(F.lit("."), subject).rlike(topic_regex(canonical(key)))
        )
    )


def headers_condition(binding: dict) -> Any:
    """TRUE / FALSE: the legacy headers binding (x-match all / any / all-with-x / any-with-x, the key
    in any case); values compare within their class as `bindings.headers_equal` does."""
    from ..archive.parquet import typed_value
    from ..filters.bindings import FLOAT_TYPES, INTEGER_TYPES, TEXT_TYPES, X_MATCH, equality_class

    modes = [str(v) for k, v in binding.items() if str(k).lower() == X_MATCH]
    mode = modes[-1] if modes else "all"
    pairs = [(str(k), v) for k, v in binding.items() if str(k).lower() != X_MATCH]
    if not mode.endswith("-with-x"):
        pairs = [(k, v) for k, v in pairs if not k.startswith("x-")]
    ap = F.col("application_properties")
    conds = []
    for k, v in pairs:
        present = F.coalesce(F.map_contains_key(ap, F.lit(k)), F.lit(False))
        if v is None:
            conds.append(present)
            continue
        want = typed_value(v)
        got = F.try_element_at(ap, F.lit(k))
        got_type = got.getField("type")
        kind = equality_class(want["type"])
        if kind == "integer":  # by value: a ulong is compared by its decimal text, never its bits
            got_text = F.when(got_type == F.lit("ulong"), got.getField("string")).otherwise(got.getField("long").cast("string"))
            same = got_type.isin(*sorted(INTEGER_TYPES)) & (got_text == F.lit(str(int(v))))
        elif kind == "float":  # by value; NaN equals nothing
            nan = want["double"] != want["double"]
            same = F.lit(False) if nan else got_type.isin(*sorted(FLOAT_TYPES)) & (got.getField("double") == F.lit(want["double"]))
        elif kind == "text":
            same = got_type.isin(*sorted(TEXT_TYPES)) & (got.getField("string") == F.lit(want["string"]))
        else:
            same = got_type == F.lit(want["type"])
            decimal = want["type"].startswith("decimal")
            for field in ("string", "long", "double", "boolean", "binary"):
                if want.get(field) is None or (decimal and field == "string"):
                    continue  # decimals compare by value (1.0 = 1.00), not by text
                if field == "binary":
                    same = same & (F.hex(got.getField("binary")) == F.lit(want["binary"].hex().upper()))
                else:
                    same = same & (got.getField(field) == F.lit(want[field]))
        conds.append(present & F.coalesce(same, F.lit(False)))
    if mode.startswith("all"):
        return _and(*conds) if conds else True
    return _or(*conds) if conds else False
