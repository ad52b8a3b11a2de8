"""What the live-worker tests share: which processes still belong to a run (any process whose
environment names the run's directory: workers, the controller, ipyparallel's nannies,
mpirun's ranks)."""

from __future__ import annotations

import os
from pathlib import Path

from ddlkit.contract import RUN_DIR_VAR


def run_pids(run_dir: Path | str) -> list[int]:
    """Live processes whose environment has ``DDLKIT_RUN_DIR=run_dir`` (ours to read)."""
    marker = f"{RUN_DIR_VAR}={run_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in env and state not in ("Z", "X"):
            found.append(int(entry))
    return found
