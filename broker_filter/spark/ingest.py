"""Ingest: a streaming query from an AMQP address into the archive layout (docs/archive.md).

Theory of operation: the `broker-filter` source reads what the filter selects; each micro-batch is
written by Spark's batch Parquet writer into its own directory `batch-<id>` of the archive, replacing
what a failed earlier attempt of the same batch left there.  Spark's writer stages files under
`_temporary` and moves complete files into place, and archive readers skip names starting with `_`
or `.`, so `backtest` never reads a half-written file.  The checkpoint (by default `_checkpoint` in
the archive) records the batches; the source accepts a batch's messages upstream only after Spark
commits it, so a query killed at any point and started again with the same checkpoint loses no
message: the unfinished batch is filled again from what the broker delivers again, and only messages
of a batch whose commit had not reached the broker yet can appear twice.
"""

from __future__ import annotations

import time
from typing import Any

from . import register
from .paths import HadoopListing


def start_ingest(
    spark: Any,
    *,
    url: str,
    address: str,
    archive: str,
    checkpoint: str | None = None,
    options: dict[str, str] | None = None,
    trigger_seconds: float = 5.0,
) -> Any:
    """Start the query; returns the StreamingQuery.  `options`: more source options (selector,
    filter, dialect, maxMessagesPerTrigger, timeout, recoveryWait)."""
    register(spark)
    reader = spark.readStream.format("broker-filter").option("url", url).option("address", address)
    for key, value in (options or {}).items():
        if value is not None:
            reader = reader.option(key, str(value))
    listing = HadoopListing(spark)
    archive = listing.qualify(archive).rstrip("/")  # a plain path or any Hadoop filesystem URI
    checkpoint = listing.qualify(checkpoint) if checkpoint else f"{archive}/_checkpoint"

    def write_batch(frame: Any, batch_id: int) -> None:
        frame.write.mode("overwrite").parquet(f"{archive}/batch-{batch_id:010d}")

    return (
        reader.load()
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{int(trigger_seconds * 1000)} milliseconds")
        .queryName(f"broker-filter ingest {address}")
        .start()
    )


def run_until_idle(query: Any, idle_seconds: float | None, poll: float = 0.2) -> dict:
    """Wait until `idle_seconds` pass without a message (None: until the query stops), then stop it.
    A batch with messages still being written is activity: the query is not stopped in its middle (a
    first batch slower than `idle_seconds` would otherwise be interrupted and the run would end with
    nothing written).  Returns {"messages": rows ingested by this run, "batches": batches with
    messages}.  Raises the query's error if it failed."""
    seen = -1
    totals = {"messages": 0, "batches": 0}
    last_active = None  # idle time counts from the first trigger (a restart first replays its batch)
    try:
        while query.isActive:
            for p in query.recentProgress:
                if last_active is None:
                    last_active = time.monotonic()
                if p["batchId"] > seen:
                    seen = p["batchId"]
                    if p["numInputRows"]:
                        totals["messages"] += p["numInputRows"]
                        totals["batches"] += 1
                        last_active = time.monotonic()
            status = query.status
            if last_active is not None and status.get("isTriggerActive") and status.get("isDataAvailable"):
                last_active = time.monotonic()  # a batch with messages is being written
            if idle_seconds is not None and last_active is not None and time.monotonic() - last_active >= idle_seconds:
                break
            query.awaitTermination(poll)
    finally:
        if query.isActive:
            query.stop()
    error = query.exception()
    if error is not None:
        raise RuntimeError(str(error.desc if hasattr(error, "desc") else error))
    return totals
