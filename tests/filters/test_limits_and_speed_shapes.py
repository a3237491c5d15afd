"""Limits answer with clear SelectorErrors (never RecursionError or a hang); long OR chains, deep
nesting and big selectors still evaluate exactly; the LIKE matcher agrees with a regex oracle."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_filter.filters import LimitError, SelectorError, compile_filter_set, compile_selector
from broker_filter.filters.parser import Limits
from broker_filter.filters.runtime import like_matcher
from broker_filter.amqp.message import Message


def msg(**ap):
    return Message(application_properties=ap)


def test_selector_length_limit():
    with pytest.raises(LimitError, match="limit is 65536"):
        compile_selector("a = 1 OR " * 8000 + "a = 2")
    assert compile_selector("a = 'x'", limits=Limits(max_length=7)).matches(msg(a="x"))
    with pytest.raises(LimitError):
        compile_selector("a = 'xy'", limits=Limits(max_length=7))


def test_nesting_depth_limit_counts_structure_not_chain_length():
    with pytest.raises(LimitError, match="nesting depth"):
        compile_selector("NOT " * 250 + "a = 1")
    alternating = "a = 1"
    for i in range(300):
        alternating = f"({alternating} {'AND' if i % 2 else 'OR'} b{i} = 1)"
    with pytest.raises(LimitError, match="nesting depth"):
        compile_selector(alternating)
    same_operator = "(" * 300 + "a = 1" + " AND b = 1)" * 300  # one chain: flat, not deep
    assert compile_selector(same_operator).matches(msg(a=1, b=1))
    assert compile_selector("NOT " * 150 + "a = 1").evaluate(msg(a=1)) is True


def test_very_deep_parentheses_are_fine_when_they_add_no_structure():
    f = compile_selector("(" * 5000 + "a = 1" + ")" * 5000)
    assert f.matches(msg(a=1))


def test_in_list_size_limit():
    items = ", ".join(f"'v{i}'" for i in range(30))
    with pytest.raises(LimitError, match="more than 20"):
        compile_selector(f"a IN ({items})", limits=Limits(max_in=20))


def test_filter_set_nesting_limit():
    inner = {"descriptor": "apache.org:selector-filter:string", "value": "a = 1"}
    for _ in range(40):
        inner = {"descriptor": "apache.org:not-filter:list", "value": [inner]}
    with pytest.raises(LimitError) as info:
        compile_filter_set({"k": inner})
    assert info.value.key == "k"


def test_long_or_chain_over_one_identifier():
    f = compile_selector(" OR ".join(f"x = 'v{i}'" for i in range(2500)))
    assert f.evaluate(msg(x="v2499")) is True
    assert f.evaluate(msg(x="nope")) is False
    assert f.evaluate(msg()) is None
    assert f.evaluate(msg(x=5)) is False


def test_long_mixed_chain_three_valued():
    text = " OR ".join(f"(x{i} = {i} AND y{i} > {i})" for i in range(300))
    f = compile_selector(text)
    assert f.evaluate(msg(x299=299, y299=300)) is True
    assert f.evaluate(msg()) is None
    assert f.evaluate(msg(**{f"x{i}": -1 for i in range(300)})) is False


def test_big_selector_uses_the_same_semantics_as_a_small_one():
    big = " AND ".join(["a = 1"] * 200) + " AND b LIKE 'x%'"
    small = "a = 1 AND b LIKE 'x%'"
    for m in (msg(a=1, b="xy"), msg(a=1, b="y"), msg(a=1), msg(b="xy"), msg(a="1", b="xy")):
        assert compile_selector(big).evaluate(m) is compile_selector(small).evaluate(m)


@pytest.mark.parametrize("text", ["'" * 3, "a = '" + "x" * 100, "a IN (" * 50, "((((((", "a = 1 AND" * 50])
def test_garbage_is_a_selector_error(text):
    with pytest.raises(SelectorError):
        compile_selector(text)


def _oracle(pattern, escape):
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and pattern[i + 1 : i + 2] in ("%", "_", escape):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


@settings(max_examples=400, deadline=None)
@given(
    pattern=st.text(alphabet="ab%_!", max_size=8),
    value=st.text(alphabet="ab%_!\n", max_size=10),
    escape=st.sampled_from([None, "!"]),
)
def test_like_matcher_agrees_with_a_regex_oracle(pattern, value, escape):
    assert like_matcher(pattern, escape)(value) == (_oracle(pattern, escape).fullmatch(value) is not None)


def test_named_or_filter_with_a_string_is_malformed_but_the_ambiguous_code_is_xquery():
    from broker_filter.filters import FilterError

    with pytest.raises(FilterError, match="or-filter"):
        compile_filter_set({"o": {"descriptor": "apache.org:or-filter:list", "value": "/a/b"}})
    fs = compile_filter_set({"x": {"descriptor": 0x0000468C00000005, "value": "/a/b"}})
    assert fs.applied == {} and "xquery" in fs.ignored[0].reason


def test_artemis_numeric_strings_convert_whatever_the_other_side():
    m = msg(v="5.0", w="1e3", b="TRUE", junk="abc")
    f = lambda s: compile_selector("convert_string_expressions:" + s, "artemis").evaluate(m)  # noqa: E731
    assert f("v = 5") is True and f("w > 1") is True and f("b = TRUE") is True
    assert f("junk = FALSE") is False and f("junk <> FALSE") is True
    assert compile_selector("v = 5", "artemis").evaluate(m) is False  # without the prefix: no conversion


def test_runtime_number_parsing_is_ascii_only():
    m = msg(v="\u0661")  # ARABIC-INDIC DIGIT ONE
    assert compile_selector("v = 1", "rocketmq").evaluate(m) is False
    assert compile_selector("convert_string_expressions:v = 1", "artemis").evaluate(m) is False
