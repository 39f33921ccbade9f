"""The maintenance SparkSession's settings and the storage URLs Spark can reach."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from state_engine.config import Settings
from state_engine.errors import ConfigurationError, StorageNotReachableFromSpark
from state_engine.jobs.spark import (
    build_spark,
    local_cores,
    shuffle_partitions_for,
    spark_conf,
)
from state_engine.maintenance.reachable import spark_url


@pytest.mark.parametrize(
    "url,expected",
    [
        ("file:///data/ckpt/chk-1/a.parquet", "file:///data/ckpt/chk-1/a.parquet"),
        ("s3://bucket/ckpt/a.parquet", "s3a://bucket/ckpt/a.parquet"),
        ("S3://bucket/a", "s3a://bucket/a"),
        ("s3a://bucket/a", "s3a://bucket/a"),
        ("gs://bucket/a", "gs://bucket/a"),
        ("hdfs://nn:8020/ckpt/a", "hdfs://nn:8020/ckpt/a"),
    ],
)
def test_spark_urls(url, expected):
    assert spark_url(url) == expected


def test_a_plain_path_becomes_an_absolute_file_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert spark_url("ckpt/a.parquet") == (tmp_path / "ckpt" / "a.parquet").as_uri()
    assert spark_url("/abs/x") == Path("/abs/x").as_uri()


@pytest.mark.parametrize("url", ["memory://root/job/chk-1", "ftp://host/x", "az://c/x"])
def test_storage_spark_cannot_reach_is_refused_with_advice(url):
    with pytest.raises(StorageNotReachableFromSpark, match="file://.*s3://.*gs://.*hdfs://"):
        spark_url(url)
    with pytest.raises(ConfigurationError):  # the CLI's generic handling still applies
        spark_url(url)


def test_memory_storage_error_says_why():
    with pytest.raises(StorageNotReachableFromSpark, match="inside one Python process"):
        spark_url("memory://x")


def test_local_cores():
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[*]") == os.cpu_count()
    assert local_cores("local[2, 4]") == 2
    assert local_cores("spark://host:7077") is None
    assert local_cores("yarn") is None


def test_shuffle_partitions_follow_cores_and_data():
    assert shuffle_partitions_for(None, 2) == 4
    assert shuffle_partitions_for(10 << 20, 2) == 4
    assert shuffle_partitions_for(10 << 30, 2) == 80  # 10 GiB / 128 MiB


def test_conf_from_settings(tmp_path):
    settings = Settings.from_env(
        {"STATEKEEPER_HOME": str(tmp_path), "STATEKEEPER_SPARK_MASTER": "spark://m:7077"}
    )
    conf = spark_conf(settings, data_bytes=1 << 30)
    assert conf["spark.master"] == "spark://m:7077"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert conf["spark.sql.shuffle.partitions"] == "16"  # a cluster: assume 8 cores
    local = spark_conf(Settings.from_env({"STATEKEEPER_HOME": str(tmp_path)}), ui=True)
    assert local["spark.master"] == "local[*]" and local["spark.ui.enabled"] == "true"
    assert spark_conf(settings, master="local[2]", extra={"spark.x": "1"})["spark.x"] == "1"


@pytest.mark.spark
def test_build_spark_reuses_the_running_session(spark):
    assert build_spark() is spark
    import pyspark

    assert pyspark.__version__ == "4.3.0"
    assert spark.range(3).count() == 3


def test_the_application_name_says_which_job_maintenance_and_airflow_task_ran() -> None:
    from state_engine.jobs.spark import app_name, spark_conf

    name = app_name(
        "rescale", "fraud", dag_id="statekeeper_rescale", task_id="rescale",
        airflow_run_id="manual__2026-11-24T03:00:00",
    )  # fmt: skip
    expected = "statekeeper-rescale-fraud [statekeeper_rescale.rescale manual__2026-11-24T03:00:00]"
    assert name == expected
    assert app_name("expire", "j") == "statekeeper-expire-j"
    assert "\n" not in app_name("expire", "a\nb")
    assert spark_conf(master="local[1]", name=name)["spark.app.name"] == name


def test_an_unreachable_standalone_master_is_named_at_once() -> None:
    import socket

    from state_engine.errors import SparkMasterUnreachable
    from state_engine.jobs.spark import check_master_reachable

    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SparkMasterUnreachable, match=rf"spark://127.0.0.1:{port} is unreachable"):
        check_master_reachable(f"spark://127.0.0.1:{port}")
    check_master_reachable("local[2]")  # nothing to reach
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        # the second master of a list answers: that is enough
        check_master_reachable(f"spark://127.0.0.1:{port},127.0.0.1:{s.getsockname()[1]}")
