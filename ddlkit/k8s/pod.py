"""Inside a pod: ``python -m ddlkit.k8s exec -- SCRIPT ARGS`` (the twin of ``ddlkit.slurm exec``).

The manifest's command runs it in every pod of the Indexed Job. It reads the pod's
``JOB_COMPLETION_INDEX``, builds TF_CONFIG from the pods' stable names
``<job>-<index>.<service>`` (:class:`ddlkit.environments.kubernetes.Kubernetes`), names the
worker (``worker-1``, ``chief-0``, ``ps-0``: :mod:`ddlkit.contract`'s rules) and replaces
itself with ``python SCRIPT ARGS`` (``os.execv``: no shell, the arguments verbatim).

First it waits, up to ``--peer-wait`` seconds, until every peer pod's name has an address: a
peer that is still Pending has none, and TensorFlow alone would wait an hour for it
(:mod:`ddlkit.k8s.peers`).

With ``--ps K`` the ps and worker servers never end by themselves: the wrapper runs them as
its children and ends them once the chief's result is in the run directory on the shared
checkpoint volume (:func:`ddlkit.environments.scheduled.serve_until_chief_reports`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ddlkit.contract import RUN_DIR_VAR, TF_CONFIG_VAR, WORKER_VAR
from ddlkit.environments.kubernetes import TF_PORT, Kubernetes
from ddlkit.environments.scheduled import exec_task
from ddlkit.k8s.peers import PeersPendingError, wait_for_peers


def default_run_dir(job: str) -> Path:
    """``<runs>/k8s-<job>`` (``ddlkit.settings.runs_dir()``) when neither flag nor env names one."""
    from ddlkit import settings

    return settings.runs_dir() / f"k8s-{job}"


def worker_env(
    environ: Mapping[str, str],
    job: str,
    service: str,
    pods: int,
    ps: int = 0,
    port: int = TF_PORT,
    run_dir: str | os.PathLike | None = None,
) -> dict[str, str]:
    """The variables to add in this pod (pure): TF_CONFIG, worker name, run dir, Keras.

    The run directory is ``run_dir``, else ``DDLKIT_RUN_DIR`` (the manifest sets it to the
    checkpoint volume), else :func:`default_run_dir`.
    """
    from ddlkit.backend import keras_env

    pod = Kubernetes.from_env(environ, job, service, pods, ps, port)
    directory = run_dir or environ.get(RUN_DIR_VAR) or default_run_dir(job)
    return {**keras_env(), **pod.task_env(directory)}


def run(argv_list: list[str], env: Mapping[str, str], ps: int) -> int:
    """Show who this pod is, then exec the script (or serve until the chief reports)."""
    return exec_task("ddlkit.k8s", argv_list, env, ps)


def peers_ready(env: Mapping[str, str], timeout: float) -> bool:
    """Wait up to ``timeout`` s for every other task's host in ``env``'s TF_CONFIG to
    resolve (0: do not wait).

    False, with one line on stderr naming the pods still Pending, when they do not.
    """
    if timeout <= 0:
        return True
    config = json.loads(env[TF_CONFIG_VAR])
    task = config["task"]
    me = config["cluster"][task["type"]][task["index"]]
    addresses = [a for tasks in config["cluster"].values() for a in tasks if a != me]
    peers = [a.rpartition(":")[0] for a in addresses]
    name = env[WORKER_VAR]
    try:
        waited = wait_for_peers(name, peers, timeout)
    except PeersPendingError as exc:
        print(f"ddlkit.k8s: error: {exc}", file=sys.stderr, flush=True)
        return False
    if waited >= 1:
        print(f"ddlkit.k8s: {name}: every peer has an address after {waited:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return True
