"""launch/train_mwms_ft.py on two real workers: kill, fail cleanly, resume; chief-only files."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.procutil import alive

from ddlkit.errors import WorkerFailedError
from ddlkit.launch import run as run_mod
from ddlkit.lessons import faults
from ddlkit.metrics import load_run

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "launch" / "train_mwms_ft.py"
pytestmark = pytest.mark.slow

EPOCHS = 4
STEPS = ["--epochs", str(EPOCHS), "--steps-per-epoch", "10"]


def _start(tmp_path: Path, *args: str):
    return run_mod.start(SCRIPT, workers=2, args=[*STEPS, *args], runs_dir=tmp_path / "runs")


def test_a_killed_worker_fails_the_job_and_a_relaunch_resumes_from_the_backup(tmp_path):
    backup = tmp_path / "backup"
    run = _start(tmp_path, "--backup-dir", str(backup))
    try:
        assert faults.wait_for_backup(run, epoch=1, timeout=300) >= 1
        pids = dict(run.job.pids)
        run.kill("worker-1")
        with pytest.raises(WorkerFailedError) as err:
            run.wait(timeout=60)
    finally:
        run.stop()
    assert err.value.worker == "worker-1" and err.value.signal_name == "SIGKILL"
    assert "sent by Job.kill" in str(err.value)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids.values() if alive(p)], "orphan worker processes left"
    saved = faults.backups(run)[-1]  # the last epoch the chief backed up before the kill
    assert 1 <= saved < EPOCHS - 1, f"killed too late to test a resume (backups {saved})"
    assert (backup / "chief" / "checkpoint").exists()

    again = _start(tmp_path, "--backup-dir", str(backup))
    try:
        assert again.wait(timeout=300).ok
    finally:
        again.stop()
    points = faults.resume_points(again)
    assert [(p.worker, p.restored_epoch, p.initial_epoch) for p in points] == [
        ("worker-0", saved, saved + 1),
        ("worker-1", saved, saved + 1),
    ]
    results = again.results()
    assert [results[w]["initial_epoch"] for w in ("worker-0", "worker-1")] == [saved + 1] * 2
    records = load_run(again.run_dir)
    for worker in ("worker-0", "worker-1"):
        epochs = [r.epoch for r in records if r.worker == worker and r.kind == "epoch"]
        assert epochs == list(range(saved + 1, EPOCHS)), "the remaining epochs, to the end"
        assert any(r.name == "train_end" for r in records if r.worker == worker)
    assert results["worker-0"]["test_accuracy"] > 0.5, "restored weights kept training"
    assert not (backup / "chief").exists(), "a finished fit deletes its backup"


def test_only_the_chief_writes_checkpoints_and_tensorboard_logs(tmp_path):
    # One run for both: each is a write dir the non-chief redirects to a temporary one.
    ckpt, logs = tmp_path / "ckpt", tmp_path / "tb"
    run = _start(tmp_path, "--checkpoint-dir", str(ckpt), "--tensorboard-dir", str(logs))
    try:
        assert run.wait(timeout=300).ok
    finally:
        run.stop()
    results = run.results()
    assert results["worker-0"]["chief"] and not results["worker-1"]["chief"]
    for worker in ("worker-0", "worker-1"):  # the kit's rule is TensorFlow's own answer
        assert results[worker]["chief"] == results[worker]["should_checkpoint"], results[worker]
    assert results["worker-0"]["write_dirs"] == {"checkpoint_dir": str(ckpt)}
    temp = Path(results["worker-1"]["write_dirs"]["checkpoint_dir"])
    assert temp == tmp_path / "workertemp_1" / "ckpt"
    assert not (tmp_path / "workertemp_1").exists(), "the non-chief deleted its temporary dir"
    assert not list(logs.glob("workertemp_*")), "TensorBoard deleted the non-chief's temp logs"
    names = faults.list_files(ckpt).names
    assert names == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    names = faults.list_files(logs).names
    assert len(names) == 1 and names[0].startswith("train/events.out.tfevents.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "runs", "tb"]


def test_a_relative_directory_is_refused_before_training(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--backup-dir", "backup"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "--backup-dir" in proc.stderr and "relative path" in proc.stderr
    assert "Fix: pass an absolute path" in proc.stderr
    assert not list(tmp_path.iterdir())
