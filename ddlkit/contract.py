"""The worker contract: what a worker is told, what it is called, where it writes.

One module owns it; the launcher, the workers (``launch/_common.py``, ddlkit.metrics),
Slurm, Horovod ranks and results all use these names, and a test checks that the
variable names appear as string literals here only. Standard library only (plus
ddlkit.errors), so a worker imports it before TensorFlow at no cost.

Environment of a worker (set by the launcher, or by an environment whose scheduler
starts the processes, e.g. Slurm; a Horovod rank renames itself from its rank)::

    DDLKIT_WORKER      this worker's name (below): chief-0, worker-1, rank-0, main
    DDLKIT_RUN_DIR     the run directory (layout below)
    DDLKIT_COLLECTOR   host:port of the notebook's metrics collector (live metrics only)
    DDLKIT_TOKEN       the token that collector wants in a worker's hello
    DDLKIT_STRATEGY    the strategy the launcher planned (multi_worker, horovod, ...)
    DDLKIT_REPLICAS    replicas of a mirrored run's one process
    DDLKIT_RANK_CPUS   one core list per local Horovod rank, "0;1" (ddlkit.horovod.pinning)
    OMP_NUM_THREADS, TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS: its thread counts

Worker names: ``<role>-<index>`` for TensorFlow tasks (:func:`task_name`),
``rank-<rank>`` for Horovod ranks (:func:`rank_name`), ``main`` for a mirrored run's
one process, ``horovodrun`` for the process that starts the ranks, ``spark-driver`` for a
Spark run's driver, ``ray-driver`` for a Ray run's, ``ipcontroller`` for the controller of
interactive workers (``dk.workers``) and ``srun`` for the process that starts them in a
Slurm allocation; every name matches :data:`NAME_PATTERN` (it names files).

Run directory (:func:`log_path`, :func:`metrics_path`, :func:`result_path`, ...)::

    <run_dir>/job.json                 the job spec at start, final states at the end
    <run_dir>/logs/<worker>.log        each worker's stdout and stderr
    <run_dir>/metrics/<worker>.jsonl   its metric records (ddlkit.metrics)
    <run_dir>/results/<worker>.json    its final report (launch/_common.py report())
    <run_dir>/work/<worker>/           its working directory
    <runs>/results/<name>.json         (beside the runs) the Results notebooks save
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ddlkit.errors import ConfigError

# -- environment variables ----------------------------------------------------------
WORKER_VAR = "DDLKIT_WORKER"
RUN_DIR_VAR = "DDLKIT_RUN_DIR"
COLLECTOR_VAR = "DDLKIT_COLLECTOR"
TOKEN_VAR = "DDLKIT_TOKEN"
STRATEGY_VAR = "DDLKIT_STRATEGY"
REPLICAS_VAR = "DDLKIT_REPLICAS"
RANK_CPUS_VAR = "DDLKIT_RANK_CPUS"
TF_CONFIG_VAR = "TF_CONFIG"  # TensorFlow's own: the cluster and this task, as JSON
ENV_VARS = (
    WORKER_VAR,
    RUN_DIR_VAR,
    COLLECTOR_VAR,
    TOKEN_VAR,
    STRATEGY_VAR,
    REPLICAS_VAR,
    RANK_CPUS_VAR,
)

# Thread counts of a worker limited to N compute threads (set by the launcher, or by a
# Horovod rank that pins itself).
THREAD_VARS = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def thread_env(threads: int) -> dict[str, str]:
    """Thread-count variables for a worker limited to ``threads`` compute threads (pure).

    Inter-op threads are at least 2: a collective op (all-reduce) blocks one inter-op
    thread while it waits for its peers, and with a single one a worker can hang.
    """
    return {
        "OMP_NUM_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(max(2, threads)),
    }


# -- worker names ---------------------------------------------------------------------
# The one rule: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.
# Worker names, run ids and run labels follow it; each names files in the run directory.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAIN = "main"  # a mirrored run's one process
HOROVODRUN = "horovodrun"  # the process that starts a Horovod run's ranks
SPARK_DRIVER = "spark-driver"  # the driver process of a Spark run (ddlkit.spark)
RAY_DRIVER = "ray-driver"  # the driver process of a Ray run (ddlkit.ray)
CONTROLLER = "ipcontroller"  # the ipyparallel controller of interactive workers (dk.workers)
SRUN = "srun"  # the srun that starts live workers as a Slurm job step's tasks (dk.workers)
RANK_PREFIX = "rank-"


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid worker name (or run id)."""
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a safe file-name-like identifier, else raise ConfigError."""
    if not is_name(value):
        raise ConfigError(
            f"{kind} {value!r} is not a valid name. Fix: use 1-64 letters, digits, '.', '_' or "
            f"'-', starting with a letter or digit (it names files under the run directory)."
        )
    return value


def task_name(role: str, index: int) -> str:
    """The worker name of a TensorFlow task: ``chief-0``, ``ps-1``, ``worker-2``."""
    return f"{role}-{index}"


def rank_name(rank: int) -> str:
    """The worker name of a Horovod rank: ``rank-0``, ``rank-1``, ..."""
    return f"{RANK_PREFIX}{rank}"


def is_rank_name(name: str) -> bool:
    return name.startswith(RANK_PREFIX)


# -- run directory --------------------------------------------------------------------
JOB_FILE = "job.json"
LOGS_DIR = "logs"
METRICS_DIR = "metrics"
RESULTS_DIR = "results"
WORK_DIR = "work"
LOG_SUFFIX = ".log"
METRICS_SUFFIX = ".jsonl"
RESULT_SUFFIX = ".json"


SAVED_RESULTS_DIR = "results"  # under the runs directory: ddlkit.results.save()


def saved_results_dir(runs_dir: str | os.PathLike) -> Path:
    return Path(runs_dir) / SAVED_RESULTS_DIR


def job_file(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / JOB_FILE


def logs_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / LOGS_DIR


def log_path(run_dir: str | os.PathLike, worker: str) -> Path:
    return logs_dir(run_dir) / f"{worker}{LOG_SUFFIX}"


def metrics_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / METRICS_DIR


def metrics_path(run_dir: str | os.PathLike, worker: str) -> Path:
    """Where ``worker``'s metric records live (ConfigError for a name that is not one)."""
    if not is_name(worker):
        raise ConfigError(
            f"worker name {worker!r} cannot name a metrics file. Fix: use 1-64 letters, digits, "
            f"'_', '.' or '-' starting with a letter or digit, e.g. 'worker-0'."
        )
    return metrics_dir(run_dir) / f"{worker}{METRICS_SUFFIX}"


def results_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RESULTS_DIR


def result_path(run_dir: str | os.PathLike, worker: str) -> Path:
    return results_dir(run_dir) / f"{worker}{RESULT_SUFFIX}"


def work_dir(run_dir: str | os.PathLike, worker: str) -> Path:
    return Path(run_dir) / WORK_DIR / worker


def write_result(run_dir: str | os.PathLike, worker: str, line: str) -> Path:
    """Save a worker's final report (one JSON line) so a reader never sees half of it."""
    path = result_path(run_dir, worker)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(line)
    os.replace(tmp, path)
    return path


def read_results(run_dir: str | os.PathLike) -> dict[str, dict]:
    """Every worker's saved report in ``run_dir``, by worker name (sorted)."""
    import json

    return {
        path.name[: -len(RESULT_SUFFIX)]: json.loads(path.read_text())
        for path in sorted(results_dir(run_dir).glob(f"*{RESULT_SUFFIX}"))
    }
