"""`broker-filter links`: a running daemon's client links, their filters and what they cost (its
`/links` endpoint, on the metrics listener), as a table for a person or as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "links",
        help="show a running daemon's client links, their filters and what they cost",
        description="Ask a running daemon's metrics listener (GET /links) for its client links: "
        "connection, address, direction, filters and where each is evaluated, credit, delivered, "
        "evaluated and matched counts, time waiting with credit, and the upstream feed.",
    )
    p.add_argument("--url", default=None,
                   help="the daemon's metrics listener (default: metrics.listen of --config, else "
                        "http://127.0.0.1:9464)")
    p.add_argument("--config", default=None,
                   help="the daemon's configuration file (for metrics.listen and metrics.token)")
    p.add_argument("--token-file", default=None,
                   help="file holding the daemon's metrics.token (default: $BROKER_FILTER_METRICS_TOKEN, else "
                        "the token of --config); without a token, filter texts are hidden")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON as it is")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> object | None:
    if not (args.config or os.environ.get("BROKER_FILTER_CONFIG")):
        return None
    from ..config import ConfigError, load

    try:
        return load(argparse.Namespace(config=args.config))
    except ConfigError as e:
        raise SystemExit(f"broker-filter links: {e}") from None


def _token(args: argparse.Namespace) -> str:
    """The bearer token for /links: --token-file, $BROKER_FILTER_METRICS_TOKEN, the configuration's."""
    if getattr(args, "token_file", None):
        try:
            with open(args.token_file, encoding="utf-8") as fh:
                return fh.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"broker-filter links: cannot read --token-file {args.token_file}: "
                             f"{getattr(e, 'strerror', None) or e}") from None
    if os.environ.get("BROKER_FILTER_METRICS_TOKEN"):
        return os.environ["BROKER_FILTER_METRICS_TOKEN"]
    config = _config(args)
    return config.metrics.token if config is not None else ""


def _base_url(args: argparse.Namespace) -> str:
    if args.url:
        return args.url if "://" in args.url else f"http://{args.url}"
    config = _config(args)
    if config is not None:
        if config.metrics.enabled:
            host = config.metrics.host
            host = "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)
            return f"http://[{host}]:{config.metrics.port}" if ":" in host else f"http://{host}:{config.metrics.port}"
        raise SystemExit("broker-filter links: the configuration has no metrics.listen: /links is served there")
    return "http://127.0.0.1:9464"


def fetch(url: str, timeout: float, token: str = "") -> dict:
    """The daemon's /links answer; SystemExit with a one-line reason when there is none."""
    request = urllib.request.Request(f"{url.rstrip('/')}/links",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        why = e.read(500).decode("utf-8", "replace").strip()
        raise SystemExit(f"broker-filter links: {url}/links answered {e.code} {e.reason}"
                         f"{': ' + why if why else ''}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SystemExit(f"broker-filter links: no daemon answers at {url} ({reason})") from None
    except ValueError:
        raise SystemExit(f"broker-filter links: {url}/links did not answer JSON") from None


def _filters(link: dict) -> str:
    if link.get("anonymous_relay"):
        return "(anonymous relay)"
    parts = [f"{f['kind']}: {f['text'] if 'text' in f else '#' + str(f.get('hash', '?'))} [{f['evaluated']}]"
             for f in link.get("filters", [])]
    return "; ".join(parts) or "-"


def table(report: dict) -> str:
    """The links as fixed-width text, one line each, with a summary line first."""
    links = report.get("links", [])
    head = (f"{report.get('instance', '?')}: upstream {report.get('upstream', '?')} "
            f"({'connected' if report.get('upstream_connected') else 'NOT connected'}), {len(links)} link(s)"
            f"{' (truncated)' if report.get('truncated') else ''}")
    columns = ("CONNECTION", "DIR", "ADDRESS", "LINK", "CREDIT", "DELIVERED", "EVALUATED", "MATCHED", "WAITING",
               "FEED", "FILTERS")
    rows = []
    for link in links:
        feed = link.get("feed") or {}
        feed_text = f"{feed.get('kind', '-')} ({feed.get('links', 0)} link(s), {feed.get('held', 0)} held)" if feed \
            else "-"
        consumer = link.get("direction") == "consumer"
        rows.append((str(link.get("connection") or "-"), "in" if consumer else "out", str(link.get("address") or "-"),
                     str(link.get("link") or "-"), str(link.get("credit", "")) if consumer else "",
                     str(link.get("delivered", "")) if consumer else "",
                     str(link.get("evaluated", "")) if consumer else "",
                     str(link.get("matched", "")) if consumer else "",
                     f"{link.get('waiting_with_credit_seconds', 0):.1f}s" if consumer else "",
                     feed_text if consumer else "-", _filters(link)))
    widths = [min(40, max([len(c)] + [len(r[i]) for r in rows])) for i, c in enumerate(columns)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(v if i == len(r) - 1 else v[:widths[i]].ljust(widths[i]) for i, v in enumerate(r)))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        report = fetch(_base_url(args), args.timeout, _token(args))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0
