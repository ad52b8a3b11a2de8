"""Spark as a home for distributed training: a local standalone cluster, and runs of the
kit's scripts as Spark tasks (``dk.launch.start(..., where=dk.where.Spark(URL))``).

- :func:`local_cluster`: a real standalone master + N workers on 127.0.0.1
  (:mod:`ddlkit.spark.cluster`);
- :mod:`ddlkit.spark.submit`: the checks and the driver process of a run;
  :mod:`ddlkit.spark.driver`: that process (a barrier stage, or ``horovod.spark.run``) and
  its session settings (``dk.spark.driver.session_conf``);
  :mod:`ddlkit.spark.tasks`: what runs on the executors;
- :mod:`ddlkit.spark.data`: MNIST as Parquet through a DataFrame, read per task;
- the task's side of the worker contract: `ddlkit.environments.spark.Spark`.
"""

from __future__ import annotations

from ddlkit.spark import data, driver
from ddlkit.spark.cluster import LocalCluster, find_java, local_cluster, spark_home

__all__ = ["LocalCluster", "data", "driver", "find_java", "local_cluster", "spark_home"]
