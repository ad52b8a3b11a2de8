"""`ddlkit.environments.spark.Spark`: a barrier task's rank and addresses -> the worker
contract (pure; the real barrier stage is in tests/spark/test_spark_runs.py)."""

from __future__ import annotations

import json

import pytest

from ddlkit import contract, environments
from ddlkit.environments.spark import Spark
from ddlkit.errors import ConfigError

ADDRESSES = ["10.0.0.1:41000", "10.0.0.2:41001", "10.0.0.2:41002"]


def test_each_task_gets_the_same_cluster_and_its_own_index(tmp_path):
    envs = [Spark(rank, ADDRESSES).task_env(tmp_path) for rank in range(3)]
    configs = [json.loads(e[contract.TF_CONFIG_VAR]) for e in envs]
    assert all(c["cluster"] == {"worker": ADDRESSES} for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert [e[contract.WORKER_VAR] for e in envs] == ["worker-0", "worker-1", "worker-2"]
    assert {e[contract.RUN_DIR_VAR] for e in envs} == {str(tmp_path.absolute())}
    spark = Spark(2, ADDRESSES)
    assert (spark.world_size(), spark.global_rank(), spark.host) == (3, 2, "10.0.0.2")
    assert Spark.creates_processes_externally


def test_detect_reads_pysparks_worker_variables():
    assert Spark.detect({"SPARK_BUFFER_SIZE": "65536", "SPARK_AUTH_SOCKET_TIMEOUT": "15"})
    assert not Spark.detect({"SPARK_HOME": "/opt/spark"})
    task = {"SPARK_BUFFER_SIZE": "65536", "SPARK_AUTH_SOCKET_TIMEOUT": "15"}
    assert environments.detect(task) is Spark  # the kit's one detect() tries Spark too


@pytest.mark.parametrize(("rank", "addresses"), [(3, ADDRESSES), (0, ["nohost"]), (0, [])])
def test_bad_task_data_is_refused(rank, addresses):
    with pytest.raises(ConfigError, match="Fix: call it inside a barrier stage"):
        Spark(rank, addresses)
