"""The amqp-sql dialect and the OASIS property filters -> native Spark SQL Columns (no Python UDF).

Theory of operation: an amqp-sql value compiles to an `SqlVal` of SQL expressions over one archive
row: a kind code `k` (NULL for NULL; 1 boolean, 2 integer, 3 double, 4 byte string, 5 anything else),
and one component per kind (`b` boolean, `i` DECIMAL(38,0) for integers of any AMQP width, `d`
double, `x` binary: strings and symbols as their UTF-8 bytes, binaries and uuids as their bytes).
The rules are the core's (broker_filter.filters.runtime, "amqp-sql"): Erlang term equality (`=` of
unlike kinds FALSE, `<>` TRUE), `< <= > >=` on two numbers or two byte strings (Spark orders binary
unsigned, as UTF-8 byte order) else FALSE, arithmetic on numbers only with `/` a double and `%` on
integers, division by zero and non-finite results NULL (UNKNOWN), a NaN or infinite double is of
kind 5.  A condition is a boolean Column whose NULL is UNKNOWN.  Every value's components are
materialized as hidden columns, one projection layer per nesting level (as the JMS compiler does), so
the plan grows linearly with the expression: each component is read several times by its parent.

The property filters (filters/filtex.py) compile to TRUE / FALSE Columns with the same rules: NULL
reference = present, `&p:` / `&s:` on strings and symbols, numbers equal as numbers, otherwise equal
within the same AMQP class.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..filters import ast
from ..filters.runtime import sql_like_pattern
from .layers import hidden_names, keep_fields, like_regex
from .sqlexpr import E as Column
from .sqlexpr import call
from .sqlexpr import functions as F

BOOL, INT, DOUBLE, BYTES, OTHER = 1, 2, 3, 4, 5
_DEC = "DECIMAL(38,0)"
_INTEGER_TYPES = ("ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp")
_TEXT_TYPES = ("string", "symbol", "char")


def _raw(sql: str) -> Column:
    return Column(sql)


def _dec(c: Any) -> Column:
    return _raw(f"CAST({F.lit(c).sql if not isinstance(c, Column) else c.sql} AS {_DEC})")


def _bin_lit(b: bytes) -> Column:
    return _raw(f"X'{b.hex()}'")


@dataclass
class SqlVal:
    k: Column  # kind code, NULL for NULL
    b: Any = None
    i: Any = None
    d: Any = None
    x: Any = None
    level: int = 0  # projection layer holding the components (0: literals, no layer)

    def is_(self, *kinds: int) -> Column:
        return self.k.isin(*kinds) if len(kinds) > 1 else self.k == F.lit(kinds[0])

    def as_double(self) -> Column:
        i = self.i.cast("double") if self.i is not None else F.lit(None)
        d = self.d if self.d is not None else F.lit(None).cast("double")
        return F.when(self.is_(INT), i).otherwise(d)


def _null() -> SqlVal:
    return SqlVal(F.lit(None).cast("int"))


def typed_sql_val(v: Column) -> SqlVal:
    """The amqp-sql value of an archive TYPED struct column."""
    t = v.getField("type")
    dbl = v.getField("double")
    finite = ~F.isnan(dbl) & (call("abs", dbl) < F.lit(math.inf))
    k = (
        F.when(t.isNull() | (t == "null"), F.lit(None).cast("int"))
        .when(t == "boolean", F.lit(BOOL))
        .when(t.isin(*_INTEGER_TYPES), F.lit(INT))
        .when(t.isin("float", "double") & finite, F.lit(DOUBLE))
        .when(t.isin(*_TEXT_TYPES, "binary", "uuid"), F.lit(BYTES))
        .otherwise(F.lit(OTHER))
    )
    i = F.when(t == "ulong", _dec(v.getField("string"))).otherwise(_dec(v.getField("long")))
    x = F.when(t.isin(*_TEXT_TYPES), v.getField("string").cast("binary")).otherwise(v.getField("binary"))
    return SqlVal(k, b=v.getField("boolean"), i=i, d=dbl, x=x)


def _nullable(kind: int, c: Column, field: str) -> SqlVal:
    return SqlVal(F.when(c.isNotNull(), F.lit(kind)), **{field: c})


def field_val(key: str) -> SqlVal:
    """header.priority and the properties fields."""
    props = F.col("properties")
    if key == "priority":
        return SqlVal(F.lit(INT), i=_dec(F.coalesce(F.col("header").getField("priority"), F.lit(4))))
    if key in ("message_id", "correlation_id"):
        return typed_sql_val(props.getField(key))
    if key == "user_id":
        return _nullable(BYTES, props.getField(key), "x")
    if key in ("absolute_expiry_time", "creation_time", "group_sequence"):
        return _nullable(INT, _dec(props.getField(key)), "i")
    return _nullable(BYTES, props.getField(key).cast("binary"), "x")


_REF = re.compile(r"`(__bfq\d+)`")
_LEVELS = "\x00amqp-sql levels"  # context key: hidden column name -> its layer


class SqlCompiler:
    def __init__(self, context: dict | None = None):
        self.context = {} if context is None else context  # SQL text -> (hidden column, layer)
        self.defs: list[tuple[int, str, Column]] = []
        self.top = 0

    def define(self, level: int, expr: Column) -> tuple[Column, int]:
        if expr.cheap:
            return expr, 0
        known = self.context.get(expr.sql)
        if known is None:
            # above every hidden column it reads, whatever layer the caller asked for
            levels = self.context.setdefault(_LEVELS, {})
            level = max([level] + [levels[name] + 1 for name in _REF.findall(expr.sql)])
            known = self.context[expr.sql] = (f"__bfq{next(hidden_names)}", level)
            levels[known[0]] = level
            self.defs.append((level, known[0], expr))
        self.top = max(self.top, known[1])
        return F.col(known[0]), known[1]

    def keep(self, v: SqlVal, level: int) -> SqlVal:
        """`v` with its components materialized in layer `level` (above what they read)."""
        return keep_fields(self.define, level, v, SqlVal(v.k), ("k", "b", "i", "d", "x"))

    def value(self, node: Any) -> SqlVal:
        v = self._value(node)
        return v if v.level or isinstance(node, ast.Literal) else self.keep(v, max(v.level, 1) + 1)

    def _value(self, node: Any) -> SqlVal:
        if isinstance(node, ast.Literal):
            v = node.value
            if node.type == "boolean":
                return SqlVal(F.lit(BOOL), b=F.lit(bool(v)))
            if node.type in ("int", "long"):
                return SqlVal(F.lit(INT), i=_raw(f"CAST('{int(v)}' AS {_DEC})"))
            if node.type == "double":
                return SqlVal(F.lit(DOUBLE), d=F.lit(float(v)))
            data = v if node.type == "binary" else str(v).encode("utf-8", "surrogatepass")
            return SqlVal(F.lit(BYTES), x=_bin_lit(data))
        if isinstance(node, ast.Ident):
            if node.kind == "property":
                struct, _ = self.define(1, F.try_element_at(F.col("application_properties"), F.lit(node.key)))
                return self.keep(typed_sql_val(struct), 2)
            return self.keep(field_val(node.key), 2)
        if isinstance(node, ast.Call):  # UTC()
            return SqlVal(F.lit(INT), i=_dec(_raw("unix_millis(current_timestamp())")))
        if isinstance(node, ast.Unary) and node.op in ("+", "-"):
            v = self.value(node.operand)
            sign = (lambda c: -c) if node.op == "-" else (lambda c: c)
            num = v.is_(INT, DOUBLE)
            out = SqlVal(
                F.when(num, v.k),
                i=F.when(v.is_(INT), sign(v.i)) if v.i is not None else None,
                d=F.when(v.is_(DOUBLE), sign(v.d)) if v.d is not None else None,
            )
            return self.keep(out, v.level + 1)
        if isinstance(node, ast.Binary) and node.op in ast.ARITHMETIC_OPS:
            left, right = self.value(node.left), self.value(node.right)
            level = max(left.level, right.level) + 1
            out = self.arithmetic(node.op, left, right)
            # the kind reads the components: they come first, one layer below it
            k = out.k
            out = self.keep(SqlVal(F.lit(0), b=out.b, i=out.i, d=out.d, x=out.x), level)
            kind_sql = k.sql
            for field in ("i", "d"):
                inner = getattr(out, field)
                if inner is not None:
                    kind_sql = kind_sql.replace(_placeholder(field), inner.sql)
            out.k, out.level = self.define(out.level + 1, _raw(kind_sql))
            return out
        before = self.top
        c = _c(self.cond(node))
        out = SqlVal(F.when(c.isNotNull(), F.lit(BOOL)), b=c)
        return self.keep(out, max(self.top, before) + 1)

    def arithmetic(self, op: str, a: SqlVal, b: SqlVal) -> SqlVal:
        both_int = a.is_(INT) & b.is_(INT)
        both_num = a.is_(INT, DOUBLE) & b.is_(INT, DOUBLE)
        ad, bd = a.as_double(), b.as_double()
        # The kind is written over placeholders for the result's own components (see `_value`).
        if op == "/":
            quotient = F.when(bd != F.lit(0.0), ad / bd)
            d = F.when(both_num, _finite(quotient))
            return SqlVal(F.when(_raw(_placeholder("d")).isNotNull(), F.lit(DOUBLE)), d=d)
        if op == "%":
            i = F.when(both_int & (b.i != _dec(0)), _raw(f"({a.i.sql} % {b.i.sql})")) if a.i is not None and b.i is not None else None
            return SqlVal(F.when(_raw(_placeholder("i")).isNotNull(), F.lit(INT)) if i is not None else F.lit(None).cast("int"), i=i)
        py = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}[op]
        i = F.when(both_int, py(a.i, b.i)) if a.i is not None and b.i is not None else None
        d = F.when(both_num & ~both_int, _finite(py(ad, bd)))
        k = F.when(_raw(_placeholder("d")).isNotNull(), F.lit(DOUBLE))
        if i is not None:
            k = F.when(_raw(_placeholder("i")).isNotNull(), F.lit(INT)).when(_raw(_placeholder("d")).isNotNull(), F.lit(DOUBLE))
        return SqlVal(k, i=i, d=d)

    def equal(self, a: SqlVal, b: SqlVal) -> Column:
        """Erlang `==` of two non-NULL values (FALSE between unlike kinds)."""
        branches = []
        if a.b is not None and b.b is not None:
            branches.append((a.is_(BOOL) & b.is_(BOOL), a.b == b.b))
        branches.append((a.is_(INT, DOUBLE) & b.is_(INT, DOUBLE), self._num_cmp("=", a, b)))
        if a.x is not None and b.x is not None:
            branches.append((a.is_(BYTES) & b.is_(BYTES), a.x == b.x))
        return _case(branches, F.lit(False))

    def _num_cmp(self, op: str, a: SqlVal, b: SqlVal) -> Column:
        cmp = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[op]
        as_double = _raw(f"({a.as_double().sql} {cmp} {b.as_double().sql})")
        if a.i is None or b.i is None:
            return as_double
        exact = _raw(f"({a.i.sql} {cmp} {b.i.sql})")
        return F.when(a.is_(INT) & b.is_(INT), exact).otherwise(as_double)

    def compare(self, op: str, a: SqlVal, b: SqlVal) -> Column:
        null = a.k.isNull() | b.k.isNull()
        if op in ("=", "<>"):
            eq = self.equal(a, b)
            return F.when(~null, eq if op == "=" else ~eq)
        branches = [(a.is_(INT, DOUBLE) & b.is_(INT, DOUBLE), self._num_cmp(op, a, b))]
        if a.x is not None and b.x is not None:
            branches.append((a.is_(BYTES) & b.is_(BYTES), _raw(f"({a.x.sql} {op} {b.x.sql})")))
        return F.when(~null, _case(branches, F.lit(False)))

    def cond(self, node: Any) -> Any:
        if isinstance(node, ast.Unary) and node.op == "NOT":
            return ~_c(self.cond(node.operand))
        if isinstance(node, ast.Binary) and node.op in ast.LOGICAL_OPS:
            left, right = _c(self.cond(node.left)), _c(self.cond(node.right))
            return (left & right) if node.op == "AND" else (left | right)
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISON_OPS:
            return self.compare(node.op, self.value(node.left), self.value(node.right))
        if isinstance(node, ast.IsNull):
            n = self.value(node.operand).k.isNull()
            return ~n if node.negated else n
        if isinstance(node, ast.Like):
            v = self.value(node.operand)
            if v.x is None:
                return F.lit(None).cast("boolean")
            text = v.x.cast("string")
            hit = text.rlike(like_regex(sql_like_pattern(node.pattern, node.escape), node.escape))
            ok = v.is_(BYTES) & F.is_valid_utf8(text)
            return F.when(ok, ~hit if node.negated else hit)
        if isinstance(node, ast.In):
            v = self.value(node.operand)
            items = [self.value(x) for x in node.values]
            found = _or_all([F.coalesce(F.when(it.k.isNotNull(), self.equal(v, it)), F.lit(False)) for it in items])
            return F.when(v.k.isNotNull(), ~found if node.negated else found)
        v = self.value(node)
        return F.when(v.is_(BOOL), v.b) if v.b is not None else F.lit(None).cast("boolean")


def _placeholder(field: str) -> str:
    return f"@{field}@"


def _c(c: Any) -> Column:
    return F.lit(c) if isinstance(c, bool) else c


def _finite(c: Column) -> Column:
    return F.when(~F.isnan(c) & (call("abs", c) < F.lit(math.inf)), c)


def _case(branches: list, otherwise: Column) -> Column:
    out = None
    for cond, value in branches:
        out = F.when(cond, value) if out is None else out.when(cond, value)
    return otherwise if out is None else out.otherwise(otherwise)


def _or_all(cs: list) -> Column:
    out = cs[0]
    for c in cs[1:]:
        out = out | c
    return out


def compile_sql(selector: ast.Selector, context: dict | None = None) -> tuple[list, Column]:
    """An amqp-sql selector AST -> (hidden column definitions, boolean Column: TRUE / FALSE / NULL
    for UNKNOWN)."""
    if selector.expr is None:
        return [], F.lit(True)
    compiler = SqlCompiler(context)
    return compiler.defs, _c(compiler.cond(selector.expr))


# ----------------------------------------------------------------------------- property filters
@dataclass
class _Got:
    """A message value for a property filter: its AMQP type name (NULL when absent) and components."""

    t: Column
    s: Any = None
    i: Any = None
    d: Any = None
    bo: Any = None
    x: Any = None


def _typed_got(v: Column) -> _Got:
    t = v.getField("type")
    i = F.when(t == "ulong", _dec(v.getField("string"))).otherwise(_dec(v.getField("long")))
    return _Got(t, v.getField("string"), i, v.getField("double"), v.getField("boolean"), v.getField("binary"))


_PROPERTY_KIND = {"user_id": "binary", "content_type": "symbol", "content_encoding": "symbol",
                  "absolute_expiry_time": "timestamp", "creation_time": "timestamp", "group_sequence": "uint"}  # fmt: skip


def _property_got(attr: str) -> _Got:
    v = F.col("properties").getField(attr)
    if attr in ("message_id", "correlation_id"):
        return _typed_got(v)
    kind = _PROPERTY_KIND.get(attr, "string")
    t = F.when(v.isNotNull(), F.lit(kind))
    if kind in ("string", "symbol"):
        return _Got(t, s=v)
    if kind == "binary":
        return _Got(t, x=v)
    return _Got(t, i=_dec(v))


def property_filter_condition(checks: Any) -> Column:
    """A compiled filtex property filter (`filtex.PropertyChecks`) as a TRUE / FALSE Column."""
    conds = []
    for name, ref in checks.checks:
        if checks.kind == "properties":
            got = _property_got(name)
            present = got.t.isNotNull()
        else:
            raw = F.try_element_at(F.col("application_properties"), F.lit(name))
            got = _typed_got(raw)
            present = got.t.isNotNull() & ((got.t != F.lit("null")) if ref is not None else F.lit(True))
        conds.append(present & F.coalesce(_reference_match(got, ref), F.lit(False)))
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return F.coalesce(out, F.lit(False))


_NUMERIC_TYPES = ("ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "float", "double")


def _reference_match(got: _Got, ref: Any) -> Any:
    """filtex._match over Columns (the value is present)."""
    from ..amqp.types import timestamp
    from ..filters import filtex

    t = got.t
    text = t.isin("string", "symbol", "char")
    if ref is None:
        return F.lit(True)
    if isinstance(ref, filtex.Prefix) and got.s is not None:
        return text & got.s.startswith(F.lit(str(ref)))
    if isinstance(ref, filtex.Suffix) and got.s is not None:
        return text & got.s.endswith(F.lit(str(ref)))
    if isinstance(ref, (filtex.Prefix, filtex.Suffix)):
        return F.lit(False)
    if isinstance(ref, (int, float)) and not isinstance(ref, (bool, timestamp)):
        if got.i is None and got.d is None:
            return F.lit(False)
        num = t.isin(*_NUMERIC_TYPES)
        integer = t.isin(*_NUMERIC_TYPES[:-2])
        if isinstance(ref, int):
            exact = integer & (got.i == _raw(f"CAST('{int(ref)}' AS {_DEC})")) if got.i is not None else F.lit(False)
            approx = t.isin("float", "double") & (got.d == F.lit(float(ref))) if got.d is not None else F.lit(False)
            return num & (exact | approx)
        as_double = F.when(integer, got.i.cast("double") if got.i is not None else F.lit(None)).otherwise(got.d)
        return num & (as_double == F.lit(float(ref)))
    if isinstance(ref, bool):
        return (t == F.lit("boolean")) & (got.bo == F.lit(ref)) if got.bo is not None else F.lit(False)
    if isinstance(ref, timestamp):
        return (t == F.lit("timestamp")) & (got.i == _dec(F.lit(int(ref)))) if got.i is not None else F.lit(False)
    if isinstance(ref, str):
        return text & (got.s == F.lit(str(ref))) if got.s is not None else F.lit(False)
    if isinstance(ref, (bytes, bytearray)):
        return (t == F.lit("binary")) & (got.x == _bin_lit(bytes(ref))) if got.x is not None else F.lit(False)
    import uuid

    if isinstance(ref, uuid.UUID) and got.x is not None:
        return (t == F.lit("uuid")) & (got.x == _bin_lit(ref.bytes))
    return F.lit(False)
