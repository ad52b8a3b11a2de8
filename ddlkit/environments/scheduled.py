"""The last step of a task a scheduler started (``python -m ddlkit.slurm exec``, ``python -m
ddlkit.k8s exec``): with its worker environment built, become the script.

:func:`exec_task` shows who the task is, sets the environment and replaces the process with
``python SCRIPT ARGS`` (``os.execv``: no shell, the arguments verbatim). A parameter-server
job's ps and worker servers never end by themselves, so for them the wrapper stays as the
parent and ends the server once the chief has written its result
(:func:`serve_until_chief_reports`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ddlkit.contract import RUN_DIR_VAR, TF_CONFIG_VAR, WORKER_VAR, result_path, task_name

CHIEF = task_name("chief", 0)


def exec_task(tool: str, argv: list[str], env: Mapping[str, str], ps: int) -> int:
    """Become ``argv`` with ``env`` added (a ps/worker server of a ``ps`` job: serve it
    until the chief reports). ``tool`` names the wrapper in what it prints."""
    name = env[WORKER_VAR]
    print(
        f"{tool}: {name} TF_CONFIG={env[TF_CONFIG_VAR]} run_dir={env[RUN_DIR_VAR]}",
        file=sys.stderr,
        flush=True,
    )
    os.environ.update(env)
    if ps and name != CHIEF:
        chief_result = result_path(env[RUN_DIR_VAR], CHIEF)
        return serve_until_chief_reports(argv, chief_result, name, tool=tool)
    os.execv(argv[0], argv)
    return 0  # not reached


def serve_until_chief_reports(
    argv: list[str],
    chief_result: Path,
    name: str,
    poll: float = 0.5,
    grace: float = 10.0,
    tool: str = "ddlkit",
) -> int:
    """Run a ps or worker server (which never exits by itself) until the chief reports.

    Returns the server's exit code if it ends first, else 0 once ``chief_result`` is
    written after this started (the server gets SIGTERM, then SIGKILL after ``grace``
    seconds). If the chief fails instead, the scheduler ends the job (``srun
    --kill-on-bad-exit``; the Job's failure policy).
    """
    started = time.time()
    child = subprocess.Popen(argv)

    def stop(*_: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        while child.poll() is None:
            try:
                reported = chief_result.stat().st_mtime >= started - 1
            except OSError:
                reported = False
            if reported:
                print(f"{tool}: {name}: the chief reported; ending this server", flush=True)
                child.terminate()
                try:
                    child.wait(grace)
                except subprocess.TimeoutExpired:
                    child.kill()
                return 0
            time.sleep(poll)
        return child.returncode
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
