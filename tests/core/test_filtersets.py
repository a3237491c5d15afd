"""compile_filter_set conformance: data/filtersets.json (descriptor forms, keys, nesting, ignored
entries, no-local), data/topic.toml (RabbitMQ topic semantics) and data/headers.json (headers
binding), each in the proton-decoded form and where it makes sense in the JSON form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker_filter.amqp.types import Described, symbol, ulong
from broker_filter.filters import MATCH_ALL, FilterEntry, FilterError, FilterSet, FilterVisitor, ORIGIN_ANNOTATION, compile_filter_set
from broker_filter.amqp.message import Message, value_from_json
from coretables import DATA, load

TOPIC = "apache.org:legacy-amqp-topic-binding:string"
HEADERS = "apache.org:legacy-amqp-headers-binding:map"
OUTCOMES = {"T": True, "F": False, "U": None}


def descriptor(d: Any) -> Any:
    if isinstance(d, int):
        return ulong(d)
    if d.startswith("0x"):
        return ulong(int(d, 16))
    return symbol(d)


def proton_value(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"$d"}:
            return Described(descriptor(v["$d"][0]), proton_value(v["$d"][1]))
        if set(v) == {"$sym"}:
            return symbol(v["$sym"])
        if set(v) == {"$ulong"}:
            return ulong(v["$ulong"])
        return {k: proton_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [proton_value(x) for x in v]
    return v


def filter_set(row: dict) -> Any:
    if row["form"] == "json":
        return row["filters"]
    return {symbol(k): Described(descriptor(d), proton_value(v)) for k, d, v in row["filters"]}


ROWS = json.loads((DATA / "filtersets.json").read_text())["rows"]


@pytest.mark.parametrize("row", [pytest.param(r, id=r["name"]) for r in ROWS])
def test_filter_set(row: dict) -> None:
    obj = filter_set(row)
    if "error" in row:
        with pytest.raises(FilterError) as info:
            compile_filter_set(obj)
        assert info.value.key == row["error"], info.value.describe()
        assert info.value.condition == "amqp:invalid-field"
        return
    fs = compile_filter_set(obj)
    assert isinstance(fs, FilterSet)
    assert {e.key: e.kind for e in fs.entries} == row["applied"]
    assert set(fs.applied) == set(row["applied"])
    for key in fs.applied:
        assert fs.applied[key] == obj[key], "the echo carries the client's value unchanged"
        assert type(fs.applied[key]) is type(obj[key])
    assert sorted(i.key for i in fs.ignored) == sorted(row["ignored"])
    assert all(i.reason for i in fs.ignored)
    assert not set(fs.applied) & {i.key for i in fs.ignored}
    if "no_local" in row:
        assert fs.no_local is row["no_local"]
    for message_json, receiver, outcome in row["checks"]:
        message = Message.from_json(message_json)
        if outcome in OUTCOMES:
            assert fs.evaluate(message, receiver) is OUTCOMES[outcome], (message_json, receiver)
        assert fs.matches(message, receiver) is (outcome in ("T", "+")), (message_json, receiver)


def test_descriptors_are_matched_in_every_form_to_the_same_kind() -> None:
    base = 0x0000468C00000000
    names = {
        0: ["apache.org:legacy-amqp-direct-binding:string"],
        1: ["apache.org:legacy-amqp-topic-binding:string"],
        2: ["apache.org:legacy-amqp-headers-binding:map"],
        3: ["apache.org:no-local-filter:list", "apache.org:jms-no-local-filter:list"],
        4: ["apache.org:selector-filter:string", "apache.org:jms-selector-filter:string"],
        6: ["apache.org:and-filter:list"],
        7: ["apache.org:not-filter:list"],
    }
    kinds = {0: "direct", 1: "topic", 2: "headers", 3: "no-local", 4: "selector", 6: "and", 7: "not"}
    values = {0: "x", 1: "x.#", 2: {"a": 1}, 3: [], 4: "a = 1", 6: [Described(symbol(names[4][0]), "a = 1")],
              7: [Described(symbol(names[4][0]), "a = 1")]}
    for code, symbols in names.items():
        forms = [symbol(s) for s in symbols] + [ulong(base + code)]
        for form in forms:
            fs = compile_filter_set({symbol("k"): Described(form, values[code])})
            assert [e.kind for e in fs.entries] == [kinds[code]], form
        json_value = {"a": 1} if code == 2 else ([{"descriptor": names[4][0], "value": "a = 1"}] if code in (6, 7) else values[code])
        for form in symbols + [f"0x0000468C:0x{code:08X}", f"0x0000468c:0x{code:08x}", base + code]:
            fs = compile_filter_set({"k": {"descriptor": form, "value": json_value}})
            assert [e.kind for e in fs.entries] == [kinds[code]], form


def test_filter_set_dialect_applies_to_its_selectors() -> None:
    obj = {symbol("s"): Described(symbol("apache.org:selector-filter:string"), "a <> 'x'")}
    m = Message.from_json({"application_properties": {"a": 1}})
    assert compile_filter_set(obj).evaluate(m) is False
    assert compile_filter_set(obj, dialect="jms").evaluate(m) is False
    assert compile_filter_set(obj, dialect="artemis").evaluate(m) is True


def test_entries_carry_text_and_subset_keeps_the_rest() -> None:
    obj = {
        symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), "a = 1"),
        symbol("t"): Described(ulong(0x0000468C00000001), "news.#"),
        symbol("no-local"): Described(symbol("apache.org:no-local-filter:list"), "NoLocalFilter{}"),
    }
    fs = compile_filter_set(obj)
    by_key = {e.key: e for e in fs.entries}
    assert by_key["jms-selector"].text == "a = 1"
    assert by_key["t"].text == "news.#"
    assert by_key["jms-selector"].descriptor == "apache.org:selector-filter:string"
    assert by_key["jms-selector"].value == obj[symbol("jms-selector")]
    assert fs.reads >= {"application_properties", "properties"}
    local = fs.subset(lambda e: e.kind != "selector")
    assert {e.key for e in local.entries} == {"t", "no-local"}
    assert local.no_local
    m = Message.from_json({"properties": {"subject": "news.uk"}, "application_properties": {"a": 2}})
    assert fs.matches(m) is False and local.matches(m) is True
    assert ORIGIN_ANNOTATION == "x-opt-broker-filter-origin"


class Outline(FilterVisitor):
    """Writes a filter tree out as text: the structure a backend walks."""

    def visit_selector(self, node):
        return f"selector[{node.filter.ast.text}]"

    def visit_sql(self, node):
        return f"sql[{node.filter.ast.text}]"

    def visit_topic(self, node):
        return f"topic[{node.value}]"

    def visit_no_local(self, node):
        return "no-local"

    def visit_and(self, node, parts):
        return "and(" + ", ".join(parts) + ")"

    def visit_or(self, node, parts):
        return "or(" + ", ".join(parts) + ")"

    def visit_not(self, node, parts):
        return f"not({parts[0]})"


def test_walk_gives_a_visitor_each_entrys_tree() -> None:
    def d(name: str, value: Any) -> dict:
        return {"descriptor": name, "value": value}

    fs = compile_filter_set({
        "n": d("apache.org:no-local-filter:list", []),
        "x": d("apache.org:or-filter:list", [
            d("apache.org:selector-filter:string", "a > 1"),
            d("apache.org:not-filter:list", [d("amqp:sql-filter", "p.subject = 'eu'")]),
            d("apache.org:and-filter:list", [d(TOPIC, "orders.*"), d("apache.org:selector-filter:string", "b = 2")]),
        ]),
    })
    assert fs.walk(Outline()) == [
        "no-local", "or(selector[a > 1], not(sql[p.subject = 'eu']), and(topic[orders.*], selector[b = 2]))"]
    headers = compile_filter_set({"h": d(HEADERS, {"x-match": "any", "k": 1})})
    with pytest.raises(NotImplementedError, match="Outline: no form for the filter kind 'headers'"):
        headers.walk(Outline())
    handmade = FilterSet((FilterEntry("k", "topic", TOPIC, "a", MATCH_ALL),))  # made without compile_filter_set
    with pytest.raises(ValueError, match=r"entries \['k'\] have no filter tree"):
        handmade.walk(Outline())


def test_deep_nesting_is_refused_cleanly() -> None:
    inner: Any = Described(symbol("apache.org:selector-filter:string"), "a = 1")
    for _ in range(5000):
        inner = Described(symbol("apache.org:not-filter:list"), [inner])
    with pytest.raises(FilterError) as info:
        compile_filter_set({symbol("deep"): inner})
    assert info.value.key == "deep"


def test_moderate_nesting_is_accepted() -> None:
    inner: Any = Described(symbol("apache.org:selector-filter:string"), "a = 1")
    for _ in range(10):
        inner = Described(symbol("apache.org:not-filter:list"), [inner])
    fs = compile_filter_set({symbol("n"): inner})
    assert fs.matches(Message.from_json({"application_properties": {"a": 1}})) is True  # ten NOTs


# ------------------------------------------------------------------ topic binding
_topic = load("topic.toml")


@pytest.mark.parametrize("pattern,subject,expected", [pytest.param(*r, id=f"{r[0]!r}~{r[1]!r}") for r in _topic["rows"]])
def test_topic(pattern: str, subject: str, expected: bool) -> None:
    message = Message.from_json({"properties": {"subject": subject}})
    proton_form = compile_filter_set({symbol("t"): Described(symbol(TOPIC), pattern)})
    json_form = compile_filter_set({"t": {"descriptor": "0x0000468C:0x00000001", "value": pattern}})
    assert proton_form.matches(message) is expected
    assert json_form.matches(message) is expected


@pytest.mark.parametrize("pattern,expected", [pytest.param(*r, id=repr(r[0])) for r in _topic["no_subject"]])
def test_topic_without_subject(pattern: str, expected: bool) -> None:
    fs = compile_filter_set({symbol("t"): Described(symbol(TOPIC), pattern)})
    assert fs.matches(Message.from_json({})) is expected
    assert fs.matches(Message.from_json({"properties": {"to": "x"}})) is expected


# ------------------------------------------------------------------ headers binding
_headers = json.loads((DATA / "headers.json").read_text())["rows"]


def _headers_id(row: dict) -> str:
    return f"{json.dumps(row['binding'], sort_keys=True)}~{json.dumps(row['properties'], sort_keys=True)}"


@pytest.mark.parametrize("row", [pytest.param(r, id=_headers_id(r)) for r in _headers])
def test_headers(row: dict) -> None:
    if "message" in row:
        message_json = dict(row["message"])
    else:
        message_json = {}
    if row["properties"] is not None:
        message_json["application_properties"] = row["properties"]
    message = Message.from_json(message_json)
    binding = value_from_json(row["binding"])
    if row.get("error"):
        with pytest.raises(FilterError) as info:
            compile_filter_set({symbol("h"): Described(symbol(HEADERS), binding)})
        assert info.value.key == "h" and "match" in info.value.message.lower()
        return
    fs = compile_filter_set({symbol("h"): Described(symbol(HEADERS), binding)})
    assert [e.kind for e in fs.entries] == ["headers"]
    assert fs.matches(message) is row["match"]
