"""Live traffic into Spark: messages per second from RabbitMQ through the `broker-filter` streaming
source into Parquet, against the daemon's own forwarding rate, in the same run.

A producer process publishes N messages (64-byte body, application property `half` = 0/1) to
`/topic/<name>` on RabbitMQ, as bench/python_clients.py does, while one of these consumes the stream with
the selector `half = 1`:
  * daemon:        a proton consumer through `broker-filter serve --upstream RabbitMQ` (the daemon
                   filters and forwards; bench/python_clients.py's consumer);
  * spark-direct:  `broker-filter ingest`'s query (broker_filter.spark.ingest) from RabbitMQ into a
                   Parquet archive, the selector evaluated in the source;
  * spark-daemon:  the same query through the daemon (the selector pushed down to it).
Rate = N / (first send .. last selected message delivered, or ingested and committed), i.e. messages
per second of the stream being filtered, like python_clients.run_once.  Spark runs on one local session
(`local[2]`); its start-up is outside the measured time (the query is attached before sending).

    python bench/streaming_bench.py [--upstream amqp://guest:guest@127.0.0.1:5672] [--messages 20000]
                                    [--batch 5000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from python_clients import producer, run_once, start_proxy  # noqa: E402

SELECTOR = "half = 1"


def spark_once(spark, url: str, upstream: str, count: int, batch: int) -> dict:
    """One stream through the streaming source into a Parquet archive."""
    from broker_filter.archive.parquet import archive_files
    from broker_filter.spark.ingest import start_ingest

    import pyarrow.parquet as pq

    address = f"/topic/bench-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="streaming-bench-"))
    query = start_ingest(spark, url=url, address=address, archive=str(workdir / "archive"),
                         options={"selector": SELECTOR, "maxMessagesPerTrigger": batch}, trigger_seconds=0.05)
    try:
        deadline = time.time() + 120
        while not query.recentProgress:  # the first trigger attached the receiver
            if time.time() > deadline or query.exception():
                raise RuntimeError(f"query did not start: {query.exception()}")
            time.sleep(0.05)
        ctx = mp.get_context("spawn")
        start, q = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=producer, args=(upstream, address, count, None, start, q))
        p.start()
        start.set()
        expect = count // 2
        deadline = time.time() + 900
        while sum(x["numInputRows"] for x in query.recentProgress) < expect:
            if time.time() > deadline or query.exception():
                raise RuntimeError(f"query stopped short: {query.exception()}")
            time.sleep(0.02)
        t1 = time.time()
        kind, t0 = q.get(timeout=60)
        p.join(60)
        batches = [x for x in query.recentProgress if x["numInputRows"]]
    finally:
        query.stop()
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in archive_files(workdir / "archive"))
    shutil.rmtree(workdir, ignore_errors=True)
    if rows != expect:
        raise RuntimeError(f"archive holds {rows} rows, expected {expect}")
    elapsed = t1 - t0
    return {"rate": count / elapsed, "elapsed": elapsed, "batches": len(batches),
            "mean_batch_rows": sum(b["numInputRows"] for b in batches) / max(1, len(batches))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", default="amqp://guest:guest@127.0.0.1:5672")
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=5000, help="maxMessagesPerTrigger")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    from broker_filter.spark.session import get_session

    spark = get_session("local[2]", app_name="streaming-bench", **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    proxy, port, log = start_proxy(args.upstream, None)
    daemon_url = f"amqp://127.0.0.1:{port}"
    results: dict[str, list] = {"daemon": [], "spark-direct": [], "spark-daemon": []}
    try:
        spark_once(spark, args.upstream, args.upstream, 2000, args.batch)  # warm-up (Python workers, JIT)
        for _ in range(args.repeat):
            results["daemon"].append(run_once(args.upstream, daemon_url, SELECTOR, args.messages, None))
            results["spark-direct"].append(spark_once(spark, args.upstream, args.upstream, args.messages, args.batch))
            results["spark-daemon"].append(spark_once(spark, daemon_url, args.upstream, args.messages, args.batch))
    finally:
        proxy.terminate()
        proxy.wait(10)
        spark.stop()
    best = {k: max(r["rate"] for r in v) for k, v in results.items()}
    print(json.dumps({"messages": args.messages, "batch": args.batch, "runs": results}, indent=2))
    print(f"daemon forwarding        {best['daemon']:10.0f} msg/s")
    for k in ("spark-direct", "spark-daemon"):
        print(f"{k:<24} {best[k]:10.0f} msg/s  ({best[k] / best['daemon']:.2f}x the daemon)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
