"""Notebook 02's worker script, run by hand where ddlkit cannot be imported.

``workers/mwms_worker.py`` is taken out of the committed notebook and started as two
processes with hand-written ``TF_CONFIG`` (what the notebook's "by hand" cell tells a
learner to do), here in the layout with a ``chief`` task (``{"chief": [a], "worker": [b]}``,
which some launchers write; the notebook's own runs and its solutions cover the
workers-only layout). Both must finish and print the same test accuracy; the chief task
alone, not worker 0, must print the epoch lines and leave the SavedModel in TensorFlow
Serving's layout, and its ``serving_default`` signature (uint8 images in) must reproduce
that accuracy exactly.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.nbscripts import (
    NOTEBOOKS,
    extract,
    guarded_imports,
    no_ddlkit_env,
    private_attributes,
    write_scripts,
)

from ddlkit import settings
from ddlkit.cluster.ports import free_ports

NOTEBOOK = NOTEBOOKS / "02_multi_worker_mirrored.ipynb"
SCRIPT = "workers/mwms_worker.py"
PRINTED = re.compile(r"^(chief|worker) (\d+) test accuracy (\d\.\d{4})$", re.MULTILINE)
EPOCH = re.compile(r"^\d+/\d+ - .* - loss: ", re.MULTILINE)  # Keras' verbose=2 line
TASKS = [("chief", 0), ("worker", 0)]  # a chief task, and worker 0 as an ordinary worker
TIMEOUT = 900  # seconds; two TensorFlow processes on a loaded 2-core machine

# Loads the exported model the way a server does (no Keras) and counts right answers.
SERVE_CHECK = """
import sys
import numpy as np
import tensorflow as tf
export, data = sys.argv[1:]
with np.load(data) as f:
    x, y = f["x_test"], f["y_test"]
serve = tf.saved_model.load(export).signatures["serving_default"]
spec = serve.structured_input_signature[1]["images"]
print("input", spec.dtype.name, spec.shape.as_list())
classes = serve(images=tf.constant(x))["classes"].numpy()
print("right", int((classes == y).sum()), len(y))
"""


def test_script_is_plain_tensorflow_with_an_optional_ddlkit_block():
    text = extract(NOTEBOOK)[SCRIPT]
    tree = ast.parse(text)
    private = private_attributes(tree)
    assert not private, f"private attributes in {SCRIPT}: {private}"
    found, guarded = guarded_imports(tree, "ddlkit")
    assert found, "the optional live-metrics block is gone"
    assert guarded == found, "ddlkit imported outside try/except ImportError"
    top = [ast.unparse(n) for n in tree.body]
    keras = next(i for i, line in enumerate(top) if "TF_USE_LEGACY_KERAS" in line)
    assert keras < top.index("import tensorflow as tf"), "tf-keras must be chosen before TF loads"
    assert 'if __name__ == "__main__"' in text and "def main()" in text


def _start(script: Path, index: int, ports: list[int], args: list[str], tmp_path: Path):
    tf_config = {
        "cluster": {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]},
        "task": {"type": TASKS[index][0], "index": TASKS[index][1]},
    }
    env = no_ddlkit_env(tmp_path, TF_CONFIG=json.dumps(tf_config))
    log = (tmp_path / f"worker-{index}.log").open("w")
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the finally below ends all of it
    )


@pytest.mark.slow
def test_two_workers_by_hand_and_the_served_model(tmp_path):
    data = settings.data_dir() / "mnist.npz"
    if not data.exists():
        pytest.skip(f"{data} is missing: prepare it with `python -m ddlkit.data prepare`")
    script = write_scripts(NOTEBOOK, tmp_path)[SCRIPT]
    out = tmp_path / "out"
    args = ["--epochs", "1", "--steps-per-epoch", "20", "--out", str(out)]
    ports = free_ports(2)
    procs = []
    try:
        for index in range(2):
            procs.append(_start(script, index, ports, args, tmp_path))
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    assert not any("ddlkit.metrics" in log for log in logs), "ddlkit was importable"
    printed = [PRINTED.findall(log) for log in logs]
    assert printed[0] and printed[1], "\n\n".join(log[-2000:] for log in logs)
    (t0, i0, acc0), (t1, i1, acc1) = printed[0][-1], printed[1][-1]
    assert [(t0, int(i0)), (t1, int(i1))] == TASKS
    assert acc0 == acc1, "model.evaluate under MWMS all-reduces: both workers print one number"
    assert float(acc0) > 0.5, f"20 steps of Adam reach well above chance, got {acc0}"
    assert EPOCH.findall(logs[0]) and not EPOCH.findall(logs[1]), "the chief task prints alone"

    # Chief-only files: the export in <model>/<version>/, no worker's temp dir left over
    # (worker 0 is not the chief when the cluster has a chief task).
    export = out / "mnist" / "1"
    assert (export / "saved_model.pb").is_file()
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert all(f.startswith(("logs/train/", "mnist/1/")) for f in files), files
    assert not list(out.rglob("workertemp_*")), "a non-chief's temporary directory is left"

    check = subprocess.run(
        [sys.executable, "-c", SERVE_CHECK, str(export), str(data)],
        cwd=tmp_path,
        env=no_ddlkit_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert "input uint8 [None, 28, 28]" in check.stdout, check.stdout
    right, total = map(int, re.search(r"right (\d+) (\d+)", check.stdout).groups())
    assert f"{right / total:.4f}" == acc0, (right, total, acc0)
