"""Progress bars of the long commands (tqdm, on standard error; `--no-progress` turns them off):
replay counts confirmed messages itself, `archive import` counts the bytes read (`read_lines`), and
`backtest` follows the tasks of its Spark jobs (`spark_tasks`)."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


def bar(**kwargs: Any) -> Any:
    """A tqdm bar on standard error, or a bar that shows nothing when tqdm is not installed (it comes
    with the spark extra; `archive import` needs only pyarrow)."""
    try:
        from tqdm import tqdm
    except ImportError:
        kwargs["disable"] = True
        return _Silent()
    return tqdm(file=sys.stderr, **kwargs)


class _Silent:
    n = 0
    total = None

    def update(self, n: int = 1) -> None:
        self.n += n

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def read_lines(stream: IO[bytes], size: int | None, *, disable: bool, desc: str) -> Iterator[str]:
    """The UTF-8 lines of a binary stream, advancing a bar by the bytes read (`size`: the whole, if
    known).  UnicodeDecodeError for bytes that are not UTF-8."""
    progress = bar(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=disable)
    try:
        for raw in stream:
            progress.update(len(raw))
            yield raw.decode("utf-8")
    finally:
        progress.close()


@contextmanager
def spark_tasks(spark: Any, desc: str, *, disable: bool, interval: float = 0.5) -> Iterator[None]:
    """A bar of the tasks of the Spark jobs this thread starts inside the block (their job group),
    polled from Spark's status tracker every `interval` seconds; full when the block ends."""
    sc = spark.sparkContext
    group = f"broker-filter-{uuid.uuid4().hex}"
    progress = bar(total=0, unit="task", desc=desc, disable=disable)
    stop = threading.Event()
    tracker = sc.statusTracker()

    def poll() -> None:
        total = done = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in (info.stageIds if info is not None else []):
                stage_info = tracker.getStageInfo(stage)
                if stage_info is not None:
                    total += stage_info.numTasks
                    done += stage_info.numCompletedTasks
        if total and (total, done) != (progress.total, progress.n):
            progress.total, progress.n = total, done
            progress.refresh()

    def watch() -> None:
        while not stop.wait(interval):
            try:
                poll()
            except Exception:  # noqa: BLE001 - a bar must never break the run (e.g. the JVM going away)
                return

    sc.setJobGroup(group, desc)
    watcher = threading.Thread(target=watch, name="broker-filter-progress", daemon=True)
    if not disable:
        watcher.start()
    try:
        yield
        if not disable:
            stop.set()
            watcher.join()
            poll()
            if progress.total:  # the jobs are done: skipped stages (cached results) count as done too
                progress.n = progress.total
                progress.refresh()
    finally:
        stop.set()
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        progress.close()
