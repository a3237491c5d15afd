"""Subscription index benchmark: what dispatching one message to N filtered subscribers costs, for
N = 1, 100, 1,000 and 10,000, indexed against a linear scan, in one run.

    .venv/bin/python bench/index_bench.py [--sizes 1,100,1000,10000] [--messages 2000] [--repeat 3]

Subscriber i has its own filter: mostly `customer = 'c<i>'`; one in ten a mixed one — a topic
binding `orders.t<i>.#` or `customer IN ('c<i>', 'z<i>')` — and one (when N > 1)
an unindexable `customer LIKE 'zz%'` (at least one when N > 1), which every message evaluates.  Message k carries
`customer = 'c<j>'` and subject `orders.t<j>` for a random j < N, so about one subscriber selects
it.  Rows:

* library: `SubscriptionIndex.match` (cache on and off) against evaluating every filter;
* embedded broker: `Broker.publish` to a multicast address with N filtered subscriptions, with the
  subscription index on and off (`BrokerConfig.subscription_index`).

Each figure is the best of `--repeat` runs, in microseconds per message, with what was built before
the timed loops frozen out of the garbage collector (`settled`); the benchmark first checks
that the indexed and the linear dispatch select the same subscribers for every message.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker_filter.amqp.types import Described, symbol  # noqa: E402
from broker_filter.broker import Broker, BrokerConfig  # noqa: E402
from broker_filter.filters import compile_filter_set  # noqa: E402
from broker_filter.filters.index import SubscriptionIndex  # noqa: E402
from broker_filter.amqp.message import Message, Properties  # noqa: E402

SELECTOR = symbol("apache.org:selector-filter:string")
TOPIC = symbol("apache.org:legacy-amqp-topic-binding:string")


def subscriber_filter(i: int, n: int):
    """Subscriber i's filter-set (as the daemon compiles what a client attaches with)."""
    if n > 1 and i == n - 1:
        return compile_filter_set({symbol("s"): Described(SELECTOR, "customer LIKE 'zz%'")})
    if i % 10 == 3:
        return compile_filter_set({symbol("t"): Described(TOPIC, f"orders.t{i}.#")})
    if i % 10 == 7:
        return compile_filter_set({symbol("s"): Described(SELECTOR, f"customer IN ('c{i}', 'z{i}')")})
    return compile_filter_set({symbol("s"): Described(SELECTOR, f"customer = 'c{i}'")})


def messages(n: int, count: int, seed: int = 7) -> list[Message]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        j = rng.randrange(n)
        out.append(Message(properties=Properties(subject=f"orders.t{j}"),
                           application_properties={"customer": f"c{j}", "amount": j % 100}))
    return out


def settled() -> None:
    """Collect, then move everything built so far out of the collector's sight (`gc.freeze`, as a
    long-running daemon would after start-up): otherwise full collections walking the N filters
    land in the timed loops and are charged to whichever row triggers them."""
    gc.collect()
    gc.freeze()


def best(fn, repeat: int, reset=None) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if reset is not None:
            reset()
    return min(times)


def library_row(n: int, msgs: list[Message], repeat: int) -> dict:
    filters = [(i, subscriber_filter(i, n)) for i in range(n)]
    cached = SubscriptionIndex(cache_size=1024)
    uncached = SubscriptionIndex(cache_size=0)
    for i, f in filters:
        cached.register(i, f)
        uncached.register(i, f)

    def linear(m):
        return [i for i, f in filters if f.evaluate(m, None) is True]

    linear_msgs = msgs[: max(50, min(len(msgs), 400_000 // n))]
    selected = 0
    for m in linear_msgs:  # same answer, or the figures mean nothing
        want = linear(m)
        assert cached.match(m) == want and uncached.match(m) == want, (n, m)
        selected += len(want)
    for index in (cached, uncached):
        index.messages = index.candidates_total = index.evaluations_total = index.cache_hits = index.cache_lookups = 0
    settled()

    def run_index(index):
        match = index.match
        for m in msgs:
            match(m)

    def run_linear():
        for m in linear_msgs:
            linear(m)

    per = 1e6 / len(msgs)
    t_cached = best(lambda: run_index(cached), repeat) * per
    t_uncached = best(lambda: run_index(uncached), repeat) * per
    t_linear = best(run_linear, repeat) * 1e6 / len(linear_msgs)
    stats = uncached.stats()
    return {"n": n, "indexed_cache": t_cached, "indexed_nocache": t_uncached, "linear": t_linear,
            "selected": selected / len(linear_msgs), "candidates": stats["candidates_per_message"],
            "evaluations": stats["evaluations_per_message"], "hit_rate": cached.stats()["cache_hit_rate"],
            "unindexed": stats["unindexed_filters"]}


def broker_row(n: int, msgs: list[Message], repeat: int) -> dict:
    out = {"n": n}
    for label, indexed in (("broker_indexed", True), ("broker_linear", False)):
        broker = Broker(BrokerConfig(default_routing_type="multicast", subscription_index=indexed))
        consumers = [broker.subscribe("orders", filter=subscriber_filter(i, n)) for i in range(n)]
        batch = msgs if indexed else msgs[: max(50, min(len(msgs), 400_000 // n))]
        settled()

        def run():
            for m in batch:
                broker.publish("orders", b"", size=0, message=m)

        def purge():  # keep memory flat between repeats (not timed)
            for c in consumers:
                c.queue.purge()

        out[label] = best(run, repeat, purge) * 1e6 / len(batch)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,100,1000,10000")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        msgs = messages(n, args.messages)
        row = library_row(n, msgs, args.repeat)
        row.update(broker_row(n, msgs, args.repeat))
        rows.append(row)
        gc.unfreeze()
        print(f"N={n}: done", file=sys.stderr, flush=True)
    base = rows[0]
    print("| subscribers | unindexed filters | candidates/msg | evaluations/msg | selected/msg | indexed µs/msg "
          "(cache on / off) | linear µs/msg | cache hit rate | broker publish µs/msg indexed / linear |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['unindexed']} | {r['candidates']:.2f} | {r['evaluations']:.2f} | {r['selected']:.2f} "
              f"| {r['indexed_cache']:.1f} / {r['indexed_nocache']:.1f} | {r['linear']:.1f} | {r['hit_rate']:.2f} "
              f"| {r['broker_indexed']:.1f} / {r['broker_linear']:.1f} |")
    last = rows[-1]
    print()
    print(f"indexed, cache off: cost at {last['n']:,} = {last['indexed_nocache'] / base['indexed_nocache']:.2f}x "
          f"the cost at {base['n']:,} (target <= 3x); linear: {last['linear'] / base['linear']:.0f}x")
    print(f"embedded broker publish: cost at {last['n']:,} = {last['broker_indexed'] / base['broker_indexed']:.2f}x "
          f"the cost at {base['n']:,} (target <= 3x); index off: {last['broker_linear'] / base['broker_linear']:.0f}x")


if __name__ == "__main__":
    main()
