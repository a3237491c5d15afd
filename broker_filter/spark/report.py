"""The backtest's HTML report (`broker-filter backtest --report FILE.html`): one self-contained page
(inline SVG and CSS, no script, nothing fetched) with two charts and a table.

- Messages per period: for each period of arrival (an hour; a day, or a month, when the archive
  spans more periods than `MAX_BARS` hours or days), one bar for all messages and one bar per filter
  for those it matched.  Periods with no messages between the first and the last are drawn too
  (empty bars), so the time axis is even.
- Selectivity per filter: one horizontal bar per filter, matched / total.

Every bar is an SVG `rect` (and nothing else is), each with a `<title>` tooltip; the legend is HTML.
Input: the filters' `FilterReport.to_json()` dictionaries.  Pure Python (no Spark).
"""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Mapping

MAX_BARS = 240  # periods drawn at most; beyond, the period grows (hour -> day -> month)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f"]
TOTAL_COLOUR = "#c7c7c7"

_PERIODS = (
    ("hour", "%Y-%m-%dT%H:00Z", lambda t: t.replace(minute=0, second=0, microsecond=0),
     lambda t: t + _dt.timedelta(hours=1)),
    ("day", "%Y-%m-%d", lambda t: t.replace(hour=0, minute=0, second=0, microsecond=0),
     lambda t: t + _dt.timedelta(days=1)),
    ("month", "%Y-%m", lambda t: t.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
     lambda t: (t.replace(day=28) + _dt.timedelta(days=4)).replace(day=1)),
)


def _hour(key: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.strptime(key, "%Y-%m-%dT%H:00:00Z")
    except ValueError:
        return None


def periods(reports: Mapping[str, Mapping]) -> tuple[str, list[str], dict[str, list[int]], list[int]]:
    """(period name, period labels, filter -> matched per period, all messages per period).  Messages
    with no arrival hour are left out (the table's totals include them)."""
    first = next(iter(reports.values()), None)
    totals_by_hour = {k: v for k, v in (first or {}).get("total_by_hour", {}).items() if _hour(k)}
    if not totals_by_hour:
        return "hour", [], {name: [] for name in reports}, []
    hours = sorted(_hour(k) for k in totals_by_hour)
    for name, fmt, floor, step in _PERIODS:
        starts, t = [], floor(hours[0])
        while t <= hours[-1] and (len(starts) <= MAX_BARS or name == "month"):
            starts.append(t)
            t = step(t)
        if len(starts) <= MAX_BARS or name == "month":
            break
    index = {s: i for i, s in enumerate(starts)}

    def spread(by_hour: Mapping[str, int]) -> list[int]:
        out = [0] * len(starts)
        for key, n in by_hour.items():
            t = _hour(key)
            if t is not None:
                out[index[floor(t)]] += n
        return out

    labels = [s.strftime(fmt) for s in starts]
    return name, labels, {n: spread(r.get("by_hour", {})) for n, r in reports.items()}, spread(totals_by_hour)


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _per_period_svg(period: str, labels: list[str], matched: dict[str, list[int]], totals: list[int]) -> str:
    names = list(matched)
    group = len(names) + 1
    bar = max(3, min(16, 900 // max(1, len(labels) * group)))
    gap, left, top, height, bottom = max(2, bar // 2), 100, 10, 220, 80
    width = left + max(1, len(labels)) * (group * bar + gap) + 10
    peak = max(totals, default=0) or 1
    out = [f'<svg id="per-period" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{top + height + bottom}" role="img" aria-label="messages per {period}">']
    out.append(f'<line x1="{left}" y1="{top + height}" x2="{width - 5}" y2="{top + height}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#333"/>')
    out.append(f'<text x="{left - 6}" y="{top + 10}" text-anchor="end" class="axis">{peak:,}</text>')
    out.append(f'<text x="{left - 6}" y="{top + height}" text-anchor="end" class="axis">0</text>')
    every = max(1, len(labels) // 24)  # about 24 labels at most
    for i, label in enumerate(labels):
        x0 = left + gap / 2 + i * (group * bar + gap)
        values = [("all messages", totals[i], TOTAL_COLOUR)] + [
            (name, matched[name][i], _colour(j)) for j, name in enumerate(names)]
        for k, (what, n, colour) in enumerate(values):
            h = height * n / peak
            out.append(f'<rect class="bar" x="{x0 + k * bar:.1f}" y="{top + height - h:.1f}" width="{bar - 1}" '
                       f'height="{h:.1f}" fill="{colour}"><title>{html.escape(label)}: {html.escape(what)} '
                       f'{n:,}</title></rect>')
        if i % every == 0:
            x = x0 + group * bar / 2
            out.append(f'<text x="{x:.1f}" y="{top + height + 12}" class="axis" text-anchor="end" '
                       f'transform="rotate(-45 {x:.1f} {top + height + 12})">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _selectivity_svg(reports: Mapping[str, Mapping]) -> str:
    names = list(reports)
    label_width, plot, row, top = 200, 500, 26, 5
    height = top + row * max(1, len(names)) + 25
    out = [f'<svg id="selectivity" xmlns="http://www.w3.org/2000/svg" width="{label_width + plot + 80}" '
           f'height="{height}" role="img" aria-label="selectivity per filter">']
    for i, name in enumerate(names):
        r = reports[name]
        s = float(r.get("selectivity", 0.0))
        y = top + i * row
        out.append(f'<text x="{label_width - 8}" y="{y + 15}" text-anchor="end">{html.escape(name[:40])}</text>')
        out.append(f'<rect class="bar" x="{label_width}" y="{y + 3}" width="{plot * s:.1f}" height="{row - 8}" '
                   f'fill="{_colour(i)}"><title>{html.escape(name)}: {r.get("matched", 0):,} of '
                   f'{r.get("total", 0):,}</title></rect>')
        out.append(f'<text x="{label_width + plot * s + 6:.1f}" y="{y + 15}">{100 * s:.2f}%</text>')
    axis_y = top + row * max(1, len(names))
    out.append(f'<line x1="{label_width}" y1="{axis_y}" x2="{label_width + plot}" y2="{axis_y}" stroke="#333"/>')
    for frac in (0, 0.5, 1):
        out.append(f'<text x="{label_width + plot * frac}" y="{axis_y + 15}" class="axis" '
                   f'text-anchor="middle">{int(frac * 100)}%</text>')
    out.append("</svg>")
    return "\n".join(out)


def render_html(reports: Mapping[str, Mapping], *, archive: str = "") -> str:
    """The report page for `reports` (filter name -> FilterReport.to_json())."""
    period, labels, matched, totals = periods(reports)
    names = list(reports)
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{c}"></span>{html.escape(n)}</span>'
        for n, c in [("all messages", TOTAL_COLOUR)] + [(n, _colour(i)) for i, n in enumerate(names)])
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{r.get('matched', 0):,}</td><td>{r.get('total', 0):,}</td>"
        f"<td>{r.get('unknown', 0):,}</td><td>{100 * float(r.get('selectivity', 0.0)):.2f}%</td></tr>"
        for n, r in reports.items())
    first = next(iter(reports.values()), {})
    undated = sum(v for k, v in first.get("total_by_hour", {}).items() if _hour(k) is None)
    note = f"<p>{undated:,} message(s) without an arrival time are not in the chart.</p>" if undated else ""
    title = "broker-filter backtest" + (f": {archive}" if archive else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; background: #fff; }}
.chart {{ overflow-x: auto; }}
svg text {{ font-size: 12px; fill: #222; }}
svg text.axis {{ font-size: 10px; fill: #555; }}
.key {{ margin-right: 1.2em; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em; vertical-align: -0.1em; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<h2>Messages per {period}: all, and matched by each filter</h2>
<p class="legend">{legend}</p>
<div class="chart">
{_per_period_svg(period, labels, matched, totals)}
</div>
{note}
<h2>Selectivity per filter (matched / total)</h2>
<div class="chart">
{_selectivity_svg(reports)}
</div>
<h2>Totals</h2>
<table>
<tr><th>filter</th><th>matched</th><th>total</th><th>unknown</th><th>selectivity</th></tr>
{rows}
</table>
</body>
</html>
"""
