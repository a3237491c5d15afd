"""Selector dialects: small frozen sets of flags, passed explicitly (never global state).

Each flag is one row of the decision table in docs/selectors.md.  The parser reads the syntax flags,
the evaluators read the semantic ones; nothing else differs between dialects.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SelectorError
from .view import ARTEMIS_HEADERS, JMS_HEADERS


@dataclass(frozen=True)
class Dialect:
    name: str
    headers: frozenset  # identifiers read from the message's header/properties instead of app properties
    # semantics
    mismatch: str = "false"  # non-like operands: "false" (JMS) | "not" (Artemis: negated forms are NOT of
    #                          the positive one) | "error" (RocketMQ: evaluation error, not delivered)
    null_equality: str = "unknown"  # "unknown" (JMS) | "artemis" (`=`: NULL left UNKNOWN, NULL right
    #                                  alone FALSE, both NULL TRUE; `<>` is NOT `=`)
    string_coercion: bool = False  # RocketMQ: a string compares as the other side's number type, two
    #                                strings order as doubles, a string against a boolean is Boolean.valueOf
    # syntax
    quoted_identifiers: bool = True  # "my prop" (Artemis, Qpid JMS, Broker-J, qpid-cpp)
    annotation_prefix: bool = False  # Artemis m.name
    arithmetic: bool = True  # binary + - * / (RocketMQ's grammar has only the unary signs)
    prefixes: bool = False  # Artemis convert_string_expressions: / hyphenated_props:
    like: bool = True
    string_tests: bool = False  # RocketMQ CONTAINS / STARTSWITH / ENDSWITH
    tags: bool = False  # RocketMQ tag expressions
    numeric_in: bool = False  # IN accepts numbers (RocketMQ)
    strict_literals: bool = False  # RocketMQ: refuse string literals in < <= > >= BETWEEN, low > high
    # amqp-sql (OASIS filtex §6 as RabbitMQ 4.2 implements it): its own lexer (upper-case keywords,
    # "..." strings, [..] identifiers, 0x.. binaries, header./properties. fields, != and %, UTC()),
    # no BETWEEN, no static typing (a mismatch is decided when evaluated) and Erlang-term comparisons
    filtex_sql: bool = False
    max_length: int | None = None  # characters of selector text (filtex §7.1: 4,096 for amqp-sql)
    max_tokens: int | None = None  # tokens of selector text (filtex §7.1: 200 for amqp-sql)

    @property
    def or_chain_to_set(self) -> bool:
        """`x = 'a' OR x = 'b'` may become a set lookup only where it means the same as IN."""
        return self.null_equality == "unknown" and self.mismatch == "false" and not self.filtex_sql


JMS = Dialect(name="jms", headers=JMS_HEADERS)
ARTEMIS = Dialect(
    name="artemis",
    headers=JMS_HEADERS | ARTEMIS_HEADERS,
    mismatch="not",
    null_equality="artemis",
    annotation_prefix=True,
    prefixes=True,
)
ROCKETMQ = Dialect(
    name="rocketmq",
    headers=frozenset({"TAGS"}),
    mismatch="error",
    string_coercion=True,
    quoted_identifiers=False,
    arithmetic=False,
    like=False,
    string_tests=True,
    tags=True,
    numeric_in=True,
    strict_literals=True,
)

AMQP_SQL = Dialect(
    name="amqp-sql",
    headers=frozenset(),
    quoted_identifiers=False,
    numeric_in=True,
    filtex_sql=True,
    max_length=4096,
    max_tokens=200,
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (JMS, ARTEMIS, ROCKETMQ, AMQP_SQL)}


def get_dialect(dialect: "str | Dialect") -> Dialect:
    if isinstance(dialect, Dialect):
        return dialect
    try:
        return DIALECTS[dialect]
    except KeyError:
        raise SelectorError(
            f"unknown selector dialect {dialect!r} (choose one of {', '.join(sorted(DIALECTS))})"
        ) from None
