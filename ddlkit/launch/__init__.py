"""Start, watch and stop a job of worker processes (strategy-agnostic: it runs specs).

>>> spec = JobSpec(run_id, run_dir, workers=(WorkerSpec("worker-0", argv, env, cwd, log), ...))
>>> with Job.start(spec) as job:
...     result = job.wait()

Modules: :mod:`.spec` (what to run, pure data), :mod:`.process` (the one place that
forks, signals and reaps), :mod:`.job` (the running job), :mod:`.status` (worker
states, results, the live table), :mod:`.runs` (run ids, run directory layout,
``job.json``), :mod:`.remote` (the local ``ssh`` command of a worker on another host).
"""

from __future__ import annotations

from ddlkit.launch.job import Job
from ddlkit.launch.plan import STRATEGIES, LaunchConfig
from ddlkit.launch.run import Run, start
from ddlkit.launch.runs import (
    RunInfo,
    list_runs,
    log_path,
    metrics_dir,
    new_run_id,
    runs_table,
)
from ddlkit.launch.spec import JobSpec, WorkerSpec, thread_env, worker_env
from ddlkit.launch.status import JobResult, StatusTable, WorkerStatus

__all__ = [
    "Job",
    "JobResult",
    "JobSpec",
    "LaunchConfig",
    "Run",
    "STRATEGIES",
    "RunInfo",
    "StatusTable",
    "WorkerSpec",
    "WorkerStatus",
    "list_runs",
    "log_path",
    "metrics_dir",
    "new_run_id",
    "runs_table",
    "start",
    "thread_env",
    "worker_env",
]
