"""What to run, as pure data: one :class:`WorkerSpec` per process, a :class:`JobSpec` per job.

Nothing here starts a process or touches the file system; :mod:`ddlkit.launch.job`
runs these specs. The launcher layer does not know about strategies: whoever builds
the specs (TF_CONFIG, Horovod ranks, GPU slices) puts that into ``env`` and ``argv``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlkit._tables import html_table
from ddlkit.contract import RUN_DIR_VAR, WORKER_VAR, check_name
from ddlkit.contract import THREAD_VARS as THREAD_VARS  # re-exported
from ddlkit.contract import thread_env as thread_env  # re-exported
from ddlkit.errors import ConfigError
from ddlkit.hosts.ssh import SshOptions, check_host

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
# Python options that take the next argument as their value.
_PYTHON_VALUE_OPTS = {"-W", "-X", "--check-hash-based-pycs"}
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|KEY", re.IGNORECASE)
_NO_GPU = ("", "-1")


def is_secret(name: str) -> bool:
    """Whether a variable's name says it holds a secret (a token, a key, a password)."""
    return bool(_SECRET.search(name))


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking variables (tokens, keys) replaced by ``***``."""
    return {k: ("***" if _SECRET.search(k) else v) for k, v in env.items()}


def check_env(env, where: str) -> dict[str, str]:
    """``env`` as a dict of environment variables, or one ConfigError naming ``where``
    (e.g. ``"worker 'worker-0'"``), the variable and the fix (pure)."""
    env = dict(env)
    for key, value in env.items():
        if not (isinstance(key, str) and key and "=" not in key and "\0" not in key):
            raise ConfigError(
                f"{where}: {key!r} is not a valid environment variable name. "
                f"Fix: use a non-empty string without '=' or NUL."
            )
        if not isinstance(value, str) or "\0" in value:
            raise ConfigError(
                f"{where}: environment variable {key}={value!r} is not a string. "
                f"Fix: convert it with str() (JSON for structures like TF_CONFIG)."
            )
    return env


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """One worker process: its command, environment additions, directory and log file.

    ``env`` holds only the additions to the base environment (TF_CONFIG, ranks,
    CUDA_VISIBLE_DEVICES...). ``cpus`` pins the process to those cores (only for
    workers without a GPU); ``threads`` sets the thread-count variables of
    :func:`thread_env`. A ``service`` worker is a server that never exits by itself
    (a parameter server): the job ends it once every other worker has finished. An
    ``expendable`` worker is one the strategy survives losing (a ParameterServerStrategy
    worker: the coordinator reschedules its steps elsewhere): its death is recorded, but
    it does not stop the job.

    A worker with a ``host`` runs there over SSH (``ssh`` options): the local process is
    ``ssh``, whose output is the worker's log; ``env`` and the launcher's variables are set
    on the host and ``cwd`` is made there (see :mod:`ddlkit.launch.remote`).
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path
    cpus: tuple[int, ...] | None = None
    threads: int | None = None
    service: bool = False
    expendable: bool = False
    host: str | None = None
    ssh: SshOptions | None = None

    def __post_init__(self) -> None:
        check_name("worker name", self.name)
        if self.host is not None:
            check_host(self.host)
            if self.cpus is not None:
                raise ConfigError(
                    f"worker {self.name!r} runs on {self.host} but has cpus={self.cpus!r}: "
                    f"ddlkit pins cores only on this machine. Fix: pass cpus=None."
                )
            if not isinstance(self.ssh, SshOptions):
                object.__setattr__(self, "ssh", SshOptions())
        if isinstance(self.argv, str | bytes):
            raise ConfigError(
                f"worker {self.name!r}: argv must be a list of arguments, not the string "
                f"{self.argv!r}. Fix: pass e.g. ('python', 'train.py', '--epochs', '2'); "
                f"ddlkit never runs a shell command string."
            )
        argv = tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in self.argv)
        if not argv:
            raise ConfigError(
                f"worker {self.name!r} has an empty argv, so there is nothing to run. "
                f"Fix: pass the command as a list, e.g. ('python', 'train.py')."
            )
        bad = [a for a in argv if not isinstance(a, str) or "\0" in a]
        if bad:
            raise ConfigError(
                f"worker {self.name!r}: argv items must be strings without NUL bytes; "
                f"got {bad!r}. Fix: convert each argument with str()."
            )
        object.__setattr__(self, "argv", argv)
        env = check_env(self.env, f"worker {self.name!r}")
        object.__setattr__(self, "env", types.MappingProxyType(env))
        object.__setattr__(self, "cwd", Path(self.cwd))
        object.__setattr__(self, "log_path", Path(self.log_path))
        self._check_cpus()
        self._check_threads()

    def _check_cpus(self) -> None:
        if self.cpus is None:
            return
        cpus = tuple(self.cpus)
        if (
            not cpus
            or any(type(c) is not int or c < 0 for c in cpus)
            or len(set(cpus)) != len(cpus)
        ):
            raise ConfigError(
                f"worker {self.name!r}: cpus={self.cpus!r} is not a list of distinct core "
                f"numbers. Fix: pass e.g. cpus=(0,) or cpus=(0, 1), or cpus=None for no pinning."
            )
        gpus = self.env.get("CUDA_VISIBLE_DEVICES", "").strip()
        if gpus not in _NO_GPU:
            raise ConfigError(
                f"worker {self.name!r} has both cpus={cpus!r} and CUDA_VISIBLE_DEVICES={gpus!r}; "
                f"core pinning is only for CPU-only workers (it starves a GPU's input pipeline). "
                f"Fix: drop cpus, or give the worker no GPU."
            )
        object.__setattr__(self, "cpus", cpus)

    def _check_threads(self) -> None:
        if self.threads is None:
            return
        if type(self.threads) is not int or self.threads < 1:
            raise ConfigError(
                f"worker {self.name!r}: threads={self.threads!r} must be a whole number >= 1. "
                f"Fix: pass e.g. threads=1, or threads=None to leave the thread counts alone."
            )
        for key, value in thread_env(self.threads).items():
            if key in self.env and self.env[key] != value:
                raise ConfigError(
                    f"worker {self.name!r}: threads={self.threads} sets {key}={value}, but env "
                    f"also sets {key}={self.env[key]!r}. Fix: drop {key} from env or drop threads."
                )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description (secret-looking variables redacted)."""
        return {
            "name": self.name,
            "argv": list(self.argv),
            "env": redact(self.env),
            "cwd": str(self.cwd),
            "log_path": str(self.log_path),
            "cpus": None if self.cpus is None else list(self.cpus),
            "threads": self.threads,
            "service": self.service,
            "expendable": self.expendable,
            "host": self.host,
        }

    def _row(self) -> list[object]:
        env = ", ".join(f"{k}={v}" for k, v in redact(self.env).items())
        cpus = None if self.cpus is None else ",".join(map(str, self.cpus))
        return [
            self.name,
            self.host or "localhost",
            shlex.join(self.argv),
            env,
            self.cwd,
            self.log_path,
            cpus,
            self.threads,
        ]

    def _repr_html_(self) -> str:
        return html_table(_WORKER_HEADERS, [self._row()])


_WORKER_HEADERS = ("worker", "host", "command", "env additions", "cwd", "log", "cpus", "threads")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A run: its id, its directory (``runs/<run-id>/``) and its workers."""

    run_id: str
    run_dir: Path
    workers: tuple[WorkerSpec, ...]

    def __post_init__(self) -> None:
        check_name("run id", self.run_id)
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        workers = tuple(self.workers)
        object.__setattr__(self, "workers", workers)
        if not workers:
            raise ConfigError(
                f"run {self.run_id!r} has no workers (N < 1). Fix: give at least one WorkerSpec."
            )
        if not all(isinstance(w, WorkerSpec) for w in workers):
            raise ConfigError(
                f"run {self.run_id!r}: workers must be WorkerSpec objects, got "
                f"{[type(w).__name__ for w in workers]}. Fix: build each with WorkerSpec(...)."
            )
        for attr, what in (("name", "name"), ("log_path", "log file")):
            seen: dict[object, str] = {}
            for w in workers:
                key = getattr(w, attr) if attr == "name" else os.path.abspath(w.log_path)
                if key in seen:
                    raise ConfigError(
                        f"run {self.run_id!r}: two workers share the {what} {str(key)!r}. "
                        f"Fix: give every worker its own {what} (e.g. worker-0, worker-1)."
                    )
                seen[key] = w.name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.workers)

    def worker(self, name: str) -> WorkerSpec:
        for w in self.workers:
            if w.name == name:
                return w
        raise ConfigError(
            f"run {self.run_id!r} has no worker named {name!r}. "
            f"Fix: use one of {', '.join(self.names)}."
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "workers": [w.to_dict() for w in self.workers],
        }

    def _repr_html_(self) -> str:
        caption = f"run {self.run_id} in {self.run_dir}"
        return html_table(_WORKER_HEADERS, [w._row() for w in self.workers], caption)


def worker_env(
    worker: WorkerSpec, run_dir: Path | str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of ``worker``'s process (pure; ``base`` defaults to os.environ).

    Base environment, then the worker's additions, then what the launcher owns:
    unbuffered Python output (so logs are live), the thread counts of ``threads``,
    and ``DDLKIT_WORKER`` / ``DDLKIT_RUN_DIR`` of the worker contract.
    """
    env = dict(os.environ if base is None else base)
    env.update(worker.env)
    owned = {"PYTHONUNBUFFERED": "1", WORKER_VAR: worker.name, RUN_DIR_VAR: str(run_dir)}
    if worker.threads is not None:
        owned.update(thread_env(worker.threads))
    for key, value in owned.items():
        if key in worker.env and worker.env[key] != value:
            raise ConfigError(
                f"worker {worker.name!r}: env sets {key}={worker.env[key]!r} but the launcher "
                f"sets it to {value!r}. Fix: drop {key} from the worker's env."
            )
    env.update(owned)
    return env


def _is_python(exe: str) -> bool:
    return bool(_PYTHON.fullmatch(Path(exe).name)) or exe == sys.executable


def python_script(argv: Sequence[str]) -> str | None:
    """The script of a ``python [options] script.py`` command; None for -c, -m, - or not python."""
    if not _is_python(argv[0]):
        return None
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-c", "-m", "-"):
            return None
        if arg in _PYTHON_VALUE_OPTS:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None
