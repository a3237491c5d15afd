"""Spark SQL expression text with the shape of PySpark's Column API (the subset the compiler uses).

Why: building a selector through PySpark `Column` objects costs one JVM round trip per operator,
which dominates for thousands of selectors; SQL text is built in Python and handed to Spark once per
projection (`selectExpr`).  The result is the same native Catalyst expression tree.

Client text never reaches the SQL unquoted: string literals that are not plain words are written as
UTF-8 hex (`CAST(X'..' AS STRING)`), which Spark folds to a constant; identifiers are backquoted
names generated here, never client text.
"""

from __future__ import annotations

import math
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z0-9 _.:%$!-]*")
_TYPES = {"long": "BIGINT", "int": "INT", "double": "DOUBLE", "float": "FLOAT", "string": "STRING", "boolean": "BOOLEAN", "binary": "BINARY"}


class E:
    """One SQL expression.  `cheap`: a column reference or literal, fine to repeat."""

    __slots__ = ("sql", "cheap")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, sql: str, cheap: bool = False):
        self.sql = sql
        self.cheap = cheap

    def __repr__(self) -> str:
        return f"E({self.sql})"

    def _op(self, op: str, other: Any) -> "E":
        return E(f"({self.sql} {op} {_e(other).sql})")

    def __eq__(self, other: Any) -> "E":  # type: ignore[override]
        return self._op("=", other)

    def __ne__(self, other: Any) -> "E":  # type: ignore[override]
        return self._op("<>", other)

    def __lt__(self, other: Any) -> "E":
        return self._op("<", other)

    def __le__(self, other: Any) -> "E":
        return self._op("<=", other)

    def __gt__(self, other: Any) -> "E":
        return self._op(">", other)

    def __ge__(self, other: Any) -> "E":
        return self._op(">=", other)

    def __and__(self, other: Any) -> "E":
        return self._op("AND", other)

    def __or__(self, other: Any) -> "E":
        return self._op("OR", other)

    def __invert__(self) -> "E":
        return E(f"(NOT {self.sql})")

    def __add__(self, other: Any) -> "E":
        return self._op("+", other)

    def __sub__(self, other: Any) -> "E":
        return self._op("-", other)

    def __mul__(self, other: Any) -> "E":
        return self._op("*", other)

    def __truediv__(self, other: Any) -> "E":
        return self._op("/", other)

    def __neg__(self) -> "E":
        return E(f"(-({self.sql}))")

    def isin(self, *values: Any) -> "E":
        return E(f"({self.sql} IN ({', '.join(_e(v).sql for v in values)}))")

    def isNull(self) -> "E":  # noqa: N802 - PySpark's spelling
        return E(f"({self.sql} IS NULL)")

    def isNotNull(self) -> "E":  # noqa: N802
        return E(f"({self.sql} IS NOT NULL)")

    def rlike(self, pattern: str) -> "E":
        return E(f"({self.sql} RLIKE {lit(pattern).sql})")

    def cast(self, kind: str) -> "E":
        return E(f"CAST({self.sql} AS {_TYPES[kind]})", self.cheap)

    def getField(self, name: str) -> "E":  # noqa: N802
        return E(f"{self.sql}.`{name}`" if self.cheap else f"({self.sql}).`{name}`", self.cheap)

    def contains(self, other: Any) -> "E":
        return call("contains", self, other)

    def startswith(self, other: Any) -> "E":
        return call("startswith", self, other)

    def endswith(self, other: Any) -> "E":
        return call("endswith", self, other)


class Case(E):
    """CASE WHEN ... [ELSE ...] END, built like PySpark's `when(...).when(...).otherwise(...)`."""

    __slots__ = ("branches", "default")

    def __init__(self, branches: list, default: Any = None):
        self.branches = branches
        self.default = default
        parts = " ".join(f"WHEN {_e(c).sql} THEN {_e(v).sql}" for c, v in branches)
        tail = "" if default is None else f" ELSE {_e(default).sql}"
        super().__init__(f"CASE {parts}{tail} END")

    def when(self, cond: Any, value: Any) -> "Case":
        return Case(self.branches + [(cond, value)], self.default)

    def otherwise(self, value: Any) -> "Case":
        return Case(self.branches, value)


def _e(v: Any) -> E:
    return v if isinstance(v, E) else lit(v)


def lit(v: Any) -> E:
    if isinstance(v, E):
        return v
    if v is None:
        return E("NULL", True)
    if isinstance(v, bool):
        return E("TRUE" if v else "FALSE", True)
    if isinstance(v, int):
        return E(str(v) if -(2**31) <= v < 2**31 else f"CAST({v} AS BIGINT)", True)
    if isinstance(v, float):
        if math.isnan(v):
            return E("CAST('NaN' AS DOUBLE)", True)
        if math.isinf(v):
            return E(f"CAST('{'-' if v < 0 else ''}Infinity' AS DOUBLE)", True)
        return E(f"CAST('{float(v)!r}' AS DOUBLE)", True)
    if isinstance(v, str):
        if _PLAIN.fullmatch(v):
            return E(f"'{v}'", True)
        return E(f"CAST(X'{v.encode('utf-8').hex()}' AS STRING)", True)
    raise TypeError(f"no SQL literal for {type(v).__name__}")


def col(name: str) -> E:
    return E(f"`{name}`", True)


def call(name: str, *args: Any) -> E:
    return E(f"{name}({', '.join(_e(a).sql for a in args)})")


class functions:  # noqa: N801 - stands in for `pyspark.sql.functions`
    """The PySpark functions the compiler uses, producing SQL text."""

    lit = staticmethod(lit)
    col = staticmethod(col)

    @staticmethod
    def when(cond: Any, value: Any) -> Case:
        return Case([(cond, value)])

    @staticmethod
    def coalesce(*args: Any) -> E:
        return call("coalesce", *args)

    @staticmethod
    def try_element_at(m: Any, key: Any) -> E:
        return call("try_element_at", m, key)

    @staticmethod
    def map_contains_key(m: Any, key: Any) -> E:
        return call("map_contains_key", m, key)

    @staticmethod
    def concat(*args: Any) -> E:
        return call("concat", *args)

    @staticmethod
    def hex(v: Any) -> E:
        return call("hex", v)

    @staticmethod
    def is_valid_utf8(v: Any) -> E:
        return call("is_valid_utf8", v)

    @staticmethod
    def regexp_replace(v: Any, pattern: str, replacement: str) -> E:
        return call("regexp_replace", v, pattern, replacement)

    @staticmethod
    def lower(v: Any) -> E:
        return call("lower", v)

    @staticmethod
    def isnan(v: Any) -> E:
        return call("isnan", v)

    @staticmethod
    def pow(a: Any, b: Any) -> E:
        return call("pow", a, b)

    @staticmethod
    def signum(v: Any) -> E:
        return call("signum", v)

    @staticmethod
    def call_function(name: str, *args: Any) -> E:
        if name == "div":
            a, b = args
            return E(f"({_e(a).sql} div {_e(b).sql})")
        return call(name, *args)
