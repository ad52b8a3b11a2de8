"""MNIST as Parquet through a Spark DataFrame, and MWMS training on each task's own rows."""

from __future__ import annotations

import pytest

from ddlkit.spark.data import train_on_partitions, write_mnist_parquet

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark")]
EXAMPLES = 512


@pytest.fixture
def spark(spark_cluster, data_env, monkeypatch):
    import sys

    from pyspark.sql import SparkSession

    from ddlkit.spark.driver import session_conf

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # the executors' Python: the kit's
    builder = SparkSession.builder.master(spark_cluster.master_url).appName("ddlkit test")
    for key, value in session_conf(spark_cluster.master_url, 2).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()


def test_tasks_train_on_their_own_parquet_partitions(spark, tmp_path):
    path = write_mnist_parquet(spark, tmp_path / "mnist.parquet", EXAMPLES, partitions=2)
    assert len(list((tmp_path / "mnist.parquet").glob("part-*.parquet"))) == 2
    df = spark.read.parquet(path)
    assert df.count() == EXAMPLES
    reports = sorted(train_on_partitions(df, 2, steps=3, batch=16), key=lambda r: r["task"])
    assert [r["task"] for r in reports] == [0, 1]
    assert sum(r["examples"] for r in reports) == EXAMPLES  # every row, each on one task
    assert all(0 < r["examples"] < EXAMPLES for r in reports)
    assert reports[0]["weights_checksum"] == reports[1]["weights_checksum"]
