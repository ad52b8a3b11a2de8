"""Start, watch and stop a job of worker processes (strategy-agnostic: it runs specs).

>>> spec = JobSpec(run_id, run_dir, workers=(WorkerSpec("worker-0", argv, env, cwd, log), ...))
>>> with Job.start(spec) as job:
...     result = job.wait()

Modules: :mod:`.spec` (what to run, pure data), :mod:`.process` (the one place that
forks, signals and reaps), :mod:`.job` (the running job), :mod:`.status` (worker
states, results, the live table), :mod:`.runs` (run ids, run directory layout,
``job.json``), :mod:`.remote` (the local ``ssh`` command of a worker on another host),
:mod:`.plan` (a `LaunchConfig` to a `JobSpec`, through :mod:`ddlkit.strategies`),
:mod:`.run` (``start()``: plan, collector, job).

The names below load on first use, so importing one module of this package (e.g.
``ddlkit.launch.spec`` from a strategy) does not import the others.
"""

from __future__ import annotations

import importlib

from ddlkit._lazy import lazy_attributes

_LAZY = {
    "Job": "ddlkit.launch.job",
    "JobResult": "ddlkit.launch.status",
    "JobSpec": "ddlkit.launch.spec",
    "LaunchConfig": "ddlkit.launch.plan",
    "Run": "ddlkit.launch.run",
    "STRATEGIES": "ddlkit.launch.plan",
    "RunInfo": "ddlkit.launch.runs",
    "StatusTable": "ddlkit.launch.status",
    "WorkerSpec": "ddlkit.launch.spec",
    "WorkerStatus": "ddlkit.launch.status",
    "list_runs": "ddlkit.launch.runs",
    "log_path": "ddlkit.launch.runs",
    "metrics_dir": "ddlkit.launch.runs",
    "new_run_id": "ddlkit.launch.runs",
    "runs_table": "ddlkit.launch.runs",
    "start": "ddlkit.launch.run",
    "thread_env": "ddlkit.launch.spec",
    "worker_env": "ddlkit.launch.spec",
}
_MODULES = ("devices", "job", "plan", "process", "remote", "run", "runs", "spec", "status")
__all__ = sorted(_LAZY)
_getattr, __dir__ = lazy_attributes(__name__, _LAZY, globals(), [*__all__, *_MODULES])


def __getattr__(name: str):
    if name in _MODULES:  # dk.launch.plan, dk.launch.devices, ... as before
        return importlib.import_module(f"{__name__}.{name}")
    return _getattr(name)
