"""JupyterLab in headless Chromium: a cell launches 2 workers and the live
dashboard updates with both workers' curves (issue 3's browser test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from labpage import LabPage, RendersChange

from ddlkit.metrics import load_run

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "train_multi_worker.py"

LAUNCH_CELL = f"""\
import ddlkit as dk
run = dk.launch.start({str(SCRIPT)!r}, strategy="multi_worker", workers=2,
                      args=["--steps-per-epoch", "60", "--epochs", "2"])
run.dashboard(mode="live")
"""


def test_dashboard_shows_both_workers_training_live(lab: LabPage, lab_server):
    check = RendersChange(times=4, texts=("worker-0", "worker-1"))

    shot = lab.run_cell_until(LAUNCH_CELL, check, timeout=180)

    assert shot.stat().st_size > 20_000
    # The pictures changed while the workers trained; the records behind them came
    # from both workers (the run directory holds what the collector was sent).
    runs = sorted((lab_server.dirs.root / "runs").iterdir())
    assert runs, "the cell started no run"
    workers = {r.worker for r in load_run(runs[-1]) if r.kind == "step"}
    assert workers == {"worker-0", "worker-1"}
