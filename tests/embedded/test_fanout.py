"""One shared subscription per multicast address on the embedded broker, through the daemon: for
random filter sets and messages, the links that receive a message are exactly those whose filter
selects it, with the daemon's subscription index and cache on and off."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fanout_checks import check_exact_sets
from launcher import Daemon

INDEX_SETTINGS = {"index-cache": ("true", "1024"), "index-no-cache": ("true", "0"), "no-index": ("false", "0")}


@pytest.fixture(scope="module", params=list(INDEX_SETTINGS.values()), ids=list(INDEX_SETTINGS))
def index_daemon(request):
    indexed, cache = request.param
    p = Daemon("--set", f"limits.subscription_index={indexed}", "--set", f"limits.index_cache_size={cache}")
    yield p
    p.stop()
    assert "Traceback" not in p.log(), p.log()


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000))
def test_property_links_receive_exactly_what_their_filter_selects(index_daemon, seed):
    check_exact_sets(index_daemon.url, f"multicast://fan{uuid.uuid4().hex[:10]}", seed)
