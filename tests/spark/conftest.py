"""Spark test helpers (the shared `spark` session fixture is in tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def evaluate_on_spark(spark):
    """evaluate(selectors: list[ast.Selector], messages: list[Message]) -> results[selector][message]."""
    from broker_filter.archive.parquet import message_row, rows_table
    from broker_filter.spark.compile import CompiledSelector, apply_all, compile_selector
    from broker_filter.spark.session import table_frame

    def evaluate(selectors, messages, batch=60):
        """Selectors: ASTs, or already compiled (CompiledSelector) filters."""
        frame = table_frame(spark, rows_table([message_row(m, seq=i) for i, m in enumerate(messages)])).cache()
        results = [None] * len(selectors)
        for start in range(0, len(selectors), batch):
            chunk = selectors[start : start + batch]
            context: dict = {}
            compiled = {
                f"c{i}": s if isinstance(s, CompiledSelector) else compile_selector(s, context)
                for i, s in enumerate(chunk)
            }
            rows = sorted(apply_all(frame, compiled).select("seq", *compiled).collect(), key=lambda r: r["seq"])
            for i in range(len(chunk)):
                results[start + i] = [r[f"c{i}"] for r in rows]
        frame.unpersist()
        return results

    return evaluate
