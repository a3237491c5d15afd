"""Wildcard subscriptions: which subscription patterns match a published address.

The broker keeps its wildcard subscriptions in a `WildcardTrie` (one lookup per publish, whatever the
number of patterns); the matching rule and the trie are the filter core's, shared with topic
bindings and the daemon's address rules: see `broker_filter.filters.wildcards`.
"""

from __future__ import annotations

from ..filters.wildcards import ANY_WORDS, ONE_WORD, WildcardTrie, is_wildcard

__all__ = ["ANY_WORDS", "ONE_WORD", "WildcardTrie", "is_wildcard"]
