"""Spark test helpers: a run that must be refused before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddlkit.errors import ConfigError
from ddlkit.launch import run as run_mod
from ddlkit.procs import descendants

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "train_multi_worker.py"


def refused(tmp_path, **kwargs) -> str:
    """Start a run that must be refused; check that nothing started or was written."""
    before = {pid for pid, _ in descendants(os.getpid())}
    kwargs = {
        "script": SCRIPT,
        "workers": 2,
        "engine": "spark",
        "runs_dir": tmp_path / "runs",
        **kwargs,
    }
    with pytest.raises(ConfigError) as refused:
        run_mod.start(**kwargs)
    assert not (tmp_path / "runs").exists(), "a refused run wrote a run directory"
    assert {pid for pid, _ in descendants(os.getpid())} <= before, "a refused run started"
    message = str(refused.value)
    assert "Fix:" in message and "\n" not in message, message
    return message
