"""`broker-filter backtest --report`: the HTML report rendered by headless Chromium (Debian's
`chromium`, installed by scripts/setup.sh) and looked at: a screenshot that is not blank, and the
charts' bars counted in the DOM Chromium built; and the progress bars of `backtest` and
`archive import`."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from broker_filter.cli import main
from broker_filter.spark.report import MAX_BARS, periods, render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

LINES = [  # hours 10 (2 messages), 11 (2), none at 12, 13 (1)
    {"address": "orders", "arrival_time": "2026-01-01T10:05:00Z", "message": {"application_properties": {"color": "red", "n": 1}}},
    {"address": "orders", "arrival_time": "2026-01-01T10:55:00Z", "message": {"application_properties": {"color": "blue", "n": 2}}},
    {"address": "orders", "arrival_time": "2026-01-01T11:10:00Z", "message": {"application_properties": {"color": "red"}}},
    {"address": "audit", "arrival_time": "2026-01-01T11:20:00Z", "message": {"application_properties": {"color": "red", "n": 5}}},
    {"address": "audit", "arrival_time": "2026-01-01T13:00:00Z", "message": {"header": {"priority": 9}}},
]
FILTERS = {"red": "color = 'red'", "big": "n > 1", "<none>": "n > 100"}


def png_colours(path: Path) -> set[tuple[int, ...]]:
    """The distinct colours of an 8-bit RGB or RGBA PNG (every 3rd pixel of each row)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    previous, colours = bytearray(stride), set()
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(tuple(line[x:x + 3]) for x in range(0, stride, bpp * 3))
        previous = line
    return colours


class Bars(HTMLParser):
    """rect elements of each svg (by id) in a DOM, with their attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.svg: str | None = None
        self.rects: dict[str, list[dict]] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "svg":
            self.svg = dict(attrs).get("id", "")
            self.rects.setdefault(self.svg, [])
        elif tag == "rect":
            assert self.svg is not None, "a rect outside the charts"
            self.rects[self.svg].append(dict(attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.svg = None


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp / 'profile'}",
                           *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    src = d / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES) + "\n", encoding="utf-8")
    assert main(["archive", "import", str(src), "-o", str(d / "archive"), "--no-progress"]) == 0
    (d / "filters.json").write_text(json.dumps(FILTERS), encoding="utf-8")
    return d


@pytest.mark.spark
def test_report_rendered_by_chromium_has_the_expected_bars(archive, tmp_path, capsys, spark):
    report = tmp_path / "report.html"
    assert main(["backtest", "--archive", str(archive / "archive"), "--filters", str(archive / "filters.json"),
                 "--report", str(report)]) == 0
    captured = capsys.readouterr()
    assert f"report written to {report}" in captured.out
    assert "backtest: 100%" in captured.err  # the progress bar of the Spark tasks, finished
    text = report.read_text(encoding="utf-8")
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text
    assert "<script" not in text and "&lt;none&gt;" in text
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian package `chromium`, installed by scripts/setup.sh)")
    shot = tmp_path / "report.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1000,800", report.as_uri(), tmp=tmp_path)
    if not shot.exists():
        pytest.skip(f"chromium cannot run here (exit {result.returncode}): {result.stderr[-500:]}")
    colours = png_colours(shot)
    assert len(colours) > 3, f"the screenshot is (nearly) blank: {colours}"
    assert (0x1f, 0x77, 0xb4) in colours  # the first filter's bars
    dom = chromium("--dump-dom", report.as_uri(), tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-500:]
    bars = Bars()
    bars.feed(dom.stdout)
    # Four hours (10 to 13, 12 empty), one bar for all messages and one per filter each; one
    # selectivity bar per filter.
    per_period, selectivity = bars.rects["per-period"], bars.rects["selectivity"]
    assert len(per_period) == 4 * (1 + len(FILTERS))
    assert len(selectivity) == len(FILTERS)
    heights = [float(r["height"]) for r in per_period]
    group = 1 + len(FILTERS)
    totals, red = heights[0::group], heights[1::group]
    assert [round(h / totals[0], 3) for h in totals] == [1.0, 1.0, 0.0, 0.5]
    assert [round(h / totals[0], 3) for h in red] == [0.5, 1.0, 0.0, 0.0]
    widths = [float(r["width"]) for r in selectivity]
    assert widths[0] == pytest.approx(widths[1] * 1.5) and widths[2] == 0  # 60% and 40% of 5; none


def test_periods_grow_from_hours_to_days_to_months():
    def report(hours: list[str]) -> dict:
        return {"f": {"matched": 0, "total": len(hours), "by_hour": {}, "total_by_hour": {h: 1 for h in hours}}}

    name, labels, _, totals = periods(report(["2026-01-01T00:00:00Z", "2026-01-02T23:00:00Z"]))
    assert name == "hour" and len(labels) == 48 and totals[0] == totals[-1] == 1 and sum(totals) == 2
    name, labels, _, totals = periods(report(["2026-01-01T00:00:00Z", f"2026-01-{MAX_BARS // 24 + 2:02d}T05:00:00Z"]))
    assert name == "day" and labels[0] == "2026-01-01" and sum(totals) == 2
    name, labels, _, totals = periods(report(["2020-01-01T00:00:00Z", "2026-12-31T23:00:00Z", ""]))
    assert name == "month" and len(labels) == 84 and sum(totals) == 2
    page = render_html(report(["2026-01-01T00:00:00Z", ""]))
    assert "1 message(s) without an arrival time are not in the chart." in page
    assert render_html({}).count("<rect") == 0


def test_archive_import_shows_progress(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES) + "\n", encoding="utf-8")
    assert main(["archive", "import", str(src), "-o", str(tmp_path / "archive")]) == 0
    err = capsys.readouterr().err
    assert "import: 100%" in err and f"{src.stat().st_size}/{src.stat().st_size}" in err


def test_backtest_refuses_a_report_path_it_cannot_write(archive, capsys):
    assert main(["backtest", "--archive", str(archive / "archive"), "--selector", "a = 1",
                 "--report", str(archive / "missing" / "r.html")]) == 2
    assert "--report" in capsys.readouterr().err
