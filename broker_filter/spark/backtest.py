"""Backtest: how named filters would have selected the messages of an archive.

One pass over the archive: every filter becomes a boolean column (compiled, no Python UDF), then one
aggregation by (address, hour) counts, per filter, the messages it selects (TRUE) and those it leaves
UNKNOWN; the small aggregate is summed on the driver into totals, per-address and per-hour counts.
Matching messages can also be written out as archives (one directory per filter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .compile import CompiledSelector, apply_all


@dataclass
class FilterReport:
    matched: int = 0
    unknown: int = 0
    total: int = 0
    by_address: dict[str, int] = field(default_factory=dict)
    by_hour: dict[str, int] = field(default_factory=dict)
    total_by_hour: dict[str, int] = field(default_factory=dict)  # every message, matched or not

    @property
    def selectivity(self) -> float:
        return self.matched / self.total if self.total else 0.0

    def to_json(self) -> dict:
        return {
            "matched": self.matched,
            "total": self.total,
            "unknown": self.unknown,
            "selectivity": self.selectivity,
            "by_address": dict(sorted(self.by_address.items())),
            "by_hour": dict(sorted(self.by_hour.items())),
            "total_by_hour": dict(sorted(self.total_by_hour.items())),
        }


def run_backtest(frame: Any, filters: dict[str, CompiledSelector], output: str | None = None) -> dict[str, FilterReport]:
    """Counts per filter over `frame` (archive rows); with `output`, matching rows go to output/<name>/."""
    columns = {f"__bt{i}": c for i, c in enumerate(filters.values())}
    names = dict(zip(columns, filters))
    evaluated = apply_all(frame, columns)
    if output is not None:
        evaluated = evaluated.cache()
    aggregates = ["count(*) AS `__total`"]
    for col in columns:
        aggregates.append(f"count_if(`{col}`) AS `{col}_m`")
        aggregates.append(f"count_if(`{col}` IS NULL) AS `{col}_u`")
    grouped = (
        evaluated.selectExpr("coalesce(address, '') AS `__address`", "date_trunc('HOUR', arrival_time) AS `__hour`", *[f"`{c}`" for c in columns])
        .groupBy("__address", "__hour")
        .agg(*[_expr(a) for a in aggregates])
        .collect()
    )
    reports = {name: FilterReport() for name in filters}
    for row in grouped:
        hour = row["__hour"].strftime("%Y-%m-%dT%H:00:00Z") if row["__hour"] is not None else ""
        for col, name in names.items():
            r = reports[name]
            matched = row[f"{col}_m"]
            r.total += row["__total"]
            r.matched += matched
            r.unknown += row[f"{col}_u"]
            r.total_by_hour[hour] = r.total_by_hour.get(hour, 0) + row["__total"]
            if matched:
                r.by_address[row["__address"]] = r.by_address.get(row["__address"], 0) + matched
                r.by_hour[hour] = r.by_hour.get(hour, 0) + matched
    if output is not None:
        original = [f"`{c}`" for c in frame.columns]
        for col, name in names.items():
            evaluated.where(f"`{col}`").selectExpr(*original).write.mode("overwrite").parquet(
                f"{output.rstrip('/')}/{safe_name(name)}"
            )
        evaluated.unpersist()
    return reports


def safe_name(name: str) -> str:
    """A filter name as a directory name."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "filter"
    return cleaned[:100]


def _expr(text: str) -> Any:
    from pyspark.sql import functions as F

    return F.expr(text)
