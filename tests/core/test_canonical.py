"""The canonical form (render_selector) against data/canonical.toml, and its round trip."""

from __future__ import annotations

import pytest

from broker_filter.filters import parse_selector, render_selector
from coretables import load

ROWS = load("canonical.toml")["case"]


def _param(row: dict):
    marks = [pytest.mark.xfail(strict=True, reason=row["xfail"])] if "xfail" in row else []
    return pytest.param(row, id=f"{row.get('d', 'jms')}:{row['s']!r}", marks=marks)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_canonical_form(row: dict) -> None:
    dialect = row.get("d", "jms")
    tree = parse_selector(row["s"], dialect=dialect)
    canonical = render_selector(tree)
    if "canonical" in row:
        assert canonical == row["canonical"]
    again = parse_selector(canonical, dialect=dialect)
    assert again == tree, canonical
    assert render_selector(again) == canonical
