"""Selector text -> AST (`ast.Selector`), with static type checks.

Theory of operation: one LALR grammar (grammar/selector.lark) with per-dialect terminals, driven by
lark with a lexer of our own (one master regex; lark's general lexer costs more than the parser on
long selectors); the tree is built by an inline transformer while parsing, so no parse tree is materialised and every static error
is raised with the position of the offending token.  A node's static type is one of
    "cond" (a condition), "str", "bool", "num" (literals and arithmetic), "any" (identifiers),
and the checks enforce docs/selectors.md's compile-time errors.  AND/OR chains are collected flat and
built balanced, so a long OR chain does not make a deep tree.  Limits (length, nesting depth, IN-list
size) are enforced with `LimitError`; nothing here recurses on input size.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lark import Lark
from lark.parsers.lalr_analysis import Shift

from . import ast
from .dialects import Dialect, get_dialect
from .errors import LimitError, SelectorError
from .runtime import like_search_chars, sql_like_pattern

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

CONVERT_PREFIX = "convert_string_expressions:"
HYPHEN_PREFIX = "hyphenated_props:"


@dataclass(frozen=True)
class Limits:
    max_length: int = 64 * 1024  # characters of selector text
    max_depth: int = 200  # nesting depth of the expression (an AND/OR chain counts once)
    max_in: int = 10_000  # elements of one IN list
    max_pattern_words: int = 128  # words of a topic binding key (`wildcards.MAX_PATTERN_WORDS`)
    # characters of LIKE segments between two `%` mixing `_` with other characters, per selector:
    # each is searched at up to its length per character of the value (`runtime.like_search_chars`)
    max_like_search: int = 32


DEFAULT_LIMITS = Limits()

_IDENT = r"/(?!\d)[\w$]+/"
_IDENT_HYPHEN = r"/(?!\d)[\w$]+(?:-[\w$]+)*/"

_EXTRA_QUOTED = """| QIDENT                                 -> qident"""
_EXTRA_ANNOTATION = """| ANNOT                                  -> annotation"""
_TERMINALS_QUOTED = r"""
QIDENT: /"(?:[^"]|"")*"/
"""
_TERMINALS_ANNOTATION = r"""
ANNOT.2: /m\.[\w$][\w$.\-]*/
"""
_STRING_TESTS = """| sum STRTEST sum                      -> strtest
          | sum NOT STRTEST sum                  -> not_strtest"""
_TERMINALS_ROCKETMQ = """
STRTEST: "contains"i | "startswith"i | "endswith"i
"""

# RocketMQ tag expression: `*`, or tag words separated by `||` (no SQL punctuation in a tag).
_TAG_WORD = r"[^\s|'\"()=<>!,]+"
_TAGS_RE = re.compile(rf"\s*(?:(\*)|({_TAG_WORD}(?:\s*\|\|\s*{_TAG_WORD})*))\s*")


_EXTRA_SQL = """| BINARY                                 -> binary
        | UTC LPAR RPAR                          -> call"""
_TERMINALS_SQL = r"""
BINARY: /0x[0-9A-F]+/
UTC: "UTC"
"""


@functools.lru_cache(maxsize=None)
def _grammar(quoted: bool, annotations: bool, hyphenated: bool, rocketmq: bool, sql: bool = False) -> str:
    text = resources.files(__package__).joinpath("grammar/selector.lark").read_text(encoding="utf-8")
    text = text.replace("@IDENT@", _IDENT_HYPHEN if hyphenated else _IDENT)
    extra = (_EXTRA_QUOTED if quoted else "") + ("\n        " + _EXTRA_ANNOTATION if annotations else "")
    extra += ("\n        " + _EXTRA_SQL) if sql else ""
    text = text.replace("@EXTRA_PRIMARY@", extra)
    text = text.replace("@STRING_TESTS@", _STRING_TESTS if rocketmq else "")
    if quoted:
        text += _TERMINALS_QUOTED
    if annotations:
        text += _TERMINALS_ANNOTATION
    if rocketmq:
        text += _TERMINALS_ROCKETMQ
    if sql:
        text += _TERMINALS_SQL
    return text


_KEYWORDS = frozenset({"OR", "AND", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"})
_STRING_TEST_WORDS = frozenset({"CONTAINS", "STARTSWITH", "ENDSWITH"})
_NUMBER_RE = r"(?:0[xX][0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)[lLfFdD]?"


class _BadCharacter(Exception):
    def __init__(self, pos: int):
        self.pos = pos


class _LexError(Exception):
    """A token the amqp-sql lexer refuses (a reserved word, an unknown field, a bad binary...)."""

    def __init__(self, pos: int, message: str):
        self.pos = pos
        self.message = message


# amqp-sql (filtex §6, RabbitMQ's rabbit_amqp_sql_lexer.xrl): keywords are upper case; their lower-case
# spellings and the words filtex reserves for functions are not identifiers.
_SQL_KEYWORDS = frozenset({"AND", "OR", "NOT", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE", "UTC"})
_SQL_RESERVED = frozenset(
    {"and", "or", "not", "like", "in", "is", "null", "escape", "true", "false", "exists", "nan", "inf",
     "lower", "upper", "left", "right", "substring", "utc", "date"}
)  # fmt: skip
# section-qualified fields (filtex §6.4.4.4): header.priority and the properties, underscored
SQL_PROPERTY_FIELDS = frozenset(
    {"message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type", "content_encoding",
     "absolute_expiry_time", "creation_time", "group_id", "group_sequence", "reply_to_group_id"}
)  # fmt: skip
_SQL_SECTIONS = {"header": "header", "h": "header", "properties": "properties", "p": "properties",
                 "application_properties": "application", "a": "application"}  # fmt: skip
_SQL_MASTER = re.compile(
    "|".join(
        (
            r"(?P<WS>[ \t\f\r\n]+)",
            r"(?P<STRING>'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")",
            r"(?P<BINARY>0x(?:[0-9A-F]{2})+(?![0-9A-Za-z_]))",
            r"(?P<BADBIN>0x[0-9A-Za-z_]*)",
            r"(?P<NUMBER>[0-9]+\.[0-9]+(?:E[+-]?[0-9]+)?|[0-9]+)",
            r"(?P<SECTION>[a-zA-Z][a-zA-Z_-]*\.[a-zA-Z][a-zA-Z0-9_]*)",
            r"(?P<QIDENT>\[(?:[^\[\]]|\[\[|\]\])*\])",
            r"(?P<IDENT>[a-zA-Z][a-zA-Z0-9_]*)",
            r"(?P<COMPARE><>|!=|<=|>=|=|<|>)",
            r"(?P<ADD>[+-])",
            r"(?P<MUL>[*/%])",
            r"(?P<LPAR>\()",
            r"(?P<RPAR>\))",
            r"(?P<COMMA>,)",
        )
    )
)


def _sql_tokens(text: str) -> list:
    """The amqp-sql lexer: token types as the shared grammar names them."""
    match, out, pos, n = _SQL_MASTER.match, [], 0, len(text)
    while pos < n:
        m = match(text, pos)
        if m is None:
            raise _BadCharacter(pos)
        kind, value = m.lastgroup, m.group()
        if kind == "WS":
            pos = m.end()
            continue
        if kind == "BADBIN":
            raise _LexError(pos, f"bad binary constant {value}: 0x takes pairs of upper-case hex digits (0-9, A-F)")
        if kind == "IDENT":
            if value in _SQL_KEYWORDS:
                kind = value
            elif value.lower() in _SQL_RESERVED:
                raise _LexError(pos, f"{value} is a reserved word (keywords are upper case; quote an identifier as [{value}])")
        elif kind == "SECTION":
            section, _, field = value.partition(".")
            where = _SQL_SECTIONS.get(section)
            if where is None:
                raise _LexError(pos, f"unknown section {section!r} in {value} (use header., properties. or application_properties.)")
            if where == "header" and field != "priority":
                raise _LexError(pos, f"unknown header field {value} (the header section offers priority)")
            if where == "properties" and field not in SQL_PROPERTY_FIELDS:
                raise _LexError(pos, f"unknown properties field {value} (names are underscored: p.message_id, p.creation_time, ...)")
            kind = "IDENT"
        elif kind == "QIDENT" and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise _LexError(pos, "a delimited identifier cannot contain control characters")
        elif kind == "COMPARE" and value == "!=":
            value = "<>"
        out.append(Tok(kind, value, pos))
        pos = m.end()
    out.append(Tok("$END", "", n))
    return out


class Tok:
    """A token: type, text and offset (lighter than lark's Token, which the driver does not need)."""

    __slots__ = ("type", "value", "start_pos")

    def __init__(self, type: str, value: str, start_pos: int):
        self.type = type
        self.value = value
        self.start_pos = start_pos

    def __repr__(self) -> str:
        return f"Tok({self.type}, {self.value!r}, {self.start_pos})"


class _Unexpected(Exception):
    def __init__(self, tok: Tok, expected: set):
        self.tok = tok
        self.expected = expected


class _Grammar:
    """One grammar variant: lark builds the LALR tables from grammar/selector.lark; a lean driver
    runs them (lark's general driver and lexer cost several times more on long selectors).

    Table rows map a token type to ("s", next state) or ("r", size, goto symbol, callback name,
    inline); `inline` marks `?rule` reductions of one child, which pass the child through."""

    def __init__(self, quoted: bool, annotations: bool, hyphenated: bool, rocketmq: bool, sql: bool = False):
        grammar = _grammar(quoted, annotations, hyphenated, rocketmq, sql)
        lark = Lark(grammar, parser="lalr", lexer="basic", maybe_placeholders=False)
        inner = lark.parser.parser.parser  # lark.parsers.lalr_parser._Parser: the LALR tables
        table = inner.parse_table
        self.start = table.start_states["start"]
        self.end = table.end_states["start"]
        self.states: dict[int, dict[str, tuple]] = {}
        for state, actions in table.states.items():
            row = {}
            for token, (action, arg) in actions.items():
                token = str(token)  # lark's symbol names are Token objects: plain str compares faster
                if action is Shift:
                    row[token] = ("s", arg)
                else:
                    name = arg.alias or arg.origin.name
                    name = getattr(name, "value", name)
                    size = len(arg.expansion)
                    inline = bool(arg.options.expand1) and size == 1 and name not in _CALLBACK_NAMES
                    row[token] = ("r", size, str(arg.origin.name), None if inline else name, inline)
            self.states[state] = row
        ident = r"(?!\d)[\w$]+(?:-[\w$]+)*" if hyphenated else r"(?!\d)[\w$]+"
        parts = [r"(?P<WS>[ \t\f\r\n]+)", r"(?P<STRING>'(?:[^']|'')*')", f"(?P<NUMBER>{_NUMBER_RE})"]
        if quoted:
            parts.append(r'(?P<QIDENT>"(?:[^"]|"")*")')
        if annotations:
            parts.append(r"(?P<ANNOT>m\.[\w$][\w$.\-]*)")
        parts += [
            f"(?P<IDENT>{ident})",
            r"(?P<COMPARE><>|<=|>=|=|<|>)",
            r"(?P<ADD>[+-])",
            r"(?P<MUL>[*/])",
            r"(?P<LPAR>\()",
            r"(?P<RPAR>\))",
            r"(?P<COMMA>,)",
        ]
        self.master = re.compile("|".join(parts))
        self.words = _STRING_TEST_WORDS if rocketmq else frozenset()
        if sql:
            self.tokens = _sql_tokens  # type: ignore[method-assign]

    def tokens(self, text: str) -> list:
        """Master-regex lexer: keywords are identifiers found in the keyword table."""
        match, out, pos, n = self.master.match, [], 0, len(text)
        keywords, words = _KEYWORDS, self.words
        while pos < n:
            m = match(text, pos)
            if m is None:
                raise _BadCharacter(pos)
            kind = m.lastgroup
            if kind != "WS":
                value = m.group()
                if kind == "IDENT":
                    upper = value.upper()
                    if upper in keywords:
                        kind = upper
                    elif upper in words:
                        kind = "STRTEST"
                out.append(Tok(kind, value, pos))
            pos = m.end()
        out.append(Tok("$END", "", n))
        return out

    def parse(self, text: str, builder: "_Builder") -> Any:
        states, end = self.states, self.end
        state_stack = [self.start]
        value_stack: list = []
        callbacks = {name: getattr(builder, name) for name in _CALLBACK_NAMES}
        for tok in self.tokens(text):
            ttype = tok.type
            while True:
                entry = states[state_stack[-1]].get(ttype)
                if entry is None:
                    raise _Unexpected(tok, {t for t in states[state_stack[-1]] if t.isupper() or t == "$END"})
                if entry[0] == "s":
                    state_stack.append(entry[1])
                    value_stack.append(tok)
                    break
                _, size, goto, name, inline = entry
                if size:
                    children = value_stack[-size:]
                    del state_stack[-size:]
                    del value_stack[-size:]
                else:
                    children = []
                value = children[0] if inline else callbacks[name](children)
                state_stack.append(states[state_stack[-1]][goto][1])
                value_stack.append(value)
                if ttype == "$END" and state_stack[-1] == end:
                    return value_stack[-1]


_CALLBACK_NAMES = (
    "string", "boolean", "null", "number", "ident", "qident", "annotation", "group", "sign", "arith",
    "compare", "between", "not_between", "in_", "not_in", "in_list", "like", "not_like", "is_null",
    "is_not_null", "strtest", "not_strtest", "not_", "logic", "empty", "binary", "call",
)  # fmt: skip


@functools.lru_cache(maxsize=None)
def _grammar_variant(quoted: bool, annotations: bool, hyphenated: bool, rocketmq: bool, sql: bool = False) -> _Grammar:
    return _Grammar(quoted, annotations, hyphenated, rocketmq, sql)


class _Chain:
    """An AND/OR chain under construction: flat items, turned balanced by `_fin`."""

    __slots__ = ("op", "items", "pos")

    def __init__(self, op: str, items: list, pos: int):
        self.op = op
        self.items = items
        self.pos = pos


_TOKEN_NAMES = {
    "$END": "the end of the selector",
    "COMPARE": "a comparison operator",
    "ADD": "'+' or '-'",
    "MUL": "'*' or '/'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "STRING": "a string",
    "NUMBER": "a number",
    "IDENT": "an identifier",
    "QIDENT": "a quoted identifier",
    "ANNOT": "an annotation reference",
    "STRTEST": "CONTAINS/STARTSWITH/ENDSWITH",
    "BINARY": "a binary constant",
}


def _describe_token(tok: Tok) -> str:
    if tok.type == "$END":
        return "the end of the selector"
    if tok.type in ("STRING", "NUMBER", "IDENT", "QIDENT", "ANNOT", "BINARY"):
        return f"{_TOKEN_NAMES[tok.type]} {tok.value}"
    if tok.type.isupper() and tok.type.isalpha() and tok.type not in _TOKEN_NAMES:
        return f"keyword {tok.value.upper()}"
    return repr(tok.value)


class _Builder:
    """Callbacks of the inline transformer: build AST nodes and check static types."""

    def __init__(self, dialect: Dialect | None = None, text: str = "", offset: int = 0, limits: Limits = DEFAULT_LIMITS):
        self.reset(dialect, text, offset, limits)

    def reset(self, dialect: Dialect | None, text: str, offset: int, limits: Limits) -> None:
        self.d = dialect
        self.text = text  # the whole original text (positions point into it)
        self.offset = offset  # length of stripped prefixes
        self.limits = limits
        self.pos: dict[int, int] = {}  # id(node) -> position of its first token
        self.keep: list = []  # keeps nodes alive so id() stays unique while parsing
        self.unsuffixed: set[int] = set()  # numeric literals without an L suffix
        self.overflow: dict[int, int] = {}  # 2**63 literals awaiting a unary minus
        self.sums: dict[int, str] = {}  # id(`+` node) -> its static type ("num", "str" or "val")
        self.like_search = 0  # `runtime.like_search_chars` over the selector's LIKE patterns so far

    # ------------------------------------------------------------------ helpers
    def err(self, message: str, pos: int | None) -> SelectorError:
        return SelectorError(message, self.text, None if pos is None else pos + self.offset)

    def at(self, node: Any, pos: int) -> Any:
        self.pos[id(node)] = pos
        self.keep.append(node)
        return node

    def p(self, node: Any) -> int | None:
        if isinstance(node, _Chain):
            return node.pos
        if isinstance(node, Tok):
            return node.start_pos
        return self.pos.get(id(node))

    def fin(self, node: Any) -> Any:
        if isinstance(node, _Chain):
            return self.at(ast.balanced(node.op, node.items), node.pos)
        return node

    def stype(self, node: Any) -> str:
        """The static type: "cond", "bool", "str", "num", "any" (an identifier) or "val" (a `+` that
        concatenates or adds, depending on its left operand at run time)."""
        if isinstance(node, ast.Literal):
            return {"string": "str", "boolean": "bool"}.get(node.type, "num")
        if isinstance(node, ast.Ident):
            return "any"
        if isinstance(node, ast.Unary):
            return "cond" if node.op == "NOT" else "num"
        if isinstance(node, ast.Binary):
            if node.op == "+":
                return self.sums.get(id(node), "num")
            return "num" if node.op in ast.ARITHMETIC_OPS else "cond"
        return "cond"

    def what(self, node: Any) -> str:
        if isinstance(node, ast.Literal):
            return {"string": "string", "boolean": "boolean"}.get(node.type, "number") + " literal"
        return {"cond": "a condition", "num": "an arithmetic expression", "val": "an arithmetic expression", "str": "a string expression"}.get(
            self.stype(node), "an expression"
        )

    def cond(self, node: Any) -> Any:
        node = self.fin(node)
        if self.d.filtex_sql or self.stype(node) in ("cond", "bool", "any"):
            return node
        raise self.err(f"expected a condition, found {self.what(node)}", self.p(node))

    def value(self, node: Any) -> Any:
        node = self.fin(node)
        if self.d.filtex_sql:  # amqp-sql has no static types: a mismatch is UNKNOWN or FALSE when evaluated
            return node
        if self.stype(node) == "cond":
            raise self.err("a condition cannot be used as a value here", self.p(node))
        return node

    def numeric(self, node: Any, context: str) -> Any:
        node = self.value(node)
        st = self.stype(node)
        if st in ("str", "bool") and not self.d.filtex_sql:
            raise self.err(f"{context} needs a number, found {self.what(node)}", self.p(node))
        return node

    # ------------------------------------------------------------------ literals and names
    def string(self, c):
        tok = c[0]
        quote = tok.value[0]  # amqp-sql takes "..." strings too
        return self.at(ast.Literal(tok.value[1:-1].replace(quote * 2, quote), "string"), tok.start_pos)

    def binary(self, c):
        tok = c[0]
        return self.at(ast.Literal(bytes.fromhex(tok.value[2:]), "binary"), tok.start_pos)

    def call(self, c):
        return self.at(ast.Call(c[0].value), c[0].start_pos)

    def boolean(self, c):
        tok = c[0]
        return self.at(ast.Literal(tok.type == "TRUE", "boolean"), tok.start_pos)

    def null(self, c):
        raise self.err("NULL is not a value: test for it with IS NULL or IS NOT NULL", c[0].start_pos)

    def number(self, c):
        tok = c[0]
        s, pos = tok.value, tok.start_pos
        if self.d.filtex_sql:  # digits, or digits.digits[E[+-]digits]: integers of any size, doubles
            if "." not in s:
                return self.at(ast.Literal(int(s), "long"), pos)
            value = float(s)
            if value == float("inf"):
                raise self.err(f"number {s} is out of range for a double", pos)
            return self.at(ast.Literal(value, "double"), pos)
        low = s.lower()
        if low.startswith("0x"):
            long_suffix = low.endswith("l")
            value = int(s[2:-1] if long_suffix else s[2:], 16)
            node = self._integer(value, long_suffix, pos)
        elif "." in s or "e" in low or low[-1] in "fd":
            if low[-1] == "l":
                raise self.err(f"{s}: the L suffix is for integers, not approximate numbers", pos)
            body = s[:-1] if low[-1] in "fd" else s
            value = float(body)
            if value == float("inf"):
                raise self.err(f"number {s} is out of range for a double", pos)
            node = self.at(ast.Literal(value, "double"), pos)
        else:
            long_suffix = low.endswith("l")
            digits = s[:-1] if long_suffix else s
            if len(digits) > 1 and digits[0] == "0":
                try:
                    value = int(digits, 8)
                except ValueError:
                    raise self.err(f"{s} is not a valid octal number (digits 0-7 after a leading 0)", pos) from None
            else:
                value = int(digits)
            node = self._integer(value, long_suffix, pos)
        return node

    def _integer(self, value: int, long_suffix: bool, pos: int) -> ast.Literal:
        if value > LONG_MAX + 1:
            raise self.err(f"integer {value} is out of range for a long", pos)
        typ = "int" if not long_suffix and INT_MIN <= value <= INT_MAX else "long"
        node = self.at(ast.Literal(value, typ), pos)
        if not long_suffix:
            self.unsuffixed.add(id(node))
        if value == LONG_MAX + 1:
            self.overflow[id(node)] = pos
        return node

    def ident(self, c):
        tok = c[0]
        return self.at(self._name(tok.value), tok.start_pos)

    def qident(self, c):
        tok = c[0]
        if self.d.filtex_sql:  # [name] with [[ and ]] for brackets: an application property
            name = tok.value[1:-1].replace("[[", "[").replace("]]", "]")
            return self.at(ast.Ident(name, "property", name), tok.start_pos)
        return self.at(ast.Ident(tok.value[1:-1].replace('""', '"'), "property", tok.value[1:-1].replace('""', '"')), tok.start_pos)

    def annotation(self, c):
        tok = c[0]
        key = tok.value[2:]
        return self.at(ast.Ident(key, "annotation", key), tok.start_pos)

    def _name(self, name: str) -> ast.Ident:
        # Interned: a property named in many selectors (links) is one string, not one per selector
        # (a maximal selector's names were ~24 KiB of its compiled form, issue 43).
        name = sys.intern(name)
        if self.d.filtex_sql and "." in name:  # checked by the lexer: header.priority, p.subject, a.key
            section, _, field = name.partition(".")
            if section in ("application_properties", "a"):
                return ast.Ident(name, "property", field)
            return ast.Ident(name, "field", field)
        if name in self.d.headers:
            return ast.Ident(name, "header", name)
        return ast.Ident(name, "property", name)

    def group(self, c):
        node = self.fin(c[1])
        self.pos.setdefault(id(node), c[0].start_pos)
        return node

    # ------------------------------------------------------------------ arithmetic
    def sign(self, c):
        op, operand = c[0], self.fin(c[1])
        if self.d.filtex_sql and isinstance(operand, ast.Literal) and operand.type in ("long", "double"):
            return self.at(ast.Literal(-operand.value if op.value == "-" else operand.value, operand.type), op.start_pos)
        if isinstance(operand, ast.Literal) and operand.type in ("int", "long", "double"):
            if op.value == "+":
                return self.at(operand, op.start_pos)
            if operand.type == "double":
                return self.at(ast.Literal(-operand.value, "double"), op.start_pos)
            if self.overflow.pop(id(operand), None) is not None:
                value = LONG_MIN  # the literal 9223372036854775808 exists only to be negated
            else:  # Java: negation keeps the type and wraps (-(-2147483648) is -2147483648)
                bits = 32 if operand.type == "int" else 64
                value = ((-operand.value + 2 ** (bits - 1)) % 2**bits) - 2 ** (bits - 1)
            node = self.at(ast.Literal(value, operand.type), op.start_pos)
            if id(operand) in self.unsuffixed:
                self.unsuffixed.add(id(node))
            return node
        operand = self.numeric(operand, f"unary {op.value}")
        return self.at(ast.Unary(op.value, operand), op.start_pos)

    def arith(self, c):
        left, op, right = c
        if not self.d.arithmetic:
            raise self.err(f"the {self.d.name} dialect has no arithmetic: '{op.value}' is not allowed", op.start_pos)
        if self.d.filtex_sql:  # numbers only, checked when evaluated (no concatenation)
            return self.at(ast.Binary(op.value, self.fin(left), self.fin(right)), self.p(left))
        if op.value == "+":
            # Java's createPlus: a string on the left concatenates whatever is on the right.
            left = self.value(left)
            lt = self.stype(left)
            if lt in ("str", "any", "val"):
                right = self.value(right)
                node = self.at(ast.Binary("+", left, right), self.p(left))
                self.sums[id(node)] = "str" if lt == "str" else "val"
                return node
        left = self.numeric(left, f"'{op.value}'")
        right = self.numeric(right, f"'{op.value}'")
        return self.at(ast.Binary(op.value, left, right), self.p(left))

    # ------------------------------------------------------------------ comparisons and predicates
    def compare(self, c):
        left, op, right = self.value(c[0]), c[1].value, self.value(c[2])
        lt, rt = self.stype(left), self.stype(right)
        if self.d.filtex_sql:
            return self.at(ast.Binary(op, left, right), self.p(left))
        if op not in ("=", "<>"):
            for side, st in ((left, lt), (right, rt)):
                if st in ("str", "bool"):
                    raise self.err(f"'{op}' compares numbers; {self.what(side)} can only be compared with = or <>", self.p(side))
        if isinstance(left, ast.Literal) and isinstance(right, ast.Literal) and lt != rt and "bool" in (lt, rt):
            # A string against a number literal is legal (and FALSE); a boolean literal only meets a boolean.
            raise self.err(f"cannot compare a {self.what(left)} with a {self.what(right)}", c[1].start_pos)
        return self.at(ast.Binary(op, left, right), self.p(left))

    def _between(self, c, negated: bool):
        operand = self.value(c[0])
        kw = c[2] if negated else c[1]
        low, high = (c[3], c[5]) if negated else (c[2], c[4])
        low = self.numeric(low, "BETWEEN")
        high = self.numeric(high, "BETWEEN")
        if self.stype(operand) in ("str", "bool"):
            raise self.err(f"BETWEEN needs a number, found {self.what(operand)}", self.p(operand))
        if (
            self.d.strict_literals
            and isinstance(low, ast.Literal)
            and isinstance(high, ast.Literal)
            and low.value > high.value
        ):
            raise self.err(f"BETWEEN {low.value} AND {high.value}: the low bound is greater than the high bound", self.p(low))
        return self.at(ast.Between(operand, low, high, negated), self.p(operand) if self.p(operand) is not None else kw.start_pos)

    def between(self, c):
        return self._between(c, False)

    def not_between(self, c):
        return self._between(c, True)

    def _in(self, c, negated: bool):
        operand = self.value(c[0])
        items_tree = c[4] if negated else c[3]
        if self.stype(operand) in ("bool",):
            raise self.err(f"IN needs a value to look up, found {self.what(operand)}", self.p(operand))
        return self.at(ast.In(operand, tuple(items_tree), negated), self.p(operand))

    def in_list(self, c):
        # `in_list: sum | in_list COMMA sum`: items accumulate left to right in one list
        if len(c) == 1:
            items, item = [], c[0]
        else:
            items, item = c[0], c[2]
        item = self.fin(item)
        if self.d.filtex_sql:  # any expression (RabbitMQ: `'London' IN (city, country)`)
            items.append(item)
            if len(items) > self.limits.max_in:
                raise LimitError(f"IN list has more than {self.limits.max_in} elements", self.text, self.p(item) + self.offset)
            return items
        if not isinstance(item, ast.Literal):
            raise self.err("IN lists take literals only", self.p(item))
        if item.type == "boolean" or (item.type != "string" and not self.d.numeric_in):
            kind = "string" if not self.d.numeric_in else "string or number"
            raise self.err(f"IN lists take {kind} literals, found {self.what(item)}", self.p(item))
        items.append(item)
        if len(items) > self.limits.max_in:
            raise LimitError(f"IN list has more than {self.limits.max_in} elements", self.text, self.p(item) + self.offset)
        return items

    def in_(self, c):
        return self._in(c, False)

    def not_in(self, c):
        return self._in(c, True)

    def _like(self, c, negated: bool):
        operand = self.value(c[0])
        kw = c[2] if negated else c[1]
        if not self.d.like:
            raise self.err(
                f"LIKE is not part of the {self.d.name} dialect; use CONTAINS, STARTSWITH or ENDSWITH", kw.start_pos
            )
        rest = c[3:] if negated else c[2:]
        pattern = self.fin(rest[0])
        if not (isinstance(pattern, ast.Literal) and pattern.type == "string"):
            raise self.err("LIKE needs a string literal pattern", self.p(pattern))
        escape = None
        if len(rest) > 1:
            esc = self.fin(rest[2])
            if not (isinstance(esc, ast.Literal) and esc.type == "string"):
                raise self.err("ESCAPE needs a string literal", self.p(esc))
            if len(esc.value) != 1:
                raise self.err(f"ESCAPE must be exactly one character, got '{esc.value}'", self.p(esc))
            escape = esc.value
        self.like_search += like_search_chars(
            sql_like_pattern(pattern.value, escape) if self.d.filtex_sql else pattern.value, escape
        )
        if self.like_search > self.limits.max_like_search:
            raise LimitError(
                f"LIKE patterns hold {self.like_search} characters in segments between two % that mix _ with "
                f"other characters; the limit is {self.limits.max_like_search} per selector",
                self.text, self.p(pattern) + self.offset,
            )
        if self.d.filtex_sql:
            _check_sql_pattern(self, pattern, escape)
            return self.at(ast.Like(operand, pattern.value, escape, negated), self.p(operand))
        if self.stype(operand) in ("num", "bool"):
            raise self.err(f"LIKE needs a string, found {self.what(operand)}", self.p(operand))
        return self.at(ast.Like(operand, pattern.value, escape, negated), self.p(operand))

    def like(self, c):
        return self._like(c, False)

    def not_like(self, c):
        return self._like(c, True)

    def _null_operand(self, node: Any) -> Any:
        operand = self.value(node)
        if self.d.filtex_sql and not isinstance(operand, ast.Ident):
            raise self.err("IS [NOT] NULL tests an identifier", self.p(operand))
        return operand

    def is_null(self, c):
        operand = self._null_operand(c[0])
        return self.at(ast.IsNull(operand, False), self.p(operand))

    def is_not_null(self, c):
        operand = self._null_operand(c[0])
        return self.at(ast.IsNull(operand, True), self.p(operand))

    def _strtest(self, c, negated: bool):
        operand = self.value(c[0])
        op = c[2] if negated else c[1]
        value = self.fin(c[3] if negated else c[2])
        if not (isinstance(value, ast.Literal) and value.type == "string"):
            raise self.err(f"{op.value.upper()} needs a string literal", self.p(value))
        if self.stype(operand) in ("num", "bool"):
            raise self.err(f"{op.value.upper()} needs a string, found {self.what(operand)}", self.p(operand))
        return self.at(ast.StringTest(op.value.upper(), operand, value.value, negated), self.p(operand))

    def strtest(self, c):
        return self._strtest(c, False)

    def not_strtest(self, c):
        return self._strtest(c, True)

    # ------------------------------------------------------------------ logic
    def not_(self, c):
        operand = self.cond(c[1])
        return self.at(ast.Unary("NOT", operand), c[0].start_pos)

    def logic(self, c):
        left, op, right = c
        op = op.type  # "AND" | "OR"
        right = self.cond(right)
        if isinstance(left, _Chain) and left.op == op:
            left.items.extend(ast.chain_items(op, right))
            return left
        left = self.cond(left)
        pos = self.p(left)
        return _Chain(op, ast.chain_items(op, left) + ast.chain_items(op, right), pos if pos is not None else 0)

    def empty(self, c):
        return None


def _check_sql_pattern(builder: "_Builder", pattern: ast.Literal, escape: str | None) -> None:
    """amqp-sql LIKE patterns (RabbitMQ): no control characters, no escape character at the end."""
    text = pattern.value
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise builder.err("a LIKE pattern cannot contain control characters", builder.p(pattern))
    i = 0
    while i < len(text):
        if text[i] == escape:
            if i + 1 == len(text):
                raise builder.err(f"the LIKE pattern ends with its escape character {escape!r}", builder.p(pattern))
            i += 1
        i += 1


def _nesting_depth(root: Any) -> int:
    """Depth of the tree where a same-operator AND/OR chain counts once (iterative)."""
    best = 0
    stack = [(root, 1, None)]
    while stack:
        node, depth, parent_op = stack.pop()
        if node is None:
            continue
        if isinstance(node, ast.Binary) and node.op in ast.LOGICAL_OPS and node.op == parent_op:
            depth -= 1  # continuation of the parent's chain
        best = max(best, depth)
        op = node.op if isinstance(node, ast.Binary) else None
        if isinstance(node, ast.Unary):
            stack.append((node.operand, depth + 1, None))
        elif isinstance(node, ast.Binary):
            stack.append((node.left, depth + 1, op))
            stack.append((node.right, depth + 1, op))
        elif isinstance(node, ast.Between):
            stack.extend(((node.operand, depth + 1, None), (node.low, depth + 1, None), (node.high, depth + 1, None)))
        elif isinstance(node, (ast.In, ast.Like, ast.IsNull, ast.StringTest)):
            stack.append((node.operand, depth + 1, None))
    return best


def prepare(dialect: "str | Dialect" = "jms") -> None:
    """Build the parse tables `dialect`'s selectors use now (lark's LALR analysis, about 0.1 s of
    CPU once per process), so that the first attach with a selector does not wait for it."""
    parse("TRUE", dialect)


def parse(text: str, dialect: "str | Dialect" = "jms", limits: Limits = DEFAULT_LIMITS) -> ast.Selector:
    """Parse and check a selector; raises SelectorError (or LimitError) with line and column."""
    d = get_dialect(dialect)
    if not isinstance(text, str):
        raise SelectorError(f"a selector is a string, not {type(text).__name__}")
    max_length = limits.max_length if d.max_length is None else min(limits.max_length, d.max_length)
    if len(text) > max_length:
        raise LimitError(f"selector is {len(text)} characters long; the limit is {max_length}", text, max_length)
    if "\x00" in text:
        raise SelectorError("selector contains a NUL character", text, text.index("\x00"))

    body, offset, convert, hyphenated = text, 0, False, False
    if d.prefixes:
        while True:
            if body.startswith(CONVERT_PREFIX) and not convert:
                convert, body, offset = True, body[len(CONVERT_PREFIX):], offset + len(CONVERT_PREFIX)
            elif body.startswith(HYPHEN_PREFIX) and not hyphenated:
                hyphenated, body, offset = True, body[len(HYPHEN_PREFIX):], offset + len(HYPHEN_PREFIX)
            else:
                break

    if d.tags:
        m = _TAGS_RE.fullmatch(body)
        if m and body.strip().upper() not in ("TRUE", "FALSE"):
            if m.group(1):
                return ast.Selector(ast.Tags(None), d.name, text=text)
            tags = tuple(dict.fromkeys(w.strip() for w in m.group(2).split("||")))
            return ast.Selector(ast.Tags(tags), d.name, text=text)

    if not body.strip():
        return ast.Selector(None, d.name, convert, hyphenated, text=text)

    if d.filtex_sql:
        grammar = _grammar_variant(True, False, False, False, True)
    else:
        grammar = _grammar_variant(d.quoted_identifiers, d.annotation_prefix, hyphenated, d.string_tests)
    builder = _Builder(d, text, offset, limits)
    try:
        if d.max_tokens is not None:
            count = len(grammar.tokens(body)) - 1
            if count > d.max_tokens:
                raise LimitError(f"selector has {count} tokens; the limit is {d.max_tokens}", text, None)
        expr = grammar.parse(body, builder)
    except _LexError as e:
        raise SelectorError(e.message, text, e.pos + offset) from None
    except _BadCharacter as e:
        raise _character_error(text, e.pos + offset, d) from None
    except _Unexpected as e:
        if d.filtex_sql and e.tok.value == "BETWEEN":
            raise SelectorError("amqp-sql has no BETWEEN: write x >= low AND x <= high", text, e.tok.start_pos + offset) from None
        raise _token_error(e.tok, e.expected, text, offset) from None
    if builder.overflow:
        pos = min(builder.overflow.values())
        raise SelectorError("integer 9223372036854775808 is out of range for a long", text, pos + offset)
    expr = builder.cond(expr) if expr is not None else None
    if expr is not None and len(body) > limits.max_depth:  # each level of nesting takes a character
        depth = _nesting_depth(expr)
        if depth > limits.max_depth:
            raise LimitError(f"selector nesting depth {depth} exceeds the limit of {limits.max_depth}", text, None)
    return ast.Selector(expr, d.name, convert, hyphenated, text=text)


def _character_error(text: str, pos: int, d: Dialect) -> SelectorError:
    ch = text[pos] if pos < len(text) else ""
    if ch == "'":
        return SelectorError("unterminated string literal (strings end with a single quote)", text, pos)
    if ch == '"' and d.filtex_sql:
        return SelectorError("unterminated string literal (it ends with a double quote)", text, pos)
    if ch == "[" and d.filtex_sql:
        return SelectorError("unterminated delimited identifier (it ends with ])", text, pos)
    if ch == '"':
        if d.quoted_identifiers:
            return SelectorError('unterminated quoted identifier (it ends with a double quote)', text, pos)
        return SelectorError("double quotes are not allowed: string literals use single quotes ('...')", text, pos)
    return SelectorError(f"unexpected character {ch!r}", text, pos)


def _token_error(tok: Tok, expected: set, text: str, offset: int) -> SelectorError:
    if tok.type == "$END":
        return SelectorError("unexpected end of the selector", text, len(text))
    names = sorted({_TOKEN_NAMES.get(x, x.upper() if x.isalpha() else x) for x in expected})
    hint = "; expected " + ", ".join(names) if names and len(names) <= 6 else ""
    return SelectorError(f"unexpected {_describe_token(tok)}{hint}", text, tok.start_pos + offset)
