"""One shared subscription per multicast address on the embedded broker, through the daemon: for
random filter sets and messages, the links that receive a message are exactly those whose filter
selects it, with the daemon's subscription index and cache on and off."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fanout_checks import INDEX_SETTINGS, check_exact_sets, serve_with_index

@pytest.fixture(scope="module", params=list(INDEX_SETTINGS.values()), ids=list(INDEX_SETTINGS))
def index_daemon(request):
    yield from serve_with_index(request.param)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000))
def test_property_links_receive_exactly_what_their_filter_selects(index_daemon, seed):
    check_exact_sets(index_daemon.url, f"multicast://fan{uuid.uuid4().hex[:10]}", seed)
