"""``ddlkit experiment`` on a user's file that no test or notebook of the kit wrote: real
workers under three strategies, the table, the JSON and the predictions; a bad file starts
nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "models"
DDLKIT = [sys.executable, "-m", "ddlkit.cli"]


@pytest.mark.slow
def test_the_cli_runs_a_users_model_under_three_strategies_and_writes_the_json(tmp_path):
    out = tmp_path / "exp.json"
    argv = [*DDLKIT, "experiment", str(MODELS / "text_encoder.py"), "--strategies",
            "multi_worker", "parameter_server", "horovod", "--workers", "2", "--steps", "20",
            "--batch-size", "16", "--eval-every", "10", "--predict", "DGX-A100", "--cluster",
            "A100:8:NVLink3:4x200", "--json", str(out), "--runs-dir",
            str(tmp_path / "runs")]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    cases = {c["case"]: c for c in doc["cases"]}
    assert set(cases) == {"single-x1", "independent-x2", "multi_worker-x2",
                          "parameter_server-x2", "horovod-x2"}  # fmt: skip
    for c in cases.values():
        assert c["error"] is None and c["examples_per_s"] > 0, c
        assert 0 <= c["test_accuracy"] <= 1  # the file's eval_dataset, its accuracy metric
    for name in ("multi_worker-x2", "parameter_server-x2", "horovod-x2"):
        assert cases[name]["ceiling_ratio"] > 0  # against independent-x2, the same run
    assert cases["independent-x2"]["ceiling_ratio"] == 1.0
    # the model's costs, counted by TensorFlow, in the JSON and the printed table
    assert doc["costs"]["gradient_bytes"]["float32"] == 4 * doc["costs"]["params"]
    assert "training FLOPs / example" in done.stdout and "horovod-x2" in done.stdout
    # predicted: this machine needs x1 cases (not run: said), the preset every size
    assert any("horovod: not measured (horovod-x1" in why for why in doc["predictions_left_out"])
    preset = [p for p in doc["predictions"] if p["where"] == "DGX-A100"]
    sizes = sorted({p["workers"] for p in preset})
    assert sizes[0] == 1 and sizes[-1] == 1024
    assert {p["strategy"] for p in preset} == {"horovod", "multi_worker", "parameter_server"}
    assert all(0 < p["efficiency"] <= 1 for p in preset)
    described = [p for p in doc["predictions"] if p["where"] == "8 x A100 per node, 200G-rdma"]
    assert len(described) == len(preset)  # the cluster described on the command line
    moved, _ = doc["sensitivity"]  # what the prediction leaves out, re-predicted
    assert moved["low"] <= moved["efficiency"] <= moved["high"] and len(moved["variants"]) >= 5
    assert "assumptions:" in done.stdout
    # experiment.json beside bench.json holds the same
    (bench_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert json.loads((bench_dir / "experiment.json").read_text())["cases"] == doc["cases"]


def test_a_bad_file_is_one_error_and_starts_nothing(tmp_path):
    argv = [*DDLKIT, "experiment", str(MODELS / "bad.py"), "--model", "summed_loss", "--data",
            "good_data", "--runs-dir", str(tmp_path / "runs")]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("ddlkit: error:")]
    assert len(errors) == 1 and "summed_loss()" in errors[0] and "Fix:" in errors[0]
    assert not (tmp_path / "runs").exists()  # no worker, no run directory
