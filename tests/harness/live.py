"""What the live-worker tests share: which processes still belong to a run (any process whose
environment names the run's directory: workers, the controller, ipyparallel's nannies,
mpirun's ranks)."""

from __future__ import annotations

from pathlib import Path

from ddlkit.contract import RUN_DIR_VAR
from ddlkit.procs import pids_with_env


def run_pids(run_dir: Path | str) -> list[int]:
    """Live processes whose environment has ``DDLKIT_RUN_DIR=run_dir`` (ours to read)."""
    return pids_with_env(RUN_DIR_VAR, str(run_dir))
