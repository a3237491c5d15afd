"""Wildcard subscriptions: which subscription patterns match a published address.

The broker keeps its wildcard subscriptions in a `WildcardTrie` (one lookup per publish, whatever the
number of patterns); the matching rule and the trie are the filter core's, shared with topic
bindings and the daemon's address rules: see `broker_filter.filters.wildcards`.  A subscription's
pattern is bounded in words (`check_pattern`, at `Broker.declare_queue`), so that its cost per publish is.
"""

from __future__ import annotations

from ..filters.wildcards import ANY_WORDS, MAX_PATTERN_WORDS, ONE_WORD, WildcardTrie, check_pattern, is_wildcard

__all__ = ["ANY_WORDS", "MAX_PATTERN_WORDS", "ONE_WORD", "WildcardTrie", "check_pattern", "is_wildcard"]
