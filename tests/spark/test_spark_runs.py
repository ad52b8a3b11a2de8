"""The kit's own scripts as Spark tasks on a real 2-worker standalone cluster (no mocks).

MultiWorkerMirroredStrategy as a barrier stage, Horovod through ``horovod.spark.run``:
each trains a few steps, both workers' records reach the collector, the workers end with
identical weights; a worker killed mid-run fails the job fast, naming the task; more
workers than free slots is refused; MNIST as Parquet, and the spark-submit recipe
(launch/spark/train_on_spark.py) training on each task's own rows.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest
from harness.procutil import alive, wait_until
from harness.spark import refused

from ddlkit.errors import WorkerFailedError
from ddlkit.launch import run as run_mod
from ddlkit.procs import descendants
from ddlkit.spark.data import to_arrays, write_mnist_parquet
from ddlkit.where import Spark

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
STEPS = ["--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "32"]
pytestmark = pytest.mark.slow
PARQUET_EXAMPLES = 512


def _start(cluster, script, strategy, tmp_path, args=STEPS):
    return run_mod.start(
        LAUNCH / script,
        strategy=strategy,
        workers=2,
        args=args,
        where=Spark(cluster.master_url),
        runs_dir=tmp_path,
    )


def _trained_alike(run, names):
    result = run.wait(timeout=300)
    assert result.ok, run.tail("spark-driver", 60)
    reports = run.results()
    assert sorted(reports) == names, (reports, run.tail("spark-driver", 40))
    a, b = (reports[n] for n in names)
    assert a["weights_checksum"] == b["weights_checksum"], "workers diverged"
    assert a["replicas"] == b["replicas"] == 2 and a["steps"] == 4
    for name in names:  # every worker's steps reached this process's collector
        assert [r.kind for r in run.records(name)].count("step") == 4, name
        assert (run.run_dir / "logs" / f"{name}.log").is_file()
    assert run.status()["spark-driver"].state == "finished"


def test_mwms_trains_as_a_barrier_stage(spark_cluster, data_env, tmp_path):
    run = _start(spark_cluster, "train_multi_worker.py", "multi_worker", tmp_path)
    _trained_alike(run, ["worker-0", "worker-1"])
    assert "worker-1: finished" in run.tail("spark-driver")


def test_horovod_trains_one_rank_per_task(spark_cluster, data_env, tmp_path):
    run = _start(spark_cluster, "train_horovod.py", "horovod", tmp_path)
    _trained_alike(run, ["rank-0", "rank-1"])


def _worker_pid(cluster, script: str) -> int | None:
    """The training process a Spark task started (below a Worker daemon)."""
    for daemon in cluster.procs[1:]:
        for pid, cmd in descendants(daemon.pid):
            if script in cmd and "ddlkit.spark" not in cmd and "worker-1" in _env(pid):
                return pid
    return None


def _env(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_killed_task_fails_the_job_fast_naming_it(spark_cluster, data_env, tmp_path):
    args = ["--epochs", "1", "--steps-per-epoch", "100000", "--batch-size", "32"]
    run = _start(spark_cluster, "train_multi_worker.py", "multi_worker", tmp_path, args)
    assert wait_until(lambda: run.records("worker-1"), 240, step=0.2), run.tail("spark-driver")
    pid = _worker_pid(spark_cluster, "train_multi_worker.py")
    assert pid is not None
    before = [p for d in spark_cluster.procs[1:] for p, _ in descendants(d.pid)]
    killed = time.monotonic()
    import os

    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as failed:
        run.wait(timeout=60)
    # Seconds here (the task's wrapper sees its child die, Spark aborts the barrier stage);
    # left alone, the other worker would wait in its all-reduce for TensorFlow's own timeout.
    assert time.monotonic() - killed < 30, "the job took too long to fail"
    text = str(failed.value)
    assert "worker-1" in text and "Spark task 1" in text and "SIGKILL" in text, text
    assert "ends:" in text, text  # the worker's log tail
    # Every process the job made is gone: its workers, their Python tasks, the driver.
    driver = run.job._procs["spark-driver"].pid
    assert wait_until(lambda: not any(alive(p) for p in before if p != pid), 15)
    assert not alive(driver)
    assert spark_cluster.running  # the cluster itself serves the next job


def test_more_workers_than_the_clusters_free_slots(spark_cluster, tmp_path):
    message = refused(tmp_path, cluster=spark_cluster, master=spark_cluster.master_url, workers=3)
    assert f"{spark_cluster.master_url} has 2 free" in message, message
    assert "fail the job after about 60 s" in message and "local_cluster(workers=3)" in message


@pytest.fixture
def spark(spark_cluster, data_env, monkeypatch):
    import sys

    from pyspark.sql import SparkSession

    from ddlkit.spark.driver import session_conf

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # the executors' Python: the kit's
    builder = SparkSession.builder.master(spark_cluster.master_url).appName("ddlkit test")
    for key, value in session_conf(spark_cluster.master_url, 2).items():
        builder = builder.config(key, value)
    # A SparkContext made in the main thread takes over SIGINT (its handler cancels its jobs)
    # and leaves it so after stop(): later tests in this process that interrupt themselves
    # (tests/interactive/test_live_mwms.py) would get the stopped context's handler.
    previous = signal.getsignal(signal.SIGINT)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        signal.signal(signal.SIGINT, previous)


def test_the_clusters_jvms_start_lean(spark, spark_cluster):
    """The daemons and the executors they start carry LEAN_JVM_OPTIONS in the environment
    every JVM reads at start; a driver on the loopback master has them on its command line."""
    from ddlkit.spark.cluster import LEAN_JVM_OPTIONS

    spark.sparkContext.parallelize(range(2), 2).count()  # the executors are up
    executors = spark_cluster.executor_pids()
    assert executors
    for pid in [p.pid for p in spark_cluster.procs] + executors:
        java_options = dict(
            var.split("=", 1) for var in _env(pid).split("\0") if var.startswith("JAVA_TOOL")
        )
        assert java_options["JAVA_TOOL_OPTIONS"].split()[:2] == list(LEAN_JVM_OPTIONS), pid
    driver = spark.sparkContext._gateway.proc.pid  # pyspark's JVM: spark-class execs java
    assert all(
        option in Path(f"/proc/{driver}/cmdline").read_bytes().decode().split("\0")
        for option in LEAN_JVM_OPTIONS
    )


def test_mnist_is_written_as_parquet_one_file_per_partition(spark, tmp_path):
    """(Training on each task's own partitions: the spark-submit recipe's test below.)"""
    path = write_mnist_parquet(spark, tmp_path / "mnist.parquet", PARQUET_EXAMPLES, partitions=2)
    assert len(list((tmp_path / "mnist.parquet").glob("part-*.parquet"))) == 2
    df = spark.read.parquet(path)
    assert df.count() == PARQUET_EXAMPLES
    x, y = to_arrays(df.limit(3).collect())
    assert x.shape == (3, 28, 28, 1) and y.shape == (3,) and 0.0 <= x.min() <= x.max() <= 1.0


def _mnist_parquet(path: Path, examples: int, files: int) -> None:
    """MNIST's first rows as Parquet files (``label INT, image BINARY``), written without Spark:
    the cluster's two slots stay free for the application under test."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ddlkit import data

    (x, y), _ = data.load("mnist")
    path.mkdir()
    for i, rows in enumerate(np.array_split(np.arange(examples), files)):
        table = pa.table({
            "label": pa.array(y[rows], pa.int32()),
            "image": pa.array([x[j].tobytes() for j in rows], pa.binary()),
        })  # fmt: skip
        pq.write_table(table, path / f"part-{i}.parquet")


def test_the_spark_submit_recipe_trains_from_parquet_and_returns_every_tasks_result(
    spark_cluster, data_env, tmp_path
):
    """launch/spark/train_on_spark.py as spark-submit runs it: the driver gets each task's
    numbers and printed lines through collect(), with no disk shared with the executors
    but the data's; dynamic allocation on is refused before any stage, with the fix."""
    import json
    import os
    import subprocess
    import sys

    from ddlkit.spark.cluster import spark_home
    from ddlkit.spark.driver import session_conf

    data = tmp_path / "mnist.parquet"
    _mnist_parquet(data, PARQUET_EXAMPLES, files=2)
    conf = {**session_conf(spark_cluster.master_url, 2), "spark.pyspark.python": sys.executable}
    submit = [str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url]
    for key, value in conf.items():
        submit += ["--conf", f"{key}={value}"]
    script = [str(LAUNCH / "spark" / "train_on_spark.py"), "--data", str(data), "--workers", "2",
              "--steps", "3", "--batch-size", "16"]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [*submit, "--conf", "spark.dynamicAllocation.enabled=false", *script],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    lines = [x.removeprefix("RESULT ") for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    results = [json.loads(x) for x in lines]
    assert [r["task"] for r in results] == [0, 1], done.stdout
    assert sum(r["examples"] for r in results) == PARQUET_EXAMPLES  # every row, on one task
    assert all(0 < r["examples"] < PARQUET_EXAMPLES for r in results)  # each its own part
    assert results[0]["weights_checksum"] == pytest.approx(results[1]["weights_checksum"])
    assert all(any("3/3" in line for line in r["printed"]) for r in results), results
    refused = subprocess.run(
        [*submit, "--conf", "spark.dynamicAllocation.enabled=true", *script],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    # spark-submit's PythonRunner merges the driver program's stderr into its stdout
    assert refused.returncode == 2, refused.stdout[-3000:]
    assert "error: spark.dynamicAllocation.enabled is true" in refused.stdout
    assert "Fix: spark-submit --conf spark.dynamicAllocation.enabled=false" in refused.stdout
