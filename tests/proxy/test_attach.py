"""What a proton client sees when it attaches a receiver with filters: the open frame's capabilities,
the echo of applied filters, and the refusal of an invalid one."""

from __future__ import annotations

import pytest
from proton import Described, Terminus, symbol, ulong
from proton.reactor import Filter, Selector
from proton.utils import LinkDetached

from clients import connect

pytestmark = pytest.mark.rabbitmq

CAPS = {
    "APACHE.ORG:LEGACY_AMQP_EXCHANGE_FILTERS",
    "APACHE.ORG:JMS_FILTERS",
    "APACHE.ORG:LOGIC_FILTERS",
    "APACHE.ORG:SELECTOR",
    "APACHE.ORG:NO_LOCAL",
}


def _filter_map(terminus) -> dict:
    terminus.filter.rewind()
    terminus.filter.next()
    return terminus.filter.get_object() or {}


def _caps(terminus) -> set:
    terminus.capabilities.rewind()
    terminus.capabilities.next()
    obj = terminus.capabilities.get_object()
    return {str(c) for c in (obj or [])}


def test_open_frame_offers_filter_capabilities(proxy):
    c = connect(proxy.url)
    try:
        assert CAPS <= {str(x) for x in c.conn.remote_offered_capabilities}
    finally:
        c.close()


def test_echo_is_exactly_the_applied_filters_under_the_clients_keys(proxy, address):
    selector = Described(symbol("apache.org:selector-filter:string"), "color = 'red'")
    no_local = Described(ulong(0x0000468C00000003), "NoLocalFilter{}")
    unknown = Described(symbol("example.org:xquery"), "/a/b")
    xquery = Described(ulong(0x0000468C00000005), "//x")  # the ambiguous code with a string: xquery
    filters = {symbol("jms-selector"): selector, symbol("nl"): no_local, symbol("x"): unknown, symbol("xq"): xquery}
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/queue/{address}", options=Filter(filters))
        echoed = _filter_map(r.link.remote_source)
        assert set(echoed) == {symbol("jms-selector"), symbol("nl")}
        assert echoed[symbol("jms-selector")] == selector
        assert echoed[symbol("nl")].descriptor == ulong(0x0000468C00000003)
        assert type(echoed[symbol("nl")].descriptor) is ulong
        assert echoed[symbol("nl")].value == "NoLocalFilter{}"
        assert CAPS <= _caps(r.link.remote_source)
        assert r.link.remote_source.address == f"/queue/{address}"
    finally:
        c.close()


def test_no_filter_means_no_echo(proxy, address):
    c = connect(proxy.url)
    try:
        r = c.create_receiver(f"/queue/{address}")
        assert _filter_map(r.link.remote_source) == {}
    finally:
        c.close()


@pytest.mark.parametrize(
    "selector, where",
    [("color = ", "column"), ("color = 'red' AND", "column"), ("a LIKE 5", "LIKE")],
)
def test_invalid_selector_is_refused_with_invalid_field(proxy, address, selector, where):
    c = connect(proxy.url)
    try:
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(f"/queue/{address}", options=Selector(selector))
        link = info.value.link
        cond = link.remote_condition
        assert cond.name == "amqp:invalid-field"
        assert where in cond.description
        assert cond.info == {symbol("field"): symbol("filter")}
        assert link.remote_source.type == Terminus.UNSPECIFIED  # null source in the attach reply
        # The connection stays usable.
        r = c.create_receiver(f"/queue/{address}", name="second", options=Selector("color = 'red'"))
        assert _filter_map(r.link.remote_source)
    finally:
        c.close()


def test_malformed_filter_set_is_refused(proxy, address):
    bad = Described(symbol("apache.org:legacy-amqp-headers-binding:map"), "not a map")
    c = connect(proxy.url)
    try:
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(f"/queue/{address}", options=Filter({symbol("h"): bad}))
        assert info.value.link.remote_condition.name == "amqp:invalid-field"
    finally:
        c.close()
