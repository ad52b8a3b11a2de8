"""Where a worker runs: this machine, another host over SSH, or a scheduler's allocation.

- :class:`Local`: a process the launcher forks here (pinned to cores, if asked);
- :class:`Ssh`: a local ``ssh`` that runs the worker on its host;
- :class:`Slurm`: ``srun`` starts the tasks; each reads who it is from ``SLURM_*``
  (``creates_processes_externally``) and gets its TF_CONFIG from a `ClusterSpec`;
- :class:`Kubernetes`: an Indexed Job starts the pods; each reads ``JOB_COMPLETION_INDEX``.

:func:`for_worker` is the one place that picks Local or Ssh for a `WorkerSpec`;
:func:`detect` finds the scheduler a process runs under (None: none). A new environment
(Spark, Kubernetes) is one module with an :class:`Environment` subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ddlkit.environments.base import Environment, Popen
from ddlkit.environments.local import LOCAL, Local
from ddlkit.environments.ssh import Ssh

if TYPE_CHECKING:
    from ddlkit.launch.spec import WorkerSpec

# Environments whose scheduler starts the processes, in the order detect() tries them.
SCHEDULERS: list[type[Environment]] = []


def for_worker(worker: WorkerSpec) -> Environment:
    """Where the launcher runs ``worker``: on its ``host`` over SSH, else on this machine."""
    if worker.host is None:
        return LOCAL
    return Ssh(worker.host, worker.ssh)


def detect(environ: Mapping[str, str] | None = None) -> type[Environment] | None:
    """The scheduler environment this process runs under (e.g. Slurm), else None."""
    import os

    env = os.environ if environ is None else environ
    if not SCHEDULERS:
        from ddlkit.environments.kubernetes import Kubernetes
        from ddlkit.environments.slurm import Slurm
        from ddlkit.environments.spark import Spark

        SCHEDULERS.extend((Slurm, Kubernetes, Spark))
    return next((e for e in SCHEDULERS if e.detect(env)), None)


def __getattr__(name: str):
    if name == "Slurm":  # loads the Slurm parsers only when asked
        from ddlkit.environments.slurm import Slurm

        return Slurm
    if name == "Kubernetes":
        from ddlkit.environments.kubernetes import Kubernetes

        return Kubernetes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LOCAL",
    "Environment",
    "Kubernetes",
    "Local",
    "Popen",
    "Slurm",
    "Ssh",
    "detect",
    "for_worker",
]
