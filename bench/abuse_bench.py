"""Abuse benchmark: what the costliest filters the daemon accepts cost, against a plain selector.

Run: .venv/bin/python bench/abuse_bench.py [--links 1000]  (prints Markdown tables; figures go to
bench/README.md and README.md)

Per-message CPU of the worst accepted filters (topic bindings at the word limit against a 4 KB
subject, the worst LIKE patterns against a 4 KB value, the deepest and the largest selectors at the
daemon's limits), each against a plain selector, as ratios measured in the same run (best of
several repeats of process CPU time, so the machine's noise cancels out).  Then memory: what one
maximal selector compiles to (tracemalloc), the RSS that `--links` distinct maximal selectors add
while held (as that many links hold them), and what stays once they are dropped (the byte-bounded
compiled-selector cache only).  In-process: the daemon's own cost per message (decoding, framing,
about 0.2-0.3 ms) comes on top of every row alike.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_filter.amqp.message import Message  # noqa: E402
from broker_filter.config import Limits as DaemonLimits  # noqa: E402
from broker_filter.filters import compile_filter_set, compile_selector, selector  # noqa: E402
from broker_filter.filters.wildcards import MAX_PATTERN_WORDS  # noqa: E402

LIMITS = DaemonLimits()  # the daemon's defaults: 4,096 characters, nesting depth 32
FILTER_LIMITS = LIMITS.filter_limits()
TOPIC = "apache.org:legacy-amqp-topic-binding:string"
SUBJECT_WORDS = 2000  # 4 KB subject
WORDS = MAX_PATTERN_WORDS


def _fill(clause, sep: str, limit: int = LIMITS.selector_length) -> str:
    parts: list[str] = []
    k = 0
    while len(sep.join(parts + [clause(k)])) <= limit:
        parts.append(clause(k))
        k += 1
    return sep.join(parts)


def maximal_selectors(i: int) -> dict[str, str]:
    """Selectors at the length limit, distinct for each `i`, in the shapes that compile largest."""
    return {
        "equalities": _fill(lambda k: f"p{i}_{k} = 'v{k}'", " OR "),
        "comparisons and LIKE": _fill(lambda k: f"(a{k} > {i + k} AND b{k} LIKE 'x%y_{k}')", " OR "),
        "arithmetic": _fill(lambda k: f"a{k}+{i}*b{k} > c{k}-{k}", " AND "),
        "IN list": "x IN (" + _fill(lambda k: f"'{i}_{k}'", ",", LIMITS.selector_length - 7) + ")",
        "LIKE chain": _fill(lambda k: f"a{k} LIKE '{i}_{k}%x%y_'", " OR "),
        "short comparisons": _fill(lambda k: f"a<{i * 1000 + k}", " OR "),
    }


def best_cpu(fn, repeat: int = 5, number: int = 20) -> float:
    """Best CPU seconds per call over `repeat` runs of `number` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, (time.process_time() - t0) / number)
    return best


def topic(key: str):
    return compile_filter_set({"t": {"descriptor": TOPIC, "value": key}}, limits=FILTER_LIMITS)


def sel(text: str):
    return compile_selector(text, "jms", FILTER_LIMITS)


def per_message_rows() -> list[tuple[str, float]]:
    subject = ".".join(["a"] * SUBJECT_WORDS)
    subject_msg = Message.from_json({"properties": {"subject": subject}, "application_properties": {"color": "red"}})
    value = "a" * 4000
    like_msg = Message.from_json({"application_properties": {"x": value}})
    props = {f"a{k}": k for k in range(400)} | {f"b{k}": "xy_0" for k in range(400)} | {"x": "1_1"}
    props.update({f"c{k}": k for k in range(400)})
    wide_msg = Message.from_json({"application_properties": props})
    depth = LIMITS.nesting_depth
    cases = [
        ("plain selector `color = 'red'`", sel("color = 'red'"), subject_msg),
        (f"topic `#` x{WORDS} (the word limit; runs collapse to `#`), 4 KB subject", topic(".".join(["#"] * WORDS)), subject_msg),
        (f"topic `#.*` x{WORDS // 2}, 4 KB subject", topic(".".join(["#", "*"] * (WORDS // 2))), subject_msg),
        (f"topic `#.a` x{WORDS // 2} (most live states), 4 KB subject", topic(".".join(["#", "a"] * (WORDS // 2))), subject_msg),
        (f"topic `*` x{WORDS - 1} `.#`, 4 KB subject", topic(".".join(["*"] * (WORDS - 1)) + ".#"), subject_msg),
        (f"topic `#.a.*.a.*…b.#` ({WORDS} words: one searched segment), 4 KB subject",
         topic("#." + ".".join(["a", "*"] * (WORDS // 2 - 2)) + ".b.#"), subject_msg),
        ("LIKE `%a%a…%b` (2,000 `%`), 4 KB value", sel("x LIKE '" + "%a" * 2000 + "%b'"), like_msg),
        ("LIKE `%_%_…%` (2,000 `%`), 4 KB value", sel("x LIKE '%" + "_%" * 2000 + "'"), like_msg),
        ("LIKE `%aa…a_aa…ab%` (one 32-character `_` segment: the limit), 4 KB value",
         sel("x LIKE '%" + "a" * 15 + "_" + "a" * 15 + "b%'"), like_msg),
        ("LIKE `%a_%…` x16 (2-character `_` segments up to the limit) OR'ed, 4 KB value",
         sel(" OR ".join(["x LIKE '%a_%'"] * 16)), like_msg),
        (f"deepest selector (nesting {depth})", sel("".join(f"(a{k} = {k} AND " for k in range(depth - 1)) + "x = '1_1'" + ")" * (depth - 1)), wide_msg),
    ]
    for shape, text in maximal_selectors(1).items():
        cases.append((f"maximal selector: {shape} ({len(text)} characters)", sel(text), wide_msg))
    refused = [
        ("LIKE `%aa…a_aa…ab%` (one 2,000-character `_` segment: 6 ms a message before)",
         "x LIKE '%" + "a" * 1000 + "_" + "a" * 1000 + "b%'"),
        ("topic `#` x1,900 (5.7 s a message before)", None),
    ]
    rows = []
    for name, text in refused:
        try:
            if text is None:
                topic(".".join(["#"] * 1900))
            else:
                sel(text)
        except Exception as e:  # noqa: BLE001 - the refusal is the figure
            rows.append((name, getattr(e, "describe", lambda: str(e))()))
    for name, f, m in cases:
        f.matches(m)
        rows.append((name, best_cpu(lambda: f.matches(m))))
    return rows


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def compiled_sizes() -> list[tuple[str, int, float]]:
    rows = []
    for shape in maximal_selectors(0):
        texts = [maximal_selectors(i)[shape] for i in range(1, 7)]
        sel(texts[0])
        selector.clear_cache()
        gc.collect()
        tracemalloc.start()
        kept = [sel(t) for t in texts[1:]]
        selector.clear_cache()
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] / len(kept)
        tracemalloc.stop()
        del kept
        rows.append((shape, len(texts[1]), size))
    return rows


def links_rss(links: int, shape: str) -> dict:
    texts = [maximal_selectors(10_000 + i)[shape] for i in range(links)]
    selector.clear_cache()
    gc.collect()
    start = rss_bytes()
    t0 = time.process_time()
    held = [sel(t) for t in texts]
    compile_ms = (time.process_time() - t0) / links * 1e3
    gc.collect()
    peak = rss_bytes()
    stats = selector.cache_stats()
    del held
    gc.collect()
    after = rss_bytes()
    return {"start": start, "peak": peak, "after": after, "compile_ms": compile_ms, "cache": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", type=int, default=1000, help="distinct maximal selectors held at once")
    ap.add_argument("--shape", default="arithmetic", choices=list(maximal_selectors(0)))
    args = ap.parse_args()
    t_start = time.monotonic()

    rows = per_message_rows()
    plain = next(cost for name, cost in rows if name.startswith("plain"))
    print("| filter (at the daemon's limits) | CPU per message | vs plain selector |")
    print("|---|---:|---:|")
    for name, cost in rows:
        if isinstance(cost, str):
            print(f"| {name} | refused at attach: {cost} | |")
        else:
            print(f"| {name} | {cost * 1e6:,.1f} µs | {cost / plain:,.0f}x |")

    print("\n| maximal selector shape | characters | compiled size |")
    print("|---|---:|---:|")
    for shape, chars, size in compiled_sizes():
        print(f"| {shape} | {chars} | {size / 1024:.0f} KiB |")

    r = links_rss(args.links, args.shape)
    mib = 1024 * 1024
    print(f"\n| {args.links} distinct maximal selectors ({args.shape}) | figure |")
    print("|---|---:|")
    print(f"| compile time per selector (parse + compile) | {r['compile_ms']:.1f} ms |")
    print(f"| RSS added while held, per selector | {(r['peak'] - r['start']) / args.links / 1024:.0f} KiB |")
    print(f"| RSS after all dropped, above the start | {(r['after'] - r['start']) / mib:+.1f} MiB |")
    print(f"| compiled-selector cache then | {r['cache']['entries']} entries, "
          f"{r['cache']['bytes'] / mib:.1f} of {r['cache']['budget'] / mib:.0f} MiB (estimated) |")
    print(f"\n(run took {time.monotonic() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
