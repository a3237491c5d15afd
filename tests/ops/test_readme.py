"""README.md carries the configuration and metrics reference tables exactly as the code generates them."""

from __future__ import annotations

import re
from pathlib import Path

from broker_filter import config, metrics

README = Path(__file__).resolve().parents[2] / "README.md"


def generated(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- {name}: [^\n]*-->\n(.*?)<!-- end {name} -->", text, re.S)
    assert match, f"README.md lacks the {name} section"
    return match.group(1)


def test_configuration_table_is_current():
    assert generated("config-reference") == config.reference_table(), (
        "regenerate with `python -m broker_filter.config`"
    )


def test_metrics_table_is_current():
    assert generated("metrics-reference") == metrics.reference_table(), (
        "regenerate with `python -m broker_filter.metrics`"
    )


def test_tables_cover_every_setting_and_metric():
    table = generated("config-reference")
    for key, _ in config._leaves():
        assert f"| `{key}` |" in table
    assert "broker_filter_messages_filtered_out_total" in generated("metrics-reference")
