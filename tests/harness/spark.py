"""Spark test helpers: a run that must be refused before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddlkit.errors import ConfigError
from ddlkit.launch import run as run_mod
from ddlkit.procs import descendants
from ddlkit.where import Spark

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "train_multi_worker.py"


def _apps(cluster) -> set[str]:
    """The ids of every application a shared cluster's master has seen (running or done)."""
    state = cluster.state()
    assert "activeapps" in state and "completedapps" in state, sorted(state)
    return {app["id"] for key in ("activeapps", "completedapps") for app in state[key]}


def _run_processes(cluster) -> dict[int, str]:
    """This test process's descendants and their command lines, without a shared cluster's
    own: its master and workers, and the executors those start and stop for earlier jobs on
    their own schedule (a worker may still be replacing an executor of the previous test's
    job). One look at /proc: an executor seen in one look and gone by a second would
    otherwise count as started by the run."""
    own = [proc.pid for proc in cluster.procs] if cluster is not None else []
    return dict(descendants(os.getpid(), prune=own))


def refused(tmp_path, *, cluster=None, master=None, **kwargs) -> str:
    """Start a run on Spark ``master`` that must be refused; check that nothing started or
    was written.

    With ``cluster`` (the shared local cluster the run is sent to), "nothing started"
    means no process outside that cluster's own and no application submitted to it."""
    before = _run_processes(cluster)
    apps = _apps(cluster) if cluster is not None else set()
    kwargs = {
        "script": SCRIPT,
        "workers": 2,
        "runs_dir": tmp_path / "runs",
        **kwargs,
    }
    with pytest.raises(ConfigError) as refused:
        run_mod.start(where=Spark(master), **kwargs)
    assert not (tmp_path / "runs").exists(), "a refused run wrote a run directory"
    started = {pid: cmd for pid, cmd in _run_processes(cluster).items() if pid not in before}
    assert not started, f"a refused run started {started}"
    if cluster is not None:
        assert _apps(cluster) == apps, "a refused run submitted an application"
    message = str(refused.value)
    assert "Fix:" in message and "\n" not in message, message
    return message
