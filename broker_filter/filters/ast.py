"""The selector AST shared by every backend (native evaluator, reference interpreter, renderer, Spark).

Identifiers are resolved by the parser (per dialect) into an `Ident` whose `kind` says where the value
lives, so backends need no dialect knowledge for lookups:

    kind="property"    key = application-properties key (str)
    kind="annotation"  key = message-annotations key (str, compared as a symbol)   (Artemis `m.`)
    kind="header"      key = a canonical header name from `view.HEADERS` (JMSPriority, AMQSize, TAGS, ...)
    kind="field"       key = an AMQP header/properties field (amqp-sql `header.priority`, `p.subject`):
                       "priority" or a properties attribute name (message_id, creation_time, ...)

AND / OR chains are built as balanced trees (a 4,000-term OR chain is 12 levels deep, not 4,000), so
recursive backends stay shallow; evaluation order (left to right) is unchanged.

Literals carry their JMS type: "string", "boolean", "int" (fits 32 bits, no L suffix), "long", "double";
amqp-sql adds "binary" (bytes); its integers are "long" of any size, as Erlang's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any
    type: str  # string | boolean | int | long | double | binary


@dataclass(frozen=True, slots=True)
class Ident:
    name: str  # as written (without quotes / prefixes), for rendering
    kind: str  # property | annotation | header
    key: str


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" | "+" | "NOT"
    operand: "Node"


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / = <> < <= > >= AND OR
    left: "Node"
    right: "Node"


@dataclass(frozen=True, slots=True)
class Between:
    operand: "Node"
    low: "Node"
    high: "Node"
    negated: bool = False


@dataclass(frozen=True, slots=True)
class In:
    operand: "Node"
    values: tuple  # of Literal (strings in JMS; numbers allowed in the RocketMQ dialect; any expression in amqp-sql)
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Like:
    operand: "Node"
    pattern: str
    escape: str | None = None
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: "Node"
    negated: bool = False


@dataclass(frozen=True, slots=True)
class StringTest:
    """RocketMQ CONTAINS / STARTSWITH / ENDSWITH."""

    op: str  # CONTAINS | STARTSWITH | ENDSWITH
    operand: "Node"
    value: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """An amqp-sql function call: `UTC()` (the current time in milliseconds since the epoch)."""

    name: str


@dataclass(frozen=True, slots=True)
class Tags:
    """RocketMQ tag expression: `TagA || TagB` (tags) or `*` (tags is None)."""

    tags: tuple | None


Node = Union[Literal, Ident, Unary, Binary, Between, In, Like, IsNull, StringTest, Call, Tags]

ARITHMETIC_OPS = frozenset({"+", "-", "*", "/", "%"})
COMPARISON_OPS = frozenset({"=", "<>", "<", "<=", ">", ">="})
LOGICAL_OPS = frozenset({"AND", "OR"})


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed selector.  `expr` is None for the empty selector (selects everything)."""

    expr: Node | None
    dialect: str = "jms"
    convert_strings: bool = False  # Artemis `convert_string_expressions:` prefix
    hyphenated: bool = False  # Artemis `hyphenated_props:` prefix
    text: str = field(default="", compare=False)  # the source text; not part of identity


def balanced(op: str, items: list) -> Any:
    """An AND / OR chain over `items` as a balanced tree (depth log2 n, order kept)."""
    if len(items) == 1:
        return items[0]
    mid = len(items) // 2
    return Binary(op, balanced(op, items[:mid]), balanced(op, items[mid:]))


def chain_items(op: str, node: Any) -> list:
    """The operands of the `op` chain rooted at `node`, left to right (iterative)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Binary) and n.op == op:
            stack.append(n.right)
            stack.append(n.left)
        else:
            out.append(n)
    return out


def walk(node: Any):
    """Every node below (and including) `node`, depth first."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None:
            continue
        yield n
        if isinstance(n, Unary):
            stack.append(n.operand)
        elif isinstance(n, Binary):
            stack.extend((n.right, n.left))
        elif isinstance(n, Between):
            stack.extend((n.high, n.low, n.operand))
        elif isinstance(n, In):
            stack.extend(n.values)
            stack.append(n.operand)
        elif isinstance(n, (Like, IsNull, StringTest)):
            stack.append(n.operand)
