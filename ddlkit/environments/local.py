"""A worker process on this machine: the launcher forks it with its whole environment."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from ddlkit.environments.base import Environment, Popen
from ddlkit.errors import ConfigError
from ddlkit.launch.spec import WorkerSpec, python_script, worker_env


class Local(Environment):
    name = "local"
    pins_cores = True
    forks_here = True  # so a warm start may fork it from a template (ddlkit.launch.warm)

    def worker_env(
        self, worker: WorkerSpec, run_dir: Path | str, base: Mapping[str, str]
    ) -> dict[str, str]:
        return worker_env(worker, run_dir, base)

    def prepare(self, worker: WorkerSpec) -> None:
        worker.cwd.mkdir(parents=True, exist_ok=True)

    def popen(self, worker: WorkerSpec, env: Mapping[str, str], base: Mapping[str, str]) -> Popen:
        return Popen(tuple(worker.argv), worker.cwd, dict(env))

    def check_startable(self, worker: WorkerSpec, env: Mapping[str, str]) -> None:
        """Reads the file system but changes nothing (``env``: for the PATH of argv[0])."""
        allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        w, where = worker, f"worker {worker.name!r}"
        if not w.cwd.is_dir():
            raise ConfigError(
                f"{where}: working directory {str(w.cwd)!r} does not exist. "
                f"Fix: create it or pass an existing cwd."
            )
        exe = w.argv[0]
        if os.sep in exe:
            path = w.cwd / exe
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise ConfigError(
                    f"{where}: program {exe!r} is not an executable file (looked in "
                    f"{str(w.cwd)!r}). Fix: give the path of an executable, e.g. {sys.executable}."
                )
        elif shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
            raise ConfigError(
                f"{where}: program {exe!r} is not on the worker's PATH. "
                f"Fix: give its full path, e.g. {sys.executable} for Python."
            )
        script = python_script(w.argv)
        if script is not None and not (w.cwd / script).is_file():
            raise ConfigError(
                f"{where}: script {script!r} does not exist (looked in {str(w.cwd)!r}). "
                f"Fix: pass the path of an existing .py file, absolute or relative to cwd."
            )
        if w.cpus is not None:
            if allowed is None:
                raise ConfigError(
                    f"{where}: cpus={w.cpus} but core pinning needs Linux. Fix: pass cpus=None."
                )
            missing = sorted(set(w.cpus) - allowed)
            if missing:
                raise ConfigError(
                    f"{where}: cpus={w.cpus} includes cores {missing} this machine does not "
                    f"offer (available: {sorted(allowed)}). Fix: choose cores from that list."
                )


LOCAL = Local()
