"""Archive and output paths as Spark reads and writes them: any Hadoop filesystem URI (`file://`,
`hdfs://`, `s3a://` where the Spark installation has the connector), or a plain path, which means what
it means to Spark (resolved against Hadoop's `fs.defaultFS`: the local filesystem unless the cluster's
Hadoop configuration says otherwise).

Theory of operation: the driver lists an archive through the JVM's `org.apache.hadoop.fs.FileSystem`
of the session (its Hadoop configuration, credentials and connectors), with the archive layout's
rules (`archive.parquet.archive_files`: Parquet files, names starting with "." or "_" skipped), and
hands Spark the qualified file paths, so the executors read exactly the files the driver listed,
wherever they run.  A filesystem Hadoop cannot reach (no connector for the scheme, a name node that
does not answer, a permission) is an `ArchiveError` naming the path and Hadoop's reason.
"""

from __future__ import annotations

import re
from typing import Any

from ..archive.parquet import ArchiveError, archive_files


class HadoopListing:
    """A listing (see `archive.parquet.LocalListing`) over the session's Hadoop filesystems."""

    def __init__(self, spark: Any):
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _resolve(self, path: str) -> tuple[Any, Any]:
        p = self._jvm.org.apache.hadoop.fs.Path(path)
        return p, self._call(path, p.getFileSystem, self._conf)

    def qualify(self, path: str) -> str:
        """`path` as a fully qualified URI (`file:/abs/dir`, `hdfs://nn:8020/dir`)."""
        p, fs = self._resolve(path)
        return str(self._call(path, fs.makeQualified, p).toString())

    def kind(self, path: str) -> str | None:
        p, fs = self._resolve(path)
        status = self._call(path, fs.getFileStatus, p, missing=None)
        if status is None:
            return None
        return "dir" if status.isDirectory() else "file"

    def entries(self, directory: str) -> Any:
        p, fs = self._resolve(directory)
        for status in self._call(directory, fs.listStatus, p):
            child = status.getPath()
            yield str(child.getName()), str(child.toString()), bool(status.isDirectory())

    def _call(self, path: str, method: Any, *args: Any, missing: Any = ...) -> Any:
        try:
            return method(*args)
        except Exception as e:  # py4j's Py4JJavaError carries the Java exception; anything else is not Hadoop's
            error = getattr(e, "java_exception", None)
            if error is None:
                raise
            kind = str(error.getClass().getName())
            if missing is not ... and kind == "java.io.FileNotFoundException":
                return missing
            reason = java_reason(e)
            if kind.endswith("UnsupportedFileSystemException") or "FileSystem not found" in reason:
                scheme = path.partition(":")[0]
                reason = (f"this Spark has no Hadoop filesystem for {scheme}:// ({reason}); add its connector to "
                          f"Spark's classpath (for s3a: hadoop-aws of Spark's Hadoop version, e.g. with "
                          f"spark-submit --packages)")
            raise ArchiveError(f"{path}: {reason}") from None


_JAVA_NAME = re.compile(r"\b(?:[a-z_][a-z0-9_]*\.)+[A-Z]\w*(?:Exception|Error): ")


def java_reason(error: BaseException) -> str:
    """The first line of what went wrong, from the Java exception when there is one, without Java's
    exception class names."""
    java = getattr(error, "java_exception", None)
    text = None
    if java is not None:
        try:
            text = java.getMessage() or java.getClass().getSimpleName()
        except Exception:  # the gateway is gone
            text = None
    lines = str(text or error).strip().splitlines()
    return _JAVA_NAME.sub("", lines[0]).strip() if lines else "no reason given"


def list_archive(spark: Any, path: str) -> list[str]:
    """The archive's Parquet files (qualified paths); ArchiveError when there are none or it is not there."""
    listing = HadoopListing(spark)
    qualified = listing.qualify(path)
    if listing.kind(qualified) is None:
        where = "" if is_uri(path) else f" at {qualified}"  # where a plain path led
        raise ArchiveError(f"{path}: no such archive (file or directory{where})")
    files = archive_files(qualified, listing)
    if not files:
        raise ArchiveError(f"{path}: no Parquet files in the archive")
    return files


def check_directory(spark: Any, path: str, what: str) -> str:
    """`path` qualified, after checking it is a directory or nothing yet (ArchiveError otherwise)."""
    listing = HadoopListing(spark)
    qualified = listing.qualify(path)
    if listing.kind(qualified) == "file":
        raise ArchiveError(f"{what} {path} is a file, not a directory")
    return qualified


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")


def is_uri(path: str) -> bool:
    """`path` names its filesystem (`scheme:/...`); a plain path does not."""
    return bool(_URI.match(path))


def local_path(qualified: str) -> str | None:
    """The local path of a qualified `file:` URI, None for any other filesystem."""
    if not qualified.startswith("file:"):
        return None
    rest = qualified[len("file:"):]
    if rest.startswith("//"):  # file://authority/path (Hadoop writes file:/path)
        rest = "/" + rest[2:].partition("/")[2]
    return rest
