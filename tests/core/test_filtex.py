"""Property filter expressions (filtex): conformance rows of data/filtex.json on the compiled filter-set,
with the symbolic and the numeric descriptor, and nested in and/or/not filters."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker_filter.amqp.types import Described, symbol, ulong
from broker_filter.filters import FilterError, compile_filter_set
from broker_filter.amqp.message import Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coretables import FILTEX_DESCRIPTORS as DESCRIPTORS  # noqa: E402
from coretables import FILTEX_ROWS as ROWS  # noqa: E402
from coretables import filtex_reference_map as reference_map  # noqa: E402


def cases():
    for row in ROWS:
        for descriptor in DESCRIPTORS[row["filter"]]:
            yield pytest.param(row, descriptor, id=f"{row['name']}[{descriptor!r}]")


@pytest.mark.parametrize("row, descriptor", list(cases()))
def test_row(row, descriptor):
    filters = {symbol("f"): Described(descriptor, reference_map(row))}
    if "error" in row:
        with pytest.raises(FilterError) as e:
            compile_filter_set(filters)
        assert row["error"] in e.value.describe()
        assert "Error" not in e.value.describe()  # what and where, never an exception's name
        return
    fs = compile_filter_set(filters)
    (entry,) = fs.entries
    assert entry.kind == row["filter"] and entry.key == symbol("f") and entry.value is filters[symbol("f")]
    for message_json, want in row["checks"]:
        got = fs.evaluate(Message.from_json(message_json))
        assert got is {"T": True, "F": False}[want], f"{row['name']}: {message_json} -> {got}, expected {want}"


def test_filtex_inside_logical_filters():
    props = Described(symbol("amqp:properties-filter"), {symbol("subject"): "&p:eu."})
    app = Described(ulong(0x174), {"total": 100})
    either = Described(symbol("apache.org:or-filter:list"), [props, app])
    neither = Described(symbol("apache.org:not-filter:list"), [either])
    fs_or, fs_not = compile_filter_set({symbol("o"): either}), compile_filter_set({symbol("n"): neither})
    for subject, total, want in (("eu.x", 1, True), ("us.x", 100, True), ("us.x", 5, False)):
        m = Message.from_json({"properties": {"subject": subject}, "application_properties": {"total": total}})
        assert fs_or.evaluate(m) is want
        assert fs_not.evaluate(m) is (not want)


def test_filtex_beside_a_selector_on_one_link():
    fs = compile_filter_set({
        symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), "qty > 2"),
        symbol("props"): Described(symbol("amqp:properties-filter"), {symbol("subject"): "orders"}),
    })
    assert [e.kind for e in fs.entries] == ["selector", "properties"]
    ok = Message.from_json({"properties": {"subject": "orders"}, "application_properties": {"qty": 3}})
    assert fs.evaluate(ok) is True
    assert fs.evaluate(Message.from_json({"properties": {"subject": "orders"}, "application_properties": {"qty": 1}})) is False
    assert fs.evaluate(Message.from_json({"properties": {"subject": "other"}, "application_properties": {"qty": 3}})) is False
