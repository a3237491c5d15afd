"""The `broker-filter` Spark data source: AMQP addresses as streaming sources and sinks.

    broker_filter.spark.register(spark)
    spark.readStream.format("broker-filter").option("url", "amqp://127.0.0.1:5672")
         .option("address", "orders").option("selector", "region = 'eu'").load()
    df.writeStream.format("broker-filter").option("url", ...).option("address", ...).start()

Theory of operation (reader): Spark's Python data source API runs the stream reader's offset and
planning calls (`latestOffset`, `partitions`, `commit`) in one long-lived Python process next to the
driver, so the AMQP receiver (broker_filter.spark.streaming) lives there.  `latestOffset` cuts a
micro-batch from what the receiver holds, `partitions` hands its rows to the executors inside the
partitions themselves (Arrow IPC bytes), and `commit` accepts the batch's messages upstream — as
does the next `latestOffset` from the batch's end, which the engine asks only once the batch's
commit is logged (Spark calls `commit` only when a later batch has data, so an idle stream would
otherwise hold its last batch until the query stops, and a stopped query would get it again).  A
batch Spark replays from its checkpoint after a restart (offsets logged, never committed) is planned
in a process that holds none of its messages: `partitions` then fills it with the first messages the
broker delivers, which are the ones the dead query left unsettled, and holds them until that batch
commits.  (Spark's `SimpleDataSourceStreamReader` would re-read such a batch on an executor, which
cannot hold messages until the commit: hence the full `DataSourceStreamReader`.)

The writer sends each row of a micro-batch as an AMQP message (the archive row -> message of
`broker_filter.archive.parquet.row_message`, encoded exactly) and counts it only when the broker accepts it;
a refusal fails the task and Spark runs the batch again (at-least-once).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from ..archive import parquet as _archive
from .streaming import Receiver, positive, stream_filter, target_of

log = logging.getLogger("broker_filter.spark.datasource")

NAME = "broker-filter"
DEFAULT_BATCH = 1000
PARTITION_ROWS = 5000  # rows per Spark partition of a micro-batch


def register(spark: Any) -> None:
    """Make `format("broker-filter")` known to this session (readStream and writeStream / write),
    its Python workers running an interpreter that can import this package (`worker_python`)."""
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: the server starts the Python workers, with its own settings
        sc = None
    python = worker_python(sc) if sc is not None else None
    if python is None or python == sc.pythonExec:
        spark.dataSource.register(BrokerFilterDataSource)
        return
    # PySpark records the interpreter of a data source's workers (every one: the driver-side source
    # and planner, the executors' readers and writers) in the function it registers, from
    # `sc.pythonExec` at that moment; the SparkContext's own setting stays as it is for the rest.
    previous = sc.pythonExec
    sc.pythonExec = python
    try:
        spark.dataSource.register(BrokerFilterDataSource)
    finally:
        sc.pythonExec = previous


# What a data source worker imports beyond what Spark puts on its path (pyspark, py4j).
WORKER_MODULES = ("pyarrow", "proton", "lark", "broker_filter")
_PROBE = """import sys
print("%d.%d" % sys.version_info[:2])
for name in sys.argv[1:]:
    try:
        __import__(name)
    except Exception:
        print(name)
"""


def worker_python(sc: Any, timeout: float = 60.0) -> str:
    """The interpreter this package's Spark Python workers should run.

    PySpark starts Python workers with the interpreter fixed when the SparkContext was created:
    `PYSPARK_PYTHON` then, else the first `python3` on PATH — not the driver's interpreter, and
    neither `PYSPARK_PYTHON` nor `spark.pyspark.python` set afterwards changes it.  When that
    interpreter is this one, or runs the same Python and imports what the workers need, it is kept
    (the user's choice wins).  Otherwise, on a local master (workers on this machine), this
    interpreter (`sys.executable`); on a cluster, RuntimeError saying what to set."""
    python = sc.pythonExec
    if _same_interpreter(python):
        return python
    problem = _probe(python, timeout)
    if problem is None:
        return python
    master = str(sc.master or "")
    where = f"'{python}'" + ("" if os.sep in python else f" ({shutil.which(python) or 'not on PATH'})")
    if master.startswith("local"):
        log.info("Spark's Python workers run %s, which %s; the broker-filter data source's workers run "
                 "this interpreter instead: %s", where, problem, sys.executable)
        return sys.executable
    raise RuntimeError(
        f"broker-filter: Spark's Python workers run {where}, which {problem}. Set PYSPARK_PYTHON to an "
        f"interpreter that has broker-filter installed with its spark extra on the driver and on every "
        f"executor (this one, {sys.executable}, has it) before the SparkContext is created, e.g. "
        f"`export PYSPARK_PYTHON={sys.executable}` or spark-submit's "
        f"`--conf spark.pyspark.python={sys.executable}`: a running SparkContext keeps the interpreter "
        f"it started with")


def _same_interpreter(python: str) -> bool:
    """`python` is the driver's interpreter: the same file in the same directory (a virtualenv's
    `python` and `python3`), so the same prefix and site-packages."""
    if python == sys.executable:
        return True
    path = python if os.sep in python else shutil.which(python)
    if not path:
        return False
    try:
        return (os.path.dirname(os.path.abspath(path)) == os.path.dirname(os.path.abspath(sys.executable))
                and os.path.samefile(path, sys.executable))
    except OSError:
        return False


def _probe(python: str, timeout: float) -> str | None:
    """None if `python` runs this Python's major.minor and imports WORKER_MODULES; else what is wrong,
    as the end of a sentence."""
    try:
        done = subprocess.run([python, "-c", _PROBE, *WORKER_MODULES], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return "does not exist"
    except subprocess.TimeoutExpired:
        return f"did not answer within {timeout:.0f} s"
    except OSError as e:
        return f"cannot be started ({e.strerror or e})"
    lines = done.stdout.split()
    if done.returncode != 0 or not lines:
        return f"failed to start (exit status {done.returncode})"
    version, missing = lines[0], lines[1:]
    ours = "%d.%d" % sys.version_info[:2]
    if version != ours:
        return f"is Python {version}, not the driver's {ours}"
    if missing:
        return f"cannot import {', '.join(missing)}"
    return None


class BrokerFilterDataSource(DataSource):
    """Options: `url` (amqp[s]://[user:password@]host[:port]), `address`; source only: `selector` or
    `filter` (a JSON filter-set), `dialect` (jms), `maxMessagesPerTrigger` (1000), `timeout` (30 s),
    `recoveryWait` (5 s); sink only: `window` (200 unconfirmed), `timeout` (30 s)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        # Called when a reading query is defined (`load()`): bad source options fail there.
        AmqpStreamReader.check_options(self.options)
        return from_arrow_schema(_archive.SCHEMA)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return AmqpStreamReader(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return AmqpStreamWriter(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return AmqpBatchWriter(self.options, schema)


# ----------------------------------------------------------------------------- reader
class RowsPartition(InputPartition):
    """Rows of a micro-batch as Arrow IPC stream bytes (archive schema)."""

    def __init__(self, data: bytes):
        super().__init__(None)
        self.data = data


@dataclass
class _Batch:
    start: int
    end: int
    tags: list[int]
    rows: list[dict] | None  # replaced by `parts` once planned
    parts: list[InputPartition] | None = None


class AmqpStreamReader(DataSourceStreamReader):
    """Offsets are {"seq": n}: n messages of this query's stream come before it."""

    WHAT = "broker-filter source"

    def __init__(self, options: Any, schema: StructType):
        # Built on the driver's source runner, the planner and the executors: no connection until
        # the first offset call.
        self.target, self.selection, self.batch, self.timeout, self.recovery_wait = self.check_options(options)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._receiver: Receiver | None = None
        self._batches: dict[int, _Batch] = {}

    @classmethod
    def check_options(cls, options: Any) -> tuple:
        """(target, selection, batch, timeout, recovery wait); raises OptionError."""
        return (
            target_of(options, cls.WHAT),
            stream_filter(options, cls.WHAT),
            positive(options, "maxMessagesPerTrigger", DEFAULT_BATCH, cls.WHAT),
            positive(options, "timeout", 30.0, cls.WHAT, float),
            positive(options, "recoveryWait", 5.0, cls.WHAT, float),
        )

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_receiver"] = None
        state["_batches"] = {}
        return state

    def _live(self) -> Receiver:
        if self._receiver is None:
            self._receiver = Receiver(self.target, self.selection, batch=self.batch, timeout=self.timeout).start()
            log.info("%s %s/%s: filter %s", self.WHAT, self.target.url, self.target.address,
                     "pushed down to the peer" if self._receiver.pushed_down else "evaluated here")
        return self._receiver

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.batch)

    def latestOffset(self, start: dict, limit: Any) -> dict:
        s = int(start["seq"])
        # The micro-batch engine asks for the next batch from `start` only after the batch that ended
        # there ran and its commit was logged; Spark's own `commit` call for it comes only with the
        # next batch that has data, which an idle or stopping stream may never have.
        self._settle_through(s)
        planned = self._batches.get(s)
        if planned is not None:  # asked again before planning: the same batch
            return {"seq": planned.end}
        n = getattr(limit, "max_rows", None) or self.batch
        taken = self._live().take(min(int(n), self.batch))
        if not taken:
            return {"seq": s}
        self._batches[s] = _Batch(s, s + len(taken), [tag for tag, _ in taken], [row for _, row in taken])
        return {"seq": s + len(taken)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        s, e = int(start["seq"]), int(end["seq"])
        if s >= e:
            return []
        b = self._batches.get(s)
        if b is None or b.end != e:
            # A batch replayed from the checkpoint: fill it with what the broker delivers first
            # (the messages left unsettled by the query that logged it), held until it commits.
            taken = self._live().take(e - s, wait=self.recovery_wait)
            b = self._batches[s] = _Batch(s, e, [tag for tag, _ in taken], [row for _, row in taken])
        if b.parts is None:  # planned once; the same partitions if Spark asks again
            rows, b.rows = b.rows or [], None
            for i, row in enumerate(rows):
                row["seq"] = s + i
            b.parts = [RowsPartition(self._ipc(rows[i : i + PARTITION_ROWS])) for i in range(0, len(rows), PARTITION_ROWS)]
        return b.parts

    def _ipc(self, rows: list[dict]) -> bytes:
        return _archive.rows_stream(rows, self.arrow_schema)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        data = getattr(partition, "data", None)
        if not data:
            return iter(())
        return iter(_archive.stream_batches(data))

    def commit(self, end: dict) -> None:
        self._settle_through(int(end["seq"]))

    def _settle_through(self, e: int) -> None:
        """Accept upstream the messages of every batch that ends at or before offset `e`."""
        done = [s for s, b in self._batches.items() if b.end <= e]
        tags = [t for s in done for t in self._batches.pop(s).tags]
        if tags and self._receiver is not None:
            self._receiver.settle(tags, wait=self.timeout)
        if self._receiver is not None:
            self._receiver.check()

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None


# ----------------------------------------------------------------------------- writer
@dataclass
class Accepted(WriterCommitMessage):
    count: int


class _Sender:
    WHAT = "broker-filter sink"

    def __init__(self, options: Any, schema: StructType):
        self.target = target_of(options, self.WHAT)
        self.window = positive(options, "window", 200, self.WHAT)
        self.timeout = positive(options, "timeout", 30.0, self.WHAT, float)
        names = set(schema.fieldNames())
        if "body" not in names and "application_properties" not in names and "properties" not in names:
            raise ValueError(f"{self.WHAT}: the rows have none of the message columns (body, properties, "
                             "application_properties; docs/archive.md)")

    def write(self, iterator: Iterator[Any]) -> Accepted:
        from ..amqp import encode_message
        from .replay import ReplayError, send_all

        def items() -> Iterator[tuple[list, bytes]]:
            for i, row in enumerate(iterator):
                message = _archive.row_message(_row_dict(row))
                if not message.has_body:
                    message.body = b""  # AMQP requires a body section
                yield [i], encode_message(message)

        try:
            n = send_all(self.target, items(), lambda position: None, window=self.window, timeout=self.timeout)
        except ReplayError as e:
            raise RuntimeError(f"{self.WHAT} {self.target.url}/{self.target.address}: {e}") from None
        return Accepted(n)


def _row_dict(row: Any) -> dict:
    """An archive row from a Spark Row; a plain string or binary `body` column becomes the body."""
    d = row.asDict(recursive=True)
    body = d.get("body")
    if isinstance(body, (str, bytes, bytearray)):
        d["body"] = _archive.typed_value(bytes(body) if not isinstance(body, str) else body)
    return d


class AmqpStreamWriter(_Sender, DataSourceStreamWriter):
    def commit(self, messages: list[Any], batchId: int) -> None:
        n = sum(m.count for m in messages if isinstance(m, Accepted))
        log.info("%s %s/%s: batch %d: %d message(s) accepted", self.WHAT, self.target.url, self.target.address,
                 batchId, n)

    def abort(self, messages: list[Any], batchId: int) -> None:
        n = sum(m.count for m in messages if isinstance(m, Accepted))
        log.warning("%s: batch %d failed after %d accepted message(s); it runs again", self.WHAT, batchId, n)


class AmqpBatchWriter(_Sender, DataSourceWriter):
    def commit(self, messages: list[Any]) -> None:
        pass
