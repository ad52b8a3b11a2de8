"""Spark as an environment: a barrier stage's tasks start the workers, each learns who it is
from ``BarrierTaskContext``.

Spark's scheduler places the tasks (``creates_processes_externally``); in barrier mode it
starts all of them together or none (gang scheduling, which an all-reduce needs: a worker
whose peer is not scheduled waits for it until its own timeout). Each task knows its partition
(its rank), every task's executor address (``getTaskInfos()``) and can exchange a string
with all the others (``allGather``): enough to build TF_CONFIG through
`ddlkit.cluster.ClusterSpec`, the builder every launch path uses, and the worker contract
of :mod:`ddlkit.contract`. The pure part is :class:`Spark` from plain data; the task side
(a free port, ``allGather``) is :func:`from_barrier_context`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlkit._tables import html_table
from ddlkit.cluster import ClusterSpec, Task
from ddlkit.environments.base import Environment
from ddlkit.errors import ConfigError

# PySpark's PythonRunner sets these for every Python worker it starts on an executor.
TASK_VARS = ("SPARK_BUFFER_SIZE", "SPARK_AUTH_SOCKET_TIMEOUT")
INSIDE_FIX = (
    "Fix: call it inside a barrier stage's task, e.g. "
    "rdd.barrier().mapPartitions(fn) or dk.launch.start(..., where=dk.where.Spark(master))."
)


class Spark(Environment):
    """One task of a barrier stage: its rank, every task's ``host:port``, its TF_CONFIG."""

    name = "spark"
    creates_processes_externally = True

    def __init__(self, rank: int, addresses: Sequence[str]) -> None:
        addresses = tuple(addresses)
        if not 0 <= rank < len(addresses):
            raise ConfigError(
                f"Spark task rank {rank} is outside the stage's {len(addresses)} tasks. "
                + INSIDE_FIX
            )
        for address in addresses:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"Spark task address {address!r} is not host:port. " + INSIDE_FIX)
        self.rank = rank
        self.addresses = addresses
        self.host = addresses[rank].rpartition(":")[0]

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return all(environ.get(v) for v in TASK_VARS)

    def world_size(self) -> int:
        return len(self.addresses)

    def global_rank(self) -> int:
        return self.rank

    def cluster(self) -> ClusterSpec:
        """Every task a ``worker`` (MultiWorkerMirroredStrategy; worker 0 is its chief)."""
        tasks = []
        for i, address in enumerate(self.addresses):
            host, _, port = address.rpartition(":")
            tasks.append(Task("worker", i, host, int(port)))
        return ClusterSpec(tuple(tasks))

    def _repr_html_(self) -> str:
        rows = [(i, a, "this task" if i == self.rank else "") for i, a in enumerate(self.addresses)]
        return html_table(("rank", "TF server", ""), rows)


def from_barrier_context(ctx=None) -> Spark:
    """This task's environment, inside a barrier stage: a free port on this task's host
    (from ``getTaskInfos()``), then every task's ``host:port`` through ``allGather``."""
    from pyspark import BarrierTaskContext

    from ddlkit.cluster.ports import free_ports

    ctx = ctx or BarrierTaskContext.get()
    if ctx is None:
        raise ConfigError("no BarrierTaskContext: this is not a barrier task. " + INSIDE_FIX)
    rank = ctx.partitionId()
    host = ctx.getTaskInfos()[rank].address.rpartition(":")[0]
    port = free_ports(1, host)[0]  # free now; TensorFlow's server binds it soon after
    addresses = ctx.allGather(f"{host}:{port}")
    return Spark(rank, addresses)
