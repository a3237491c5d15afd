"""Spark backend benchmark: compiled selectors vs the same selectors as a Python UDF, one run.

    .venv/bin/python bench/spark_bench.py [--messages 10000000] [--udf-messages 1000000]
                                          [--data /tmp/broker-filter-bench] [--master local[2]]

Generates an archive of typed messages with pyarrow (reused when it already has the requested size),
then for five selectors measures, in the same Spark session:
  * compiled: the selector compiled to native Spark SQL expressions, matches counted over the whole
    archive (count_if, as `backtest` does);
  * udf: the same selector evaluated by the core evaluator inside a Python UDF (row -> Message ->
    Filter.matches), over the first --udf-messages messages (a Python UDF over 10 million rows takes
    many minutes; rates are per message, so the ratio stands);
  * core: the core evaluator alone on one thread over pre-decoded Message objects.
Both Spark paths read the same Parquet columns.  Prints a Markdown table (messages/s and ratio).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from broker_filter.archive.parquet import SCHEMA, TYPED, archive_files, row_message  # noqa: E402
from broker_filter.filters import compile_selector  # noqa: E402

SELECTORS = [
    "color = 'red'",
    "n BETWEEN 500 AND 599 AND price > 50.0",
    "JMSPriority >= 7 OR color IN ('blue', 'green')",
    "name LIKE 'order-1%' ESCAPE '!'",
    "n * 2 + price > 1000.5 AND NOT (color = 'red') AND JMSType = 'orders.eu'",
]
CHUNK = 1_000_000


def typed(type_name: str, n: int, **fields: pa.Array) -> pa.StructArray:
    arrays = []
    for f in TYPED:
        if f.name == "type":
            arrays.append(pa.repeat(pa.scalar(type_name, pa.string()), n))
        elif f.name in fields:
            arrays.append(fields[f.name].cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.StructArray.from_arrays(arrays, fields=list(TYPED))


class Random:
    """Seeded uniform columns from pyarrow.compute (no numpy needed)."""

    def __init__(self, seed: int):
        self.seed = seed

    def uniform(self, n: int) -> pa.Array:
        self.seed += 1
        return pc.random(n, initializer=self.seed)

    def integers(self, n: int, high: int) -> pa.Array:
        return pc.cast(pc.floor(pc.multiply(self.uniform(n), high)), pa.int64())

    def choice(self, n: int, options: list[str]) -> pa.Array:
        return pa.array(options, pa.string()).take(self.integers(n, len(options)))


def chunk_table(start: int, n: int, rng: Random) -> pa.Table:
    idx = pa.array(range(start, start + n), pa.int64())
    text_idx = pc.cast(idx, pa.string())
    colors = rng.choice(n, ["red", "blue", "green", "yellow", "black"])
    numbers = rng.integers(n, 1000)
    prices = pc.round(pc.multiply(rng.uniform(n), 100.0), 2)
    names = pc.binary_join_element_wise("order-", text_idx, "")
    keys = ["color", "n", "price", "name"]
    values = [
        typed("string", n, string=colors),
        typed("int", n, long=numbers),
        typed("double", n, double=prices),
        typed("string", n, string=names),
    ]
    # Interleave the four entries of every row into one map.
    order = pa.array([i + k * n for i in range(n) for k in range(4)], pa.int64())
    items = pa.concat_arrays(values).take(order)
    map_keys = pa.array(keys * n, pa.string())
    offsets = pa.array(range(0, 4 * n + 1, 4), pa.int32())
    app = pa.MapArray.from_arrays(offsets, map_keys, items)
    header_type = SCHEMA.field("header").type
    header = pa.StructArray.from_arrays(
        [
            pc.less(rng.uniform(n), 0.5),
            pc.cast(rng.integers(n, 10), pa.int16()),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.bool_()),
            pa.repeat(pa.scalar(0, pa.int64()), n),
        ],
        fields=list(header_type),
    )
    props_type = SCHEMA.field("properties").type
    prop_arrays = []
    for f in props_type:
        if f.name == "subject":
            prop_arrays.append(rng.choice(n, ["orders.eu", "orders.us", "audit"]))
        elif f.name == "creation_time":
            prop_arrays.append(pc.add(idx, 1_767_225_600_000))
        elif f.name == "message_id":
            prop_arrays.append(typed("string", n, string=pc.binary_join_element_wise("id-", text_idx, "")))
        else:
            prop_arrays.append(pa.nulls(n, f.type))
    properties = pa.StructArray.from_arrays(prop_arrays, fields=list(props_type))
    body = typed("binary", n, binary=pa.repeat(pa.scalar(b"0123456789abcdef0123456789abcdef", pa.binary()), n))
    columns = {
        "address": rng.choice(n, ["orders", "audit", "billing"]),
        "arrival_time": pc.cast(pc.add(pc.multiply(idx, 1000), 1_767_225_600_000_000), pa.timestamp("us", tz="UTC")),
        "seq": idx,
        "header": header,
        "delivery_annotations": pa.nulls(n, SCHEMA.field("delivery_annotations").type),
        "message_annotations": pa.nulls(n, SCHEMA.field("message_annotations").type),
        "properties": properties,
        "application_properties": app,
        "body": body,
        "encoded_size": pa.repeat(pa.scalar(180, pa.int64()), n),
    }
    return pa.Table.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)


def ensure_archive(path: str, messages: int) -> None:
    marker = os.path.join(path, f".complete-{messages}")
    if os.path.exists(marker):
        return
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        os.remove(os.path.join(path, name))
    rng = Random(42)
    t0 = time.perf_counter()
    for i, start in enumerate(range(0, messages, CHUNK)):
        table = chunk_table(start, min(CHUNK, messages - start), rng)
        pq.write_table(table, os.path.join(path, f"part-{i:05d}.parquet"), compression="zstd")
    open(marker, "w").close()
    print(f"generated {messages:,} messages in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=10_000_000)
    p.add_argument("--udf-messages", type=int, default=1_000_000)
    p.add_argument("--core-messages", type=int, default=200_000)
    p.add_argument("--data", default="/tmp/broker-filter-bench")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args()

    ensure_archive(args.data, args.messages)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the UDF workers need this venv
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    from broker_filter.spark.compile import apply_all
    from broker_filter.spark.compile import compile_selector as spark_compile

    def count_matches(frame, condition):
        # An aggregate, as `backtest` counts: a filter would be pushed into the scan and inline the
        # compiled selector's helper columns.
        return frame.agg(F.count_if(condition).alias("n")).collect()[0]["n"]
    from broker_filter.spark.session import get_session, read_archive

    spark = get_session(args.master, app_name="broker-filter spark bench")
    spark.sparkContext.setLogLevel("ERROR")
    archive = read_archive(spark, args.data)
    udf_frame = archive.limit(args.udf_messages).cache()
    udf_rows = udf_frame.count()
    sections = ["header", "properties", "message_annotations", "application_properties"]

    # The core's messages for the one-thread figure (decoded once, outside the timing).
    first = pq.ParquetFile(archive_files(args.data)[0]).read_row_groups([0], columns=None).slice(0, args.core_messages)
    messages = [row_message(r) for r in first.to_pylist()]

    results = []
    for text in SELECTORS:
        core = compile_selector(text)
        compiled = spark_compile(core.ast)

        t0 = time.perf_counter()
        matched = count_matches(apply_all(archive, {"m": compiled}), F.col("m"))
        compiled_s = time.perf_counter() - t0

        def evaluate(*values, _f=core):
            return _f.matches(row_message(dict(zip(sections, (v.asDict(True) if hasattr(v, "asDict") else v for v in values)))))

        udf = F.udf(evaluate, BooleanType())
        t0 = time.perf_counter()
        udf_matched = count_matches(udf_frame, udf(*[F.col(s) for s in sections]))
        udf_s = time.perf_counter() - t0
        check = count_matches(apply_all(udf_frame, {"m": compiled}), F.col("m"))
        assert check == udf_matched, f"{text}: compiled {check} vs UDF {udf_matched} on the same rows"

        t0 = time.perf_counter()
        n_core = sum(1 for m in messages if core.matches(m))
        core_s = time.perf_counter() - t0
        results.append((text, matched, args.messages / compiled_s, udf_rows / udf_s, len(messages) / core_s))
        print(f"{text}: compiled {compiled_s:.1f}s, udf {udf_s:.1f}s, core {core_s:.2f}s ({n_core})", file=sys.stderr)

    print(f"\n{args.messages:,} archived messages, Spark {args.master}; UDF over the first {udf_rows:,}; "
          f"core over {len(messages):,} on one thread\n")
    print("| selector | matched | compiled Spark msg/s | Python UDF msg/s | compiled / UDF | core, 1 thread msg/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for text, matched, c, u, k in results:
        print(f"| `{text}` | {matched:,} | {c:,.0f} | {u:,.0f} | {c / u:.1f}x | {k:,.0f} |")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
