"""Notebooks 01 and 01a: their own code, run outside the notebook.

- Notebook 01's ``workers/mirrored_worker.py``, as its ``%%writefile`` cell writes it, runs by
  hand where ``import ddlkit`` fails, trains on 2 logical CPU devices and prints its accuracy
  line; its allocator line is marked ``[speed]``, not ``[dist]``.
- Notebook 01a's hand-written training loop (the cells tagged ``loop-check``) gives
  ``model.fit``'s loss at every step within the notebook's tolerance, on 2 logical CPU
  devices; and the same check fails for the two classic scaling mistakes, so it can fail.

Logical CPU devices can only be configured before TensorFlow initialises, so every case runs
in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from harness.nbscripts import NOTEBOOKS, extract, no_ddlkit_env, write_scripts

NOTEBOOK = NOTEBOOKS / "01_mirrored_strategy.ipynb"
LOOP_NOTEBOOK = NOTEBOOKS / "01a_mirrored_custom_loop.ipynb"
WORKER = "workers/mirrored_worker.py"
TAG = "loop-check"


def _run(argv, *, env, cwd, timeout=900) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stdout


@pytest.mark.slow
def test_mirrored_worker_runs_by_hand_without_ddlkit(data_env, tmp_path):
    scripts = write_scripts(NOTEBOOK, tmp_path)
    assert set(scripts) == {WORKER}
    argv = [sys.executable, str(scripts[WORKER]), "--replicas", "2", "--epochs", "1"]
    argv += ["--steps-per-epoch", "40", "--data", str(data_env / "datasets" / "mnist.npz")]
    env = no_ddlkit_env(tmp_path, CUDA_VISIBLE_DEVICES="-1")
    stdout = _run(argv, env=env, cwd=tmp_path)
    devices = re.search(r"^replicas in sync: 2 on (.+)$", stdout, re.M)
    assert devices, stdout
    assert [d.rsplit("device:", 1)[-1] for d in devices.group(1).split(", ")] == ["CPU:0", "CPU:1"]
    line = re.search(r"^2 replicas: test accuracy (\d\.\d{4})$", stdout, re.M)
    assert line, stdout
    # 40 Adam steps on 128 images each take the CNN well past chance (0.1) on the test set.
    assert float(line.group(1)) > 0.8, stdout


def test_the_worker_script_marks_speed_settings_apart_from_distribution():
    """`# [dist]` is for lines there (or different) because training is distributed; the
    allocator only makes the script faster (`# [speed]`), and the Keras choice is the course's,
    not distribution's."""
    text = extract(NOTEBOOK)[WORKER]
    lines = {
        name: next(line for line in text.splitlines() if f'"{name}"' in line)
        for name in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_USE_LEGACY_KERAS")
    }
    assert lines["TF_CPU_ALLOCATOR_USE_BFC"].endswith("# [speed]"), lines
    assert "[dist]" not in lines["TF_USE_LEGACY_KERAS"], lines
    doc = text.split('"""')[1]
    assert '"# [dist]"' in doc and '"# [speed]"' in doc, "the docstring says what each mark means"
    assert "MirroredStrategy(replica_devices(args.replicas))  # [dist]" in text


def _tagged_cells() -> list[str]:
    cells = json.loads(LOOP_NOTEBOOK.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if TAG in c["metadata"].get("tags", [])]
    assert any("def dataset_fn" in s for s in sources), f"no {TAG!r} cell defines dataset_fn"
    assert "assert difference.max() < rtol" in sources[-1], "the last tagged cell is the check"
    return sources


# Runs the set-up cells once, then the loop cells and the check once per variant of them
# (the notebook's own, then each mistake); prints the losses of each as JSON.
DRIVER = """
import json, sys
setup, loop, variants = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for source in setup:
    exec(compile(source, "<notebook set-up cell>", "exec"), ns)
report = {}
for name, (old, new) in variants.items():
    for source in loop[:-1]:
        exec(compile(source.replace(old, new), f"<loop cell, {name}>", "exec"), ns)
    try:
        exec(compile(loop[-1], f"<check cell, {name}>", "exec"), ns)
        passed = True
    except AssertionError:
        passed = False
    report[name] = {"loop": ns["loop_losses"], "fit": ns["fit_losses"], "rtol": ns["rtol"],
                    "passed": passed}
print(json.dumps(report))
"""

MISTAKES = {
    # tf.reduce_mean on each replica: the loss (and gradient) of a slice, not of the global batch
    "per-replica mean": ("global_batch_size=global_batch", "global_batch_size=per_replica_batch"),
    # every replica adds the whole penalty, and the all-reduce sums them
    "unscaled regularization": (
        "tf.nn.scale_regularization_loss(tf.add_n(loop_model.losses))",
        "tf.add_n(loop_model.losses)",
    ),
}


def _relative(case: dict) -> list[float]:
    return [abs(a - b) / abs(b) for a, b in zip(case["loop"], case["fit"], strict=True)]


@pytest.mark.slow
def test_custom_loop_matches_fit_and_the_check_catches_scaling_mistakes(data_env, tmp_path):
    sources = _tagged_cells()
    first_loop = next(i for i, s in enumerate(sources) if "def dataset_fn" in s)
    setup, loop = sources[:first_loop], sources[first_loop:]
    for old, _ in MISTAKES.values():
        assert any(old in s for s in loop), f"notebook 01a's loop no longer contains {old!r}"
    variants = {"as written": ("", ""), **MISTAKES}
    spec = tmp_path / "cells.json"
    spec.write_text(json.dumps([setup, loop, variants]))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}  # data_env's cache, offline
    env.update(DDLKIT_FAST="1", DDLKIT_PLOTS="static", CUDA_VISIBLE_DEVICES="-1")
    stdout = _run([sys.executable, "-c", DRIVER, str(spec)], env=env, cwd=tmp_path)
    report = json.loads(stdout.strip().splitlines()[-1])

    print({name: [f"{d:.1e}" for d in _relative(case)[:3]] for name, case in report.items()})
    ok = report["as written"]
    assert ok["rtol"] <= 1e-4
    assert len(ok["loop"]) == len(ok["fit"]) >= 5
    assert max(_relative(ok)) < ok["rtol"], ok
    assert ok["passed"]
    assert ok["loop"][-1] < ok["loop"][0], "the loop should learn"

    # Averaging over the replica's slice doubles the data loss with 2 replicas (the L2
    # penalty, about 1% of the loss, stays as it was): nearly twice fit's loss.
    mean = report["per-replica mean"]
    assert not mean["passed"]
    assert 0.95 < _relative(mean)[0] < 1.0, mean
    # The unscaled L2 penalty (about 1% of the loss here) shows from the first step.
    reg = report["unscaled regularization"]
    assert not reg["passed"]
    assert 1e-3 < _relative(reg)[0] < 0.1, reg
