"""Where a worker runs and who starts it: one small base class (Lightning's
``ClusterEnvironment`` is the model).

Two kinds of environment:

- the launcher starts the process (``creates_processes_externally = False``):
  :class:`~ddlkit.environments.local.Local` (a process of this machine) and
  :class:`~ddlkit.environments.ssh.Ssh` (a local ``ssh`` that runs it on a host). The
  launcher asks the environment for the process's environment, its local command, what
  to check before starting, how to stop it softly, and what an exit code means there;
- a scheduler starts the processes and tells each who it is
  (``creates_processes_externally = True``): :class:`~ddlkit.environments.slurm.Slurm`,
  :class:`~ddlkit.environments.kubernetes.Kubernetes` (a pod of an Indexed Job) and
  :class:`~ddlkit.environments.spark.Spark` (a barrier stage's task). Inside such a
  process, :meth:`detect` says whether it runs there and :meth:`world_size`,
  :meth:`global_rank`, :meth:`cluster` and :meth:`task_env` read the scheduler's
  variables.

:func:`ddlkit.environments.for_worker` is the one place that chooses between local and
SSH for a `WorkerSpec` (by its ``host``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ddlkit import contract

if TYPE_CHECKING:
    from ddlkit.cluster import ClusterSpec, Task
    from ddlkit.launch.spec import WorkerSpec


@dataclass(frozen=True)
class Popen:
    """How the launcher starts a worker here: the local argv, its cwd and environment,
    and the first bytes for its stdin (None: no stdin pipe)."""

    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    stdin: bytes | None = None


class Environment:
    """Where a worker runs (subclass it; see the module docstring)."""

    name: ClassVar[str]
    creates_processes_externally: ClassVar[bool] = False
    pins_cores: ClassVar[bool] = False  # this machine's cores and GPUs are the worker's
    forks_here: ClassVar[bool] = False  # the launcher forks the worker itself, on this machine
    heartbeat: ClassVar[bool] = False  # the job writes a heartbeat byte to its stdin
    host: str | None = None  # the host it runs on, None: this machine

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether a process with ``environ`` runs inside this environment."""
        return False

    # -- the launcher starts the process ---------------------------------------------------
    def worker_env(
        self, worker: WorkerSpec, run_dir: Path | str, base: Mapping[str, str]
    ) -> dict[str, str]:
        """The environment the worker's process gets where it runs."""
        raise NotImplementedError

    def check_startable(self, worker: WorkerSpec, env: Mapping[str, str]) -> None:
        """Raise ConfigError for the first reason ``worker`` could not start here."""

    def prepare(self, worker: WorkerSpec) -> None:
        """Make what the worker needs on this machine before it starts (its cwd here)."""

    def popen(self, worker: WorkerSpec, env: Mapping[str, str], base: Mapping[str, str]) -> Popen:
        raise NotImplementedError

    def soft_stop_closes_stdin(self) -> bool:
        """Whether SIGTERM/SIGINT is delivered by closing the process's stdin."""
        return False

    def exit_meaning(self, code: int) -> tuple[str, str] | None:
        """(what happened, the fix) when ``code`` means something here, else None."""
        return None

    def port_busy_fix(self) -> str:
        return (
            "The log says a port was busy: another process holds it. Fix: launch again "
            "with free ports (ddlkit.cluster picks them) or end the process holding it"
        )

    # -- a scheduler starts the processes ------------------------------------------------
    def world_size(self) -> int:
        raise NotImplementedError(f"{self.name}: the launcher knows its workers")

    def global_rank(self) -> int:
        raise NotImplementedError(f"{self.name}: the launcher knows its workers")

    def cluster(self) -> ClusterSpec:
        """The TF cluster of every task the scheduler started, roles in order chief, ps,
        worker; :meth:`global_rank` is this process's place in it."""
        raise NotImplementedError(f"{self.name}: the launcher knows its workers")

    def task(self) -> Task:
        """This process's task in :meth:`cluster`."""
        return self.cluster().tasks[self.global_rank()]

    def tf_config(self) -> dict:
        return self.cluster().tf_config(self.task())

    def worker_name(self) -> str:
        return self.task().name

    def task_env(self, run_dir: str | os.PathLike) -> dict[str, str]:
        """The worker contract's variables for this task: TF_CONFIG, its name, the run dir."""
        return {
            contract.TF_CONFIG_VAR: json.dumps(self.tf_config(), sort_keys=True),
            contract.WORKER_VAR: self.worker_name(),
            contract.RUN_DIR_VAR: str(Path(run_dir).absolute()),
        }

    def __repr__(self) -> str:
        return f"<environment {self.name}{f' {self.host}' if self.host else ''}>"
