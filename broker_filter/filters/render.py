"""AST -> canonical selector text.

Canonical form: keywords upper case, one space around binary operators, parentheses only where
precedence needs them, literals in a form that parses back to the same typed literal (an `int`-range
long keeps its `L`).  amqp-sql renders in its own syntax: `[name]` for identifiers that need quoting,
fields as written (`p.subject`), `0x..` binaries, doubles as digits.digits[E..], no `L`.  The style
travels in the `hyphenated` argument: False, True, or `SQL`.  `parse(render(parse(s))) == parse(s)` for every valid selector.
"""

from __future__ import annotations

import re

from . import ast
from .parser import _SQL_RESERVED, _TAGS_RE, CONVERT_PREFIX, HYPHEN_PREFIX

# Binding strength, loosest first.
_PREC = {"OR": 1, "AND": 2, "NOT": 3, "PRED": 4, "+": 5, "-": 5, "*": 6, "/": 6, "%": 6, "SIGN": 7, "ATOM": 8}
SQL = "amqp-sql"  # the rendering style of the amqp-sql dialect
_SQL_IDENT_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*")
_KEYWORDS = {"NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"}
_IDENT_RE = re.compile(r"(?!\d)[\w$]+")
_IDENT_HYPHEN_RE = re.compile(r"(?!\d)[\w$]+(?:-[\w$]+)*")
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def render(selector: ast.Selector) -> str:
    prefix = ""
    if selector.convert_strings:
        prefix += CONVERT_PREFIX
    if selector.hyphenated:
        prefix += HYPHEN_PREFIX
    if selector.expr is None:
        return prefix
    text = _render(selector.expr, SQL if selector.dialect == SQL else selector.hyphenated)
    if selector.dialect == "rocketmq" and not isinstance(selector.expr, ast.Tags) and _TAGS_RE.fullmatch(text):
        text = f"({text})"  # a lone identifier would read back as a tag expression
    return prefix + text


def _prec(node: ast.Node) -> int:
    if isinstance(node, ast.Binary):
        return _PREC["PRED"] if node.op in ast.COMPARISON_OPS else _PREC[node.op]
    if isinstance(node, ast.Unary):
        return _PREC["NOT"] if node.op == "NOT" else _PREC["SIGN"]
    if isinstance(node, ast.Literal):
        if node.type in ("int", "long", "double") and (node.value < 0 or str(node.value).startswith("-")):
            return _PREC["SIGN"]
        return _PREC["ATOM"]
    if isinstance(node, (ast.Ident, ast.Tags, ast.Call)):
        return _PREC["ATOM"]
    return _PREC["PRED"]


def _wrap(node: ast.Node, need: int, hyphenated: bool) -> str:
    text = _render(node, hyphenated)
    return f"({text})" if _prec(node) < need else text


def _literal(node: ast.Literal, style: object = False) -> str:
    v = node.value
    if style == SQL and node.type == "binary":
        return "0x" + v.hex().upper()
    if style == SQL and node.type == "double":
        mantissa, _, exponent = f"{float(v):.17g}".partition("e")
        if "." not in mantissa and mantissa.lstrip("-").isdigit():
            mantissa += ".0"
        return mantissa + (f"E{int(exponent)}" if exponent else "")
    if style == SQL and node.type == "long":
        return str(int(v))
    if node.type == "string":
        return "'" + v.replace("'", "''") + "'"
    if node.type == "boolean":
        return "TRUE" if v else "FALSE"
    if node.type == "double":
        text = repr(float(v))
        return text if ("." in text or "e" in text or "n" in text) else text + ".0"
    text = str(int(v))
    if node.type == "long" and INT_MIN <= v <= INT_MAX:
        text += "L"
    return text


def _ident(node: ast.Ident, hyphenated: bool) -> str:
    if node.kind == "annotation":
        return f"m.{node.key}"
    name = node.name
    if hyphenated == SQL:
        if node.kind == "field" or ("." in name and node.key != name):  # p.subject, a.key as written
            return name
        if _SQL_IDENT_RE.fullmatch(name) and name.lower() not in _SQL_RESERVED:
            return name
        return "[" + name.replace("[", "[[").replace("]", "]]") + "]"
    pattern = _IDENT_HYPHEN_RE if hyphenated else _IDENT_RE
    if pattern.fullmatch(name) and name.upper() not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def _render(node: ast.Node, hyphenated: bool) -> str:
    r = _render
    if isinstance(node, ast.Literal):
        return _literal(node, hyphenated)
    if isinstance(node, ast.Call):
        return f"{node.name}()"
    if isinstance(node, ast.Ident):
        return _ident(node, hyphenated)
    if isinstance(node, ast.Tags):
        return "*" if node.tags is None else " || ".join(node.tags)
    if isinstance(node, ast.Binary):
        if node.op in ast.COMPARISON_OPS:
            return f"{_wrap(node.left, 5, hyphenated)} {node.op} {_wrap(node.right, 5, hyphenated)}"
        p = _PREC[node.op]
        if node.op in ("AND", "OR"):
            # Chains are associative: same-operator children render flat.
            return f"{_wrap(node.left, p, hyphenated)} {node.op} {_wrap(node.right, p, hyphenated)}"
        return f"{_wrap(node.left, p, hyphenated)} {node.op} {_wrap(node.right, p + 1, hyphenated)}"
    if isinstance(node, ast.Unary):
        if node.op == "NOT":
            return f"NOT {_wrap(node.operand, _PREC['NOT'], hyphenated)}"
        inner = _wrap(node.operand, _PREC["SIGN"] + 1 if node.op == "-" else _PREC["SIGN"], hyphenated)
        if _prec(node.operand) <= _PREC["SIGN"] and not inner.startswith("("):
            inner = f"({inner})"
        return f"{node.op}{inner}"
    neg = "NOT " if getattr(node, "negated", False) else ""
    if isinstance(node, ast.Between):
        return (
            f"{_wrap(node.operand, 5, hyphenated)} {neg}BETWEEN "
            f"{_wrap(node.low, 5, hyphenated)} AND {_wrap(node.high, 5, hyphenated)}"
        )
    if isinstance(node, ast.In):
        items = ", ".join(_render(v, hyphenated) for v in node.values)
        return f"{_wrap(node.operand, 5, hyphenated)} {neg}IN ({items})"
    if isinstance(node, ast.Like):
        esc = f" ESCAPE {_literal(ast.Literal(node.escape, 'string'))}" if node.escape is not None else ""
        return f"{_wrap(node.operand, 5, hyphenated)} {neg}LIKE {_literal(ast.Literal(node.pattern, 'string'))}{esc}"
    if isinstance(node, ast.IsNull):
        return f"{_wrap(node.operand, 5, hyphenated)} IS {neg}NULL"
    if isinstance(node, ast.StringTest):
        return f"{_wrap(node.operand, 5, hyphenated)} {neg}{node.op} {_literal(ast.Literal(node.value, 'string'))}"
    raise TypeError(f"not a selector node: {node!r}")
