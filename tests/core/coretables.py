"""Loading the conformance tables in tests/core/data into pytest parameters.

Outcome codes used by every table: T TRUE, F FALSE, U UNKNOWN, X not delivered because of an
evaluation error (rocketmq: the whole selector is FALSE), E refused at compile time.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_filter.amqp.message import Message

DATA = Path(__file__).parent / "data"
DIALECTS = ("jms", "artemis", "rocketmq")
OUTCOMES = {"T": True, "F": False, "U": None}


def load(name: str) -> dict:
    with open(DATA / name, "rb") as f:
        return tomllib.load(f)


@dataclass(frozen=True)
class SelectorCase:
    source: str  # file:row
    selector: str
    dialect: str
    outcome: str  # T F U X E
    message_json: Any = field(default_factory=dict)
    size: int | None = None
    at: tuple[int, int] | None = None
    xfail: str | None = None

    def message(self) -> Message:
        m = Message.from_json(self.message_json)
        if self.size is not None:
            m.encoded_size = self.size
        return m

    @property
    def id(self) -> str:
        text = self.selector if len(self.selector) <= 60 else self.selector[:57] + "..."
        return f"{self.source}:{self.dialect}:{text!r}"


def _codes(x: str, dialects: list[str], where: str) -> dict[str, str]:
    if len(x) == 1:
        return {d: x for d in dialects}
    if len(x) != len(dialects):
        raise ValueError(f"{where}: outcome {x!r} does not fit dialects {dialects}")
    return dict(zip(dialects, x))


def selector_cases() -> list[SelectorCase]:
    """Every (row, dialect) of selectors.toml and type_matrix.toml."""
    cases: list[SelectorCase] = []
    table = load("selectors.toml")
    messages = table.get("messages", {})
    for i, row in enumerate(table["case"], 1):
        where = f"selectors.toml#{i}"
        if "mj" in row:
            message = json.loads(row["mj"])
        else:
            message = row.get("m", {})
            if isinstance(message, str):
                message = messages[message]
        dialects = row.get("d", list(DIALECTS))
        xfail = row.get("xfail")
        at = row.get("at")  # [line, column], or { dialect = [line, column] }
        for dialect, code in _codes(row["x"], dialects, where).items():
            position = at.get(dialect) if isinstance(at, dict) else at
            cases.append(
                SelectorCase(
                    where,
                    row["s"],
                    dialect,
                    code,
                    message,
                    row.get("size"),
                    tuple(position) if position else None,
                    xfail.get(dialect) if isinstance(xfail, dict) else xfail,
                )
            )
    matrix = load("type_matrix.toml")
    for row in matrix["row"]:
        if row.get("null"):
            message = {"application_properties": {"v": None}}
        elif "value" in row:
            message = {"application_properties": {"v": row["value"]}}
        else:
            message = {}
        xfails = row.get("xfail", {})
        for selector, codes in zip(matrix["selectors"], row["expect"]):
            for dialect, code in zip(DIALECTS, codes):
                if code == "-":
                    continue
                cases.append(
                    SelectorCase(
                        f"type_matrix.toml:{row['name']}", selector, dialect, code, message,
                        xfail=xfails.get(f"{selector} [{dialect}]"),
                    )
                )
    return cases


def params(cases: list, *, honour_xfail: bool | str = True) -> list:
    """pytest params; honour_xfail="errors" marks only E rows (the parser is shared by both sides)."""
    out = []
    for c in cases:
        honour = honour_xfail is True or (honour_xfail == "errors" and c.outcome == "E")
        marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if honour and c.xfail else []
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@dataclass(frozen=True)
class SqlCase:
    """A row of amqp_sql.json: outcome T F U, N (not TRUE: RabbitMQ's test says it does not match) or E."""

    source: str
    selector: str
    outcome: str
    message_json: Any = field(default_factory=dict)
    error: str | None = None
    at: tuple[int, int] | None = None

    def message(self) -> Message:
        return Message.from_json(self.message_json)

    def accepts(self, got: Any) -> bool:
        return got is not True if self.outcome == "N" else got is OUTCOMES[self.outcome]

    @property
    def id(self) -> str:
        text = self.selector if len(self.selector) <= 60 else self.selector[:57] + "..."
        return f"{self.source}:{text!r}"


def sql_cases() -> list[SqlCase]:
    """Every row of amqp_sql.json."""
    table = json.loads((DATA / "amqp_sql.json").read_text(encoding="utf-8"))
    out = []
    for i, row in enumerate(table["rows"], 1):
        message = table["messages"][row["m"]] if "m" in row else {}
        at = row.get("at")
        out.append(SqlCase(f"amqp_sql.json#{i} ({row['peer']})", row["s"], row["x"], message, row.get("error"), tuple(at) if at else None))
    return out


# OASIS property filters (data/filtex.json): rows, both descriptor forms, the reference map of a row.
FILTEX_ROWS = json.loads((DATA / "filtex.json").read_text())["rows"]


def _filtex_descriptors() -> dict:
    from broker_filter.amqp.types import symbol, ulong

    return {
        "properties": (symbol("amqp:properties-filter"), ulong(0x173)),
        "application-properties": (symbol("amqp:application-properties-filter"), ulong(0x174)),
    }


FILTEX_DESCRIPTORS = _filtex_descriptors()


def filtex_reference_map(row: dict) -> dict:
    """A row's reference values as a filter value: typed JSON read, properties keys as symbols."""
    from broker_filter.amqp.types import symbol
    from broker_filter.amqp.message import value_from_json

    symbol_keys = row["filter"] == "properties" or row.get("symbol_keys", False)
    return {(symbol(k) if symbol_keys else k): value_from_json(v) for k, v in row["ref"].items()}
