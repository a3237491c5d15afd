"""The `broker-filter` streaming source and sink on the shared local Spark session, against the
embedded daemon (`broker-filter serve`, selectors pushed down) and RabbitMQ (selectors evaluated in
the reader)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from broker_filter.cli import main
from broker_filter.spark import register
from broker_filter.spark.ingest import run_until_idle, start_ingest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients import drain  # noqa: E402
from streamkit import archived_numbers, fresh, properties, publish, wait_for  # noqa: E402

pytestmark = pytest.mark.spark

SELECTOR = "region = 'eu' AND total > 100"


def selected(numbers) -> set[int]:
    return {i for i in numbers if properties(i)["region"] == "eu" and properties(i)["total"] > 100}


@pytest.fixture(scope="module")
def spark_bf(spark):
    register(spark)
    return spark


def source(spark, url, address, **options):
    reader = spark.readStream.format("broker-filter").option("url", url).option("address", address)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def memory_query(frame, name):
    return frame.writeStream.format("memory").queryName(name).trigger(processingTime="200 milliseconds").start()


def collect_until(spark, query, table, count, limit=60.0):
    """Rows of the memory table once it holds `count` rows, and a moment more for any extra."""
    wait_for(lambda: spark.sql(f"SELECT count(*) FROM {table}").collect()[0][0] >= count or query.exception(),
             limit, f"{count} rows in {table}")
    assert query.exception() is None, query.exception()
    query.processAllAvailable()
    return spark.sql(f"SELECT * FROM {table}").collect()


def test_selector_through_the_daemon_is_pushed_down_and_selects_exactly(spark_bf, daemon):
    spark, address, name = spark_bf, fresh("q"), fresh("t").replace("-", "_")
    publish(daemon.url, address, range(150))
    want = selected(range(150))
    q = memory_query(source(spark, daemon.url, address, selector=SELECTOR, maxMessagesPerTrigger=17), name)
    try:
        rows = collect_until(spark, q, name, len(want))
    finally:
        q.stop()
    got = [int(r["application_properties"]["i"]["long"]) for r in rows]
    assert sorted(got) == sorted(want)  # exact set, no duplicates on a clean run
    assert sorted(r["seq"] for r in rows) == list(range(len(want)))  # the stream offset
    assert max(p["numInputRows"] for p in q.recentProgress) <= 17
    r = next(r for r in rows if int(r["application_properties"]["i"]["long"]) == min(want))
    assert r["address"] == address and r["properties"]["subject"] == f"s{min(want)}"
    assert r["body"]["type"] == "string" and r["body"]["string"] == f"m{min(want)}"
    assert r["application_properties"]["region"]["type"] == "string"
    assert r["application_properties"]["total"]["type"] == "long" and r["encoded_size"] > 0
    # Pushed down: the daemon kept every message the selector does not select for other consumers.
    left = drain(daemon.url, address)
    assert sorted(m.properties["i"] for m in left) == sorted(set(range(150)) - want)


@pytest.mark.rabbitmq
def test_selector_on_rabbitmq_is_evaluated_in_the_reader(spark_bf, rabbitmq):
    spark, address, name = spark_bf, f"/queue/{fresh('q')}", fresh("t").replace("-", "_")
    publish(rabbitmq, address, range(120))
    want = selected(range(120))
    q = memory_query(source(spark, rabbitmq, address, selector=SELECTOR, maxMessagesPerTrigger=25), name)
    try:
        rows = collect_until(spark, q, name, len(want))
    finally:
        q.stop()
    got = sorted(int(r["application_properties"]["i"]["long"]) for r in rows)
    assert got == sorted(want)
    # Evaluated here: the query consumed the address, the messages it does not select included.
    assert drain(rabbitmq, address, idle=0.5) == []


def test_filter_set_option_and_bad_options(spark_bf, daemon):
    spark, address, name = spark_bf, fresh("q"), fresh("t").replace("-", "_")
    publish(daemon.url, address, range(30))
    # The selector entry goes to the daemon, the not-filter is evaluated in the reader.
    fs = json.dumps({
        "sel": {"descriptor": "apache.org:selector-filter:string", "value": "region = 'us'"},
        "not": {"descriptor": "apache.org:not-filter:list",
                "value": [{"descriptor": "apache.org:selector-filter:string", "value": "total > 200"}]},
    })
    want = [i for i in range(30) if properties(i)["region"] == "us" and not properties(i)["total"] > 200]
    assert 0 < len(want) < 10
    q = memory_query(source(spark, daemon.url, address, filter=fs), name)
    try:
        rows = collect_until(spark, q, name, len(want))
    finally:
        q.stop()
    assert sorted(int(r["application_properties"]["i"]["long"]) for r in rows) == want
    with pytest.raises(Exception) as e:
        source(spark, daemon.url, address, selector="region = = 'eu'")
    assert "broker-filter source: option 'selector'" in str(e.value) and "line 1, column" in str(e.value)
    with pytest.raises(Exception) as e:
        source(spark, daemon.url, address, maxMessagesPerTrigger=0)
    assert "option 'maxMessagesPerTrigger': must be a positive integer, got '0'" in str(e.value)
    with pytest.raises(Exception) as e:
        spark.readStream.format("broker-filter").option("address", "x").load()
    assert "option 'url': required" in str(e.value)


def test_unreadable_message_is_rejected_and_an_unreachable_broker_fails_the_query(spark_bf, daemon):
    from proton import Message, ulong
    from proton.utils import BlockingConnection

    spark, address, name = spark_bf, fresh("q"), fresh("t").replace("-", "_")
    conn = BlockingConnection(daemon.url, timeout=20)
    try:  # the archive keeps symbol annotation keys only: this one cannot become a row
        conn.create_sender(address).send(Message(body="bad", annotations={ulong(7): "x"}, properties={"i": -1}))
    finally:
        conn.close()
    publish(daemon.url, address, range(5))
    q = memory_query(source(spark, daemon.url, address), name)
    try:
        rows = collect_until(spark, q, name, 5)
    finally:
        q.stop()
    assert sorted(int(r["application_properties"]["i"]["long"]) for r in rows) == list(range(5))
    assert drain(daemon.url, address, idle=0.5) == []  # rejected, not left to come back

    q = memory_query(source(spark, "amqp://127.0.0.1:1", "q", timeout=5), fresh("t").replace("-", "_"))
    wait_for(lambda: q.exception() is not None, 60, "the query to fail")
    assert "broker-filter source amqp://127.0.0.1:1/q: connection failed" in str(q.exception())


def unacknowledged(queue: str) -> int | None:
    """RabbitMQ's count of delivered, unsettled messages of a queue."""
    from rabbitmq_nodes import RABBITMQ3  # the node of the `rabbitmq` fixture here (tests/proxy also runs 4.0)

    for _ in range(3):  # rabbitmqctl itself can time out on a loaded machine
        r = RABBITMQ3.ctl("list_queues", "name", "messages_unacknowledged", "--quiet")
        if r.returncode == 0:
            break
    counts = dict(line.split("\t") for line in r.stdout.splitlines() if "\t" in line)
    assert queue in counts, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return int(counts[queue])


@pytest.mark.rabbitmq
def test_credit_holds_at_most_two_batches_unsettled(spark_bf, rabbitmq):
    spark, queue, batch = spark_bf, fresh("q"), 10
    publish(rabbitmq, f"/queue/{queue}", range(200))
    q = (source(spark, rabbitmq, f"/queue/{queue}", maxMessagesPerTrigger=batch).writeStream.format("memory")
         .queryName(fresh("t").replace("-", "_")).trigger(processingTime="1 hour").start())
    try:
        wait_for(lambda: q.recentProgress or q.exception(), 60, "the first trigger")
        # Until the next trigger the source holds the first batch and buffers the next: 2 batches.
        assert wait_for(lambda: unacknowledged(queue) == 2 * batch, 20, f"{2 * batch} messages held")
        time.sleep(1.0)
        assert unacknowledged(queue) == 2 * batch
    finally:
        q.stop()
    assert wait_for(lambda: unacknowledged(queue) == 0, 20, "the held messages back in the queue")
    assert len(drain(rabbitmq, f"/queue/{queue}", idle=0.5)) == 200 - sum(p["numInputRows"] for p in q.recentProgress)


@pytest.mark.rabbitmq
def test_stopped_query_restarts_from_its_checkpoint_without_loss(spark_bf, rabbitmq, tmp_path):
    spark, address, batch = spark_bf, f"/queue/{fresh('q')}", 40
    publish(rabbitmq, address, range(240))
    archive, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"

    def run():
        return start_ingest(spark, url=rabbitmq, address=address, archive=str(archive), checkpoint=str(checkpoint),
                            options={"maxMessagesPerTrigger": batch, "recoveryWait": 3}, trigger_seconds=0.1)

    q = run()
    wait_for(lambda: sum(1 for p in q.recentProgress if p["numInputRows"]) >= 2 or q.exception(), 90, "two batches")
    q.stop()  # mid-stream: messages remain in the queue, a batch may be half done
    first = archived_numbers(archive)
    assert 0 < len(set(first)) < 240
    totals = run_until_idle(run(), idle_seconds=3)
    assert totals["messages"] > 0
    numbers = archived_numbers(archive)
    assert set(numbers) == set(range(240))  # nothing lost
    duplicates = len(numbers) - 240
    assert 0 <= duplicates <= batch  # only the batch that had not committed
    assert drain(rabbitmq, address, idle=0.5) == []  # everything ingested was accepted


def test_idle_stop_waits_for_a_batch_slower_than_the_idle_time(spark_bf, daemon):
    """`run_until_idle` (what `ingest --idle-stop` runs) must not stop the query in the middle of a
    batch that takes longer to write than the idle time: the batch would be lost to this run."""
    spark, address = spark_bf, fresh("q")
    written: list[int] = []

    def slow_writer(frame, batch_id):
        rows = frame.count()
        if rows:
            time.sleep(4.0)  # longer than the idle time below
        written.append(rows)

    q = (source(spark, daemon.url, address, selector=SELECTOR).writeStream.foreachBatch(slow_writer)
         .trigger(processingTime="200 milliseconds").start())
    try:
        assert wait_for(lambda: q.recentProgress or q.exception(), 60, "the first (empty) trigger")
        publish(daemon.url, address, range(60))
        totals = run_until_idle(q, idle_seconds=1.5)
    finally:
        if q.isActive:
            q.stop()
    assert totals["messages"] == len(selected(range(60)))
    assert sum(written) == len(selected(range(60)))


@pytest.mark.rabbitmq
def test_writer_publishes_rows_the_broker_accepts(spark_bf, daemon, rabbitmq, tmp_path):
    spark, src, dst = spark_bf, fresh("q"), f"/queue/{fresh('out')}"
    publish(daemon.url, src, range(60))
    want = selected(range(60))
    q = (source(spark, daemon.url, src, selector=SELECTOR).writeStream.format("broker-filter")
         .option("url", rabbitmq).option("address", dst).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        got = []
        wait_for(lambda: got.extend(drain(rabbitmq, dst, idle=0.5)) or len(got) >= len(want) or q.exception(),
                 60, f"{len(want)} messages in {dst}", poll=0)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    assert sorted(m.properties["i"] for m in got) == sorted(want)
    m = next(m for m in got if m.properties["i"] == min(want))
    assert m.body == f"m{min(want)}" and m.subject == f"s{min(want)}" and m.properties["region"] == "eu"
    # A static frame through the batch writer, with a plain string body column.
    frame = spark.createDataFrame([("hello",), ("world",)], "body string")
    frame.write.format("broker-filter").option("url", rabbitmq).option("address", dst).mode("append").save()
    assert sorted(m.body for m in drain(rabbitmq, dst, idle=0.5)) == ["hello", "world"]


def test_writer_reports_a_broker_that_refuses(spark_bf, daemon):
    frame = spark_bf.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception) as e:
        frame.write.format("broker-filter").option("url", "amqp://127.0.0.1:1").option("address", "q") \
            .option("timeout", "5").mode("append").save()
    assert "broker-filter sink amqp://127.0.0.1:1/q" in str(e.value)


def test_ingest_command_refuses_bad_input(capsys, tmp_path):
    base = ["ingest", "--archive", str(tmp_path / "a")]
    assert main(base + ["--from", "amqp://127.0.0.1:5672"]) == 2
    assert "--from: " in capsys.readouterr().err
    assert main(base + ["--from", "amqp://127.0.0.1:5672/q", "--selector", "a >"]) == 2
    assert "broker-filter ingest: --selector: unexpected end of the selector at line 1, column 4" in capsys.readouterr().err
    assert main(base + ["--from", "amqp://127.0.0.1:5672/q", "--max-messages-per-trigger", "0"]) == 2
    assert "--max-messages-per-trigger must be positive" in capsys.readouterr().err


@pytest.mark.rabbitmq
def test_ingest_command_takes_the_amqp_sql_dialect(spark_bf, rabbitmq, tmp_path, capsys):
    """`broker-filter ingest --dialect amqp-sql`: `%` is modulo, `"…"` a string and `p.subject` the
    properties section's subject; exactly the selected messages are archived (the reader consumes the
    address: the rest are accepted, docs/streaming.md)."""
    address = f"/queue/{fresh('sqlingest')}"
    publish(rabbitmq, address, range(30))
    archive = tmp_path / "archive"
    command = ["ingest", "--from", f"{rabbitmq}/{address}", "--archive", str(archive), "--dialect", "amqp-sql",
               "--selector", 'i % 3 = 0 AND region = "eu" AND p.subject <> \'s9\'',
               "--trigger-seconds", "0.2", "--idle-stop", "15"]
    assert main(command) == 0
    assert "message(s) ingested" in capsys.readouterr().out
    want = {i for i in range(30) if i % 3 == 0 and i != 9}  # region "eu" is i % 3 == 0
    assert sorted(archived_numbers(archive)) == sorted(want)
    assert drain(rabbitmq, address, idle=0.5) == []
