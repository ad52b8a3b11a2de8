"""Slurm: a kit worker's TF_CONFIG, name and run directory from its Slurm job step.

The environment itself (the step's layout, this task's rank, its cluster built with
`ddlkit.cluster.ClusterSpec`) is :class:`ddlkit.environments.slurm.Slurm`; this module is
its command line and the batch-script helpers.

Each task of ``srun`` runs ``python -m ddlkit.slurm exec -- SCRIPT ARGS...``, which
sets ``TF_CONFIG``, ``DDLKIT_WORKER`` and ``DDLKIT_RUN_DIR`` (the worker environment
contract of docs/design.md) from the ``SLURM_*`` variables and then replaces itself
with ``python SCRIPT ARGS...`` (``os.execv``, no shell). The templates in
``launch/slurm/`` do this for you::

    sbatch launch/slurm/multi_worker.sbatch --epochs 1      # MultiWorkerMirroredStrategy
    sbatch launch/slurm/parameter_server.sbatch --epochs 1  # ParameterServerStrategy
    sbatch launch/slurm/horovod.sbatch --epochs 1           # Horovod (Gloo) via horovodrun

With ``exec --ps N`` task 0 is the chief, the next N are parameter servers and the rest
workers; the ps and worker servers never end by themselves, so the wrapper runs them as
its children and ends them once the chief has written its result
(:func:`ddlkit.environments.scheduled.serve_until_chief_reports`).

The cluster is the one ``tf.distribute.cluster_resolver.SlurmClusterResolver``
builds (every task ``host:port_base+i`` for its i-th task on that host, task
index = ``SLURM_PROCID``, roles in the order chief, ps, worker), computed here
without TensorFlow and with two differences, both checked in tests/test_slurm.py:

- hosts keep Slurm's node order (``n9`` before ``n10``); TensorFlow sorts them as
  strings, which hands task 0 the address of a node it does not run on;
- no GPU count is needed: TensorFlow's resolver calls ``nvidia-smi`` and fails on a
  CPU node (``FileNotFoundError``), or with ``gpus_per_node=0`` (``range() arg 3
  must not be zero``). :func:`resolver` gives TensorFlow's resolver with arguments
  that work on CPU nodes, for scripts that want it directly.

Tasks must be laid out in blocks (Slurm's default ``--distribution=block``); a task
whose ``SLURM_LOCALID`` or ``SLURMD_NODENAME`` disagrees with that layout is refused
with the fix. Pure functions of an environment mapping, except :func:`resolver`,
:func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlkit.cluster import Host, format_hosts
from ddlkit.contract import RUN_DIR_VAR
from ddlkit.environments.scheduled import exec_task, serve_until_chief_reports
from ddlkit.environments.slurm import (  # re-exported: the job step's parsers
    EPHEMERAL_FLOOR,
    INSIDE_FIX,
    JOB_VARS,
    PORT_FLOOR,
    PORT_SLOTS,
    PORTS_PER_JOB,
    STEP_VARS,
    Slurm,
    SlurmStep,
    _node_tasks,
    _port_base,
    default_port_base,
    expand_hostlist,
    expand_tasks_per_node,
    ps_roles,
    step_from_env,
)
from ddlkit.errors import ConfigError

__all__ = [
    "EPHEMERAL_FLOOR",
    "INSIDE_FIX",
    "JOB_VARS",
    "PORT_FLOOR",
    "PORT_SLOTS",
    "PORTS_PER_JOB",
    "STEP_VARS",
    "Slurm",
    "SlurmStep",
    "default_port_base",
    "default_run_dir",
    "exec_argv",
    "expand_hostlist",
    "expand_tasks_per_node",
    "horovod_hosts",
    "main",
    "ps_roles",
    "resolver",
    "serve_until_chief_reports",
    "step_from_env",
    "tf_config_from_slurm",
    "worker_env",
]


def tf_config_from_slurm(
    environ: Mapping[str, str], port_base: int | None = None, ps: int = 0
) -> dict:
    """This task's TF_CONFIG from its Slurm job step.

    ``ps=0``: every task a ``worker``, index ``SLURM_PROCID`` (MultiWorkerMirroredStrategy;
    worker 0 is its chief). ``ps=N``: task 0 the ``chief``, then N ``ps``, the rest
    ``worker`` (ParameterServerStrategy; :func:`ps_roles`), as TensorFlow's resolver with
    ``jobs={"chief": 1, "ps": N, "worker": rest}``. ``port_base`` defaults to
    :func:`default_port_base` of the job id, the same on every task.
    """
    return Slurm.from_env(environ, port_base, ps).tf_config()


def default_run_dir(environ: Mapping[str, str]) -> Path:
    """``<runs>/slurm-<job id>`` (``ddlkit.settings.runs_dir()``): one run per job."""
    from ddlkit import settings

    if not environ.get("SLURM_JOB_ID", "").isdigit():
        raise ConfigError(f"SLURM_JOB_ID is not set or not a number. {INSIDE_FIX}")
    return settings.runs_dir() / f"slurm-{environ['SLURM_JOB_ID']}"


def worker_env(
    environ: Mapping[str, str],
    port_base: int | None = None,
    run_dir: str | os.PathLike | None = None,
    ps: int = 0,
) -> dict[str, str]:
    """The variables to add for this task (pure): TF_CONFIG, worker name, run dir, Keras.

    The worker name is the task's, e.g. ``worker-1`` or (with ``ps``) ``chief-0``, ``ps-0``.

    The run directory is ``run_dir``, else ``DDLKIT_RUN_DIR`` if already set (e.g. by
    the batch script), else :func:`default_run_dir`. It must be on a file system every
    node sees for one run to hold all workers' metrics and results.
    """
    from ddlkit.backend import keras_env

    task = Slurm.from_env(environ, port_base, ps)  # TF_CONFIG through ClusterSpec
    directory = run_dir or environ.get(RUN_DIR_VAR) or default_run_dir(environ)
    return {**keras_env(), **task.task_env(directory)}


def horovod_hosts(environ: Mapping[str, str]) -> str:
    """horovodrun's ``-H`` for the job's allocation, e.g. ``"n1:2,n2:2"`` (batch step)."""
    missing = [v for v in JOB_VARS if not environ.get(v)]
    if missing:
        raise ConfigError(
            f"not inside a Slurm job: {', '.join(missing)} not set. Fix: run it in the batch "
            f"script, e.g. launch/slurm/horovod.sbatch (`sbatch launch/slurm/horovod.sbatch`)."
        )
    nodes = _node_tasks(environ, "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE")
    return format_hosts(Host(host, count) for host, count in nodes)  # as dk.launch's -H


def resolver(port_base: int | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """TensorFlow's ``SlurmClusterResolver`` for this task, set up to work on CPU nodes.

    TensorFlow reads ``os.environ`` itself; ``environ`` (default ``os.environ``) is only
    used here for the node layout and port base. Without GPUs (no
    ``CUDA_VISIBLE_DEVICES``) it passes one pretend GPU per task and does not touch
    ``CUDA_VISIBLE_DEVICES``: the only way its port enumeration works there.
    """
    import tensorflow as tf

    env = os.environ if environ is None else environ
    step = step_from_env(env)
    base = _port_base(step, port_base)
    most = max(n for _, n in step.nodes)
    if env.get("CUDA_VISIBLE_DEVICES"):
        return tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=base)
    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=base, gpus_per_node=most, gpus_per_task=1, auto_set_gpu=False
    )


def exec_argv(script: str, args: Sequence[str], python: str | None = None) -> list[str]:
    """``[python, script, *args]`` for ``os.execv``; ConfigError if the script is missing."""
    if not Path(script).is_file():
        raise ConfigError(
            f"worker script {script!r} not found (working directory {os.getcwd()}). Fix: "
            f"run from the repository root or pass the script's full path."
        )
    return [python or sys.executable, script, *args]


def _parser() -> argparse.ArgumentParser:
    about = "Run kit worker scripts as Slurm tasks."
    parser = argparse.ArgumentParser(prog="python -m ddlkit.slurm", description=about)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("exec", help="run SCRIPT ARGS... as this Slurm task's worker")
    run.add_argument("--port-base", type=int, default=None, help="default: from the job id")
    ps_help = "ParameterServerStrategy: task 0 the chief, N ps, the rest workers"
    run.add_argument("--ps", type=int, default=0, help=ps_help)
    run.add_argument("--run-dir", help="default: DDLKIT_RUN_DIR, else runs/slurm-<job id>")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("hosts", help="print horovodrun's -H for this job (in the batch script)")
    sub.add_parser("run-dir", help="print this job's default run directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``exec``: set the worker env and exec the script; ``hosts``; ``run-dir``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "hosts":
            print(horovod_hosts(os.environ))
            return 0
        if args.command == "run-dir":
            print(default_run_dir(os.environ).absolute())
            return 0
        script_args = args.args[1:] if args.args[:1] == ["--"] else args.args
        argv_list = exec_argv(args.script, script_args)
        env = worker_env(os.environ, args.port_base, args.run_dir, args.ps)
    except ConfigError as exc:
        print(f"ddlkit.slurm: error: {exc}", file=sys.stderr)
        return 2
    return exec_task("ddlkit.slurm", argv_list, env, args.ps)


if __name__ == "__main__":
    raise SystemExit(main())
