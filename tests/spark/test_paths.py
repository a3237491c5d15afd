"""Archive paths through Spark's Hadoop filesystems, and the master a command picks without --master."""

from __future__ import annotations

import json
import os

import pytest

from broker_filter.archive.parquet import ArchiveError, archive_files
from broker_filter.cli import main
from broker_filter.spark.paths import HadoopListing, list_archive, local_path
from broker_filter.spark.replay import archive_identity, default_state_path
from broker_filter.spark.session import configured_master, default_master, spark_defaults

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    d = tmp_path_factory.mktemp("paths")
    src = d / "in.jsonl"
    src.write_text(json.dumps({"message": {"application_properties": {"n": 1}}}) + "\n", encoding="utf-8")
    for part in ("a", "b/c"):
        assert main(["archive", "import", str(src), "-o", str(d / "archive" / part), "--no-progress"]) == 0
    for skipped in ("_temporary/x.parquet", ".hidden/y.parquet", "b/.z.parquet", "b/_w.parquet"):
        (d / "archive" / skipped).parent.mkdir(parents=True, exist_ok=True)
        (d / "archive" / skipped).write_bytes(b"not parquet")
    return d / "archive"


def test_hadoop_listing_follows_the_archive_rules_for_paths_and_uris(archive, spark):
    local = archive_files(archive)
    assert len(local) == 2
    for given in (str(archive), archive.as_uri(), f"file:{archive}"):
        listed = list_archive(spark, given)
        assert [local_path(f) for f in listed] == local, given
        assert all(f.startswith("file:/") for f in listed)
    one = list_archive(spark, local[0])
    assert [local_path(f) for f in one] == local[:1]
    assert HadoopListing(spark).kind(archive.as_uri()) == "dir"


def test_missing_archives_and_unknown_filesystems_are_one_line(archive, spark):
    with pytest.raises(ArchiveError) as e:
        list_archive(spark, (archive / "nothing").as_uri())
    assert str(e.value) == f"{(archive / 'nothing').as_uri()}: no such archive (file or directory)"
    with pytest.raises(ArchiveError, match=r"^nothing: no such archive \(file or directory at file:/"):
        list_archive(spark, "nothing")
    with pytest.raises(ArchiveError) as e:
        list_archive(spark, "nosuchfs://bucket/archive")
    assert str(e.value).startswith("nosuchfs://bucket/archive: this Spark has no Hadoop filesystem for nosuchfs://")
    assert "\n" not in str(e.value) and "Exception" not in str(e.value)
    (archive.parent / "empty").mkdir(exist_ok=True)
    with pytest.raises(ArchiveError, match="no Parquet files"):
        list_archive(spark, (archive.parent / "empty").as_uri())


def test_backtest_reads_a_file_uri_and_refuses_a_missing_one_in_one_line(archive, spark, capsys):
    capsys.readouterr()
    assert main(["backtest", "--archive", archive.as_uri(), "--selector", "n = 1", "--no-progress"]) == 0
    assert "selector: 2 of 2 matched" in capsys.readouterr().out
    assert main(["backtest", "--archive", archive.as_uri() + "-gone", "--selector", "n = 1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"broker-filter backtest: {archive.as_uri()}-gone: no such archive (file or directory)\n"


def test_replay_state_of_a_remote_archive_is_local():
    assert archive_identity("hdfs://nn/a") == "hdfs://nn/a"
    assert archive_identity("rel") == os.path.abspath("rel")
    identity = {"archive": "hdfs://nn/a"}
    assert os.path.dirname(default_state_path("hdfs://nn/a", identity)) == os.curdir


def test_the_master_comes_from_spark_submit_then_sparks_configuration_then_local(tmp_path):
    (tmp_path / "spark-defaults.conf").write_text(
        "# operators' defaults\n! also a comment\nspark.master   spark://h:7077\nspark.a=1\nspark.b : two words\n")
    assert spark_defaults({"SPARK_CONF_DIR": str(tmp_path)}) == {
        "spark.master": "spark://h:7077", "spark.a": "1", "spark.b": "two words"}
    conf = {"SPARK_CONF_DIR": str(tmp_path)}
    assert default_master(conf) == "spark://h:7077"
    assert default_master({**conf, "PYSPARK_SUBMIT_ARGS": "--master local[3] pyspark-shell"}) == "local[3]"
    assert default_master({**conf, "PYSPARK_GATEWAY_PORT": "4321"}) is None  # under spark-submit: its master
    (tmp_path / "home" / "conf").mkdir(parents=True)
    assert configured_master({"SPARK_HOME": str(tmp_path / "home")}) is None
    assert default_master({"SPARK_HOME": str(tmp_path / "home")}) == "local[*]"
    (tmp_path / "home" / "conf" / "spark-defaults.conf").write_text("spark.master yarn\n")
    assert default_master({"SPARK_HOME": str(tmp_path / "home")}) == "yarn"


def test_archive_import_writes_local_paths_and_file_uris_only(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"message": {"application_properties": {"n": 1}}}) + "\n", encoding="utf-8")
    assert main(["archive", "import", str(src), "-o", (tmp_path / "out").as_uri(), "--no-progress"]) == 0
    assert len(archive_files(tmp_path / "out")) == 1
    capsys.readouterr()
    assert main(["archive", "import", str(src), "-o", "hdfs://nn/archive", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("broker-filter archive import: -o hdfs://nn/archive: a local directory or file:// URI")
    assert err.count("\n") == 1
