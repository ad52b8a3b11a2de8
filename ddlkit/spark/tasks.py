"""What runs on Spark's executors: one worker script per task, as a subprocess (no shell).

:class:`TaskPlan` is pure data the driver ships to every task (pickled with the function).
:func:`barrier_task` is a barrier stage's task (MultiWorkerMirroredStrategy: TF_CONFIG
from `ddlkit.environments.spark`); :func:`horovod_task` is the function
``horovod.spark.run`` runs once per rank (the rank's ``HOROVOD_*`` variables are already
set, so the script's ``hvd.init()`` joins the ranks as under ``horovodrun``).
Each worker's output goes to ``logs/<worker>.log`` of the run directory; a failure
raises :class:`TaskFailed` naming the worker, its Spark task and its log tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit import contract

TAIL_LINES = 12


class TaskFailed(RuntimeError):
    """A worker of a Spark task exited non-zero (the driver reports it)."""


@dataclass(frozen=True)
class TaskPlan:
    """What every task runs: the kit's Python, the script and its arguments, the run
    directory, the worker contract's shared variables (collector, token, strategy, Keras)."""

    python: str
    script: str
    args: tuple[str, ...]
    run_dir: str
    env: Mapping[str, str] = field(default_factory=dict)
    threads: int = 1

    def argv(self) -> list[str]:
        return [self.python, self.script, *self.args]


def run_worker(plan: TaskPlan, name: str, env: Mapping[str, str], where: str) -> dict:
    """Run the script as worker ``name`` here; its report, or TaskFailed with its log tail."""
    from ddlkit.launch.process import _child_setup, signal_name
    from ddlkit.launch.runs import tail

    log = contract.log_path(plan.run_dir, name)
    cwd = contract.work_dir(plan.run_dir, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    full = {
        **os.environ,
        **plan.env,
        **contract.thread_env(plan.threads),
        **env,
        contract.WORKER_VAR: name,
        contract.RUN_DIR_VAR: str(plan.run_dir),
        "PYTHONUNBUFFERED": "1",
    }
    started = time.time()
    with open(log, "wb", buffering=0) as out:
        # dies with this task's Python worker (PR_SET_PDEATHSIG), which Spark kills on cancel
        proc = subprocess.Popen(
            plan.argv(),
            cwd=cwd,
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            close_fds=True,
            preexec_fn=_child_setup(os.getpid(), None),
        )
        code = proc.wait()
    if code != 0:
        how = f"was killed by {signal_name(code)}" if code < 0 else f"exited with code {code}"
        raise TaskFailed(f"{name} ({where}) {how}; its log ({log}) ends:\n{tail(log, TAIL_LINES)}")
    return {"worker": name, "where": where, "seconds": round(time.time() - started, 1)}


def barrier_task(plan: TaskPlan):
    """The function of ``rdd.barrier().mapPartitions``: one MWMS worker per task."""

    def task(rows: Iterable) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        from ddlkit.environments.spark import from_barrier_context

        ctx = BarrierTaskContext.get()
        for _ in rows:  # this task's own partition (the stage is over the task indexes)
            pass
        spark = from_barrier_context(ctx)
        env = spark.task_env(plan.run_dir)
        where = f"Spark task {spark.rank} of stage {ctx.stageId()}, on {spark.host}"
        report = run_worker(plan, spark.worker_name(), env, where)
        yield json.dumps(report)

    return task


def horovod_task(plan: TaskPlan) -> dict:
    """Run by ``horovod.spark.run`` in each rank: the script with the rank's environment."""
    rank = int(os.environ["HOROVOD_RANK"])
    where = f"Horovod rank {rank} on {os.environ.get('HOROVOD_HOSTNAME', 'its executor')}"
    return run_worker(plan, contract.rank_name(rank), {}, where)


def report_lines(reports: Iterable[dict]) -> list[str]:
    return [f"{r['worker']}: finished in {r['seconds']} s ({r['where']})" for r in reports]


def log_tails(run_dir: str | Path, names: Iterable[str], n: int = TAIL_LINES) -> str:
    """Each worker's log tail (those that wrote one), for the driver's failure report."""
    from ddlkit.launch.runs import tail

    parts = []
    for name in names:
        path = contract.log_path(run_dir, name)
        if path.exists():
            parts.append(f"--- {name} ({path}) ends:\n{tail(path, n)}")
    return "\n".join(parts)
