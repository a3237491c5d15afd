"""Read-only reports of a proxy server's links and feeds: `GET /links`, the metrics' snapshot and the
filter counters.  Nothing here changes a feed or a link; each report walks the server's feeds and
connections once, bounded by its `limit` where it lists links."""

from __future__ import annotations

import time
from typing import Any

from . import introspect
from .links import ClientLinkObject
from .forwarding import FeedStats, Outlet
from .records import connection_state, state_of


def live_outlets(server) -> list[tuple[str | None, Outlet]]:
    """(address, outlet) of every client link a feed serves, their filter counts up to date."""
    out = []
    for b in list(server.feeds.values()):
        b.feed.count_filters()
        out.extend((b.spec.address, o) for o in b.feed.outlets)
    return out


def in_process_counts(binding: Any) -> tuple[int, int] | None:
    """(evaluations, matches) of the filters `binding` pushed down to an in-process upstream
    (the embedded broker evaluates them as the proxy's own), or None."""
    consumer = binding.consumer
    return consumer.filter_counts() if consumer is not None and binding.spec.filters else None


def filter_stats(server, top: int) -> tuple[dict, list]:
    """The filter counters by (address, kind), and the `top` costliest filters of live links."""
    live = live_outlets(server)
    feeds = []
    for b in list(server.feeds.values()):
        counts = in_process_counts(b)
        if counts is not None:
            feeds.append((b.spec.address, introspect.entries_kind(b.spec.filters), counts))
    return server.filter_totals.totals(live, feeds), introspect.costliest(live, top)


def links_report(server, limit: int = introspect.LINKS_LIMIT) -> dict:
    """Every client link: its connection, address, filters (where each is evaluated), credit,
    counts and feed (`GET /links`)."""
    now = time.monotonic()
    records: list[dict] = []
    truncated = False
    seen = set()
    for b in list(server.feeds.values()):
        b.feed.count_filters()
        mode = b.key[0]
        feed = {"kind": {"fanout": "shared subscription", "named": "shared named subscription"}.get(
                    mode, "queue" if mode == "queue" and not b.feed.subscription else "own subscription"),
                "upstream_address": b.upstream_address,
                "links": len(b.feed.outlets),
                "held": b.feed.stats.held}
        for o in list(b.feed.outlets) + list(b.pending):
            if len(records) >= limit:
                truncated = True
                break
            seen.add(o)
            records.append(_link_record(server, o, b, feed, now))
    for c in list(server.connections.values()):
        for link in list(c.links):
            state = state_of(link)
            inlet, relay = state.inlet, state.relay
            if inlet is None and relay is None:
                continue
            if len(records) >= limit:
                truncated = True
                break
            records.append({"connection": c.id, "container": link.connection.remote_container,
                            "link": link.name, "direction": "publisher", "state": _state(link),
                            "address": inlet.address if inlet is not None else None,
                            "anonymous_relay": relay is not None, "filters": []})
    return {"links": records, "truncated": truncated, "upstream": server.upstream.name,
            "upstream_connected": server.upstream_up,
            "upstream_version": server.upstream.version}  # (clients may be shown another)


def _state(link: Any) -> str | None:
    """The client link's state (`links.ClientLinkObject`): attaching, awaiting upstream, attached,
    moving, gone; None for a link the proxy does not serve itself."""
    handler = link.handler
    return handler.state if isinstance(handler, ClientLinkObject) else None


def _link_record(server, o: Outlet, b: Any, feed: dict, now: float) -> dict:
    link = o.io_ref
    conn = connection_state(link.connection) if link is not None else None
    fs = state_of(link).fs
    local = {id(e) for e in o.filter.entries}
    pushed = "embedded broker" if b.upstream.traits.in_process else "upstream"
    filters = [{"key": str(e.key), "kind": e.kind, "text": e.filter.description,
                "evaluated": "here" if id(e) in local else pushed}
               for e in (fs.entries if fs is not None else ())]
    evaluated, matched = o.evaluated, o.matched
    counts = in_process_counts(b)
    if counts is not None and not local and len(b.feed.outlets) <= 1:
        evaluated, matched = counts  # the link's own consumer in the embedded broker
    waiting = now - o.waiting_since if o.waiting_since is not None and o.credit > 0 else 0.0
    return {"connection": conn.id if conn is not None else None,
            "container": link.connection.remote_container if link is not None else None,
            "link": link.name if link is not None else o.name, "direction": "consumer",
            "state": _state(link) if link is not None else None,
            "address": link.remote_source.address if link is not None else b.spec.address,
            "filters": filters, "credit": o.credit, "unsettled": len(o.in_flight),
            "delivered": o.delivered, "evaluated": evaluated, "matched": matched,
            "evaluation_seconds": round(o.eval_ns / 1e9, 6), "waiting_with_credit_seconds": round(waiting, 3),
            "attached": o not in b.pending, "feed": feed}


def snapshot(server) -> dict:
    """Plain numbers for metrics: per-feed held / starved counts and totals."""
    feeds = []
    for b in list(server.feeds.values()):
        s: FeedStats = b.feed.stats
        feeds.append({
            "address": b.spec.address,
            "mode": "subscription" if b.feed.subscription else "queue",
            "outlets": len(b.feed.outlets),
            "held": s.held,
            "held_peak": s.held_peak,
            "starved": s.starved,
            "blocked": s.blocked,
            "delivered": s.delivered,
            "filtered": s.filtered,
            "recycled": s.recycled,
            "moving": s.moving,
            "passes": s.passes,
            "handed_back": s.handed_back,
            "redelivered": s.redelivered,
            "waited": b.feed.longest_wait(),
            "undecodable": s.undecodable,
            "too_large": s.too_large,
        })
    links = {"consumer": 0, "producer": 0}
    credit: dict[str, int] = {}
    for b in server.feeds.values():
        links["consumer"] += len(b.feed.outlets)
        a = b.spec.address or ""
        credit[a] = credit.get(a, 0) + sum(o.credit for o in b.feed.outlets)
    links["upstream-consumer"] = len(server.feeds)
    for c in server.connections.values():  # (once a second with metrics on: no walk over every link)
        links["producer"] += len(c.producers)
    links["upstream-producer"] = links["producer"]
    return {
        "links": links,
        "credit": credit,
        "connections": len(server.connections),
        "upstream_connected": server.upstream_up,
        "feeds": feeds,
        "held": sum(f["held"] for f in feeds),
        "starved": sum(f["starved"] for f in feeds),
        "moving": server.registry.moves_in_flight(),
        "refused": server.refused,
    }
