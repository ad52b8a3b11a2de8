"""Notebook 05b's scripts, run by hand where ddlkit cannot be imported.

The scripts are taken out of the committed notebook. ``workers/nb05b_sparse.py`` runs under
``horovodrun -np 2 --gloo``: the model trained with the embedding's gradient allgathered as
rows and the one trained with ``sparse_as_dense=True`` must end with the same weights.
``workers/nb05b_cifar_mwms.py`` runs on two MultiWorkerMirrored workers started by hand: every
checkpoint format must be written once, by the chief, and no worker's temporary folder left.
What the lesson says of tf-keras' ``SGD`` (both ways update the whole table) is read from the
installed source.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness.nbscripts import NOTEBOOKS, extract, no_ddlkit_env, write_scripts
from harness.procutil import marked_pids, wait_until

from ddlkit.cluster.ports import free_ports
from ddlkit.data import text
from ddlkit.launch import plan

NOTEBOOK = NOTEBOOKS / "05b_article_programs.ipynb"
TEXT, SPARSE = "workers/nb05b_text.py", "workers/nb05b_sparse.py"
MWMS, HVD = "workers/nb05b_cifar_mwms.py", "workers/nb05b_cifar_hvd.py"
LOAD = "workers/nb05b_load.py"
TIMEOUT = 900  # seconds; two TensorFlow processes on a loaded 2-core machine
RATIO = re.compile(
    r"^\[0\]<stdout>:vocab (\d+): ms per step, rows [\d.]+, dense [\d.]+; "
    r"dense / rows ([\d.]+)$",
    re.MULTILINE,
)


def test_scripts_import_tensorflow_horovod_numpy_and_each_other_only():
    scripts = extract(NOTEBOOK)
    assert set(scripts) == {TEXT, SPARSE, MWMS, HVD, LOAD}
    for name, source in scripts.items():
        tree = ast.parse(source)
        assert ast.get_docstring(tree), name
        assert 'if __name__ == "__main__"' in source and "def main()" in source, name
        roots = {
            (getattr(node, "module", None) or alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert roots <= {
            "argparse",
            "json",
            "os",
            "sys",
            "time",
            "horovod",
            "numpy",
            "tensorflow",
            "nb05b_text",
            "nb05b_cifar_mwms",
        }, (name, roots)
    assert "hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)" in scripts[SPARSE]
    assert "sparse_as_dense=args.sparse_as_dense" in scripts[TEXT]
    hvd = scripts[HVD]
    average = hvd.index("hvd.callbacks.MetricAverageCallback()")
    assert average < hvd.index("tf.keras.callbacks.ReduceLROnPlateau("), "the order is the lesson"
    assert "if rank == 0:" in hvd and "TensorBoard" in hvd.split("if rank == 0:")[1]
    loader = ast.parse(scripts[LOAD])  # Horovod only inside load(), for hvd.load_model
    top = {
        alias.name for node in loader.body if isinstance(node, ast.Import) for alias in node.names
    }
    assert not any(name.startswith("horovod") for name in top), top
    assert "hvd.load_model(path)" in scripts[LOAD] and "compile=False" in scripts[LOAD]


def test_sgd_updates_the_whole_table_for_indexed_slices_too():
    """Section 5: tf-keras' SGD builds a momentum slot for every variable, whatever
    `momentum` is, and its IndexedSlices branch scales the whole slot and adds it to the whole
    variable, so the update is whole-table both ways (read without importing TensorFlow)."""
    spec = importlib.util.find_spec("tf_keras")
    assert spec and spec.submodule_search_locations, "tf-keras is not installed"
    path = Path(spec.submodule_search_locations[0]) / "src" / "optimizers" / "sgd.py"
    tree = ast.parse(path.read_text())
    sgd = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SGD")
    methods = {n.name: n for n in sgd.body if isinstance(n, ast.FunctionDef)}
    build = methods["build"]
    conditions = [ast.unparse(n.test) for n in ast.walk(build) if isinstance(n, ast.If)]
    assert "self.momentums.append" in ast.unparse(build), ast.unparse(build)
    assert not any("momentum" in c for c in conditions), conditions  # a slot whatever momentum
    step = methods["update_step"]
    ifs = [n for n in ast.walk(step) if isinstance(n, ast.If)]
    sparse = next(n for n in ifs if "IndexedSlices" in ast.unparse(n.test))
    branch = "\n".join(ast.unparse(s) for s in sparse.body)
    assert "m.assign(m * momentum)" in branch and "variable.assign_add(m)" in branch, branch
    assert "m = self.momentums[" in ast.unparse(step), ast.unparse(step)


@pytest.mark.parametrize("name", [TEXT, HVD])
def test_without_its_dist_lines_a_horovod_script_names_no_horovod(name):
    kept = "\n".join(
        line for line in extract(NOTEBOOK)[name].splitlines() if "# [dist]" not in line
    )
    tree = ast.parse(kept)
    left = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "hvd"]
    assert not left, [kept.splitlines()[i - 1] for i in left]


@pytest.mark.slow
def test_rows_and_sparse_as_dense_end_with_the_same_weights_on_two_ranks(tmp_path):
    scripts = write_scripts(NOTEBOOK, tmp_path)
    data = tmp_path / "reviews.npz"
    np.savez(data, **text.make(n_train=400, n_test=100, seed=0).arrays())
    horovodrun = plan.find_horovodrun(sys.executable)
    assert horovodrun, "Horovod is not installed. Fix: scripts/build-horovod.sh .venv/bin/python"
    argv = [
        horovodrun,
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        str(scripts[SPARSE]),
        "--data",
        str(data),
        "--steps",
        "3",
        "--vocab-sizes",
        "0",
        "--out",
        str(tmp_path / "w"),
    ]
    proc = subprocess.run(
        argv,
        env=no_ddlkit_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert wait_until(lambda: not marked_pids(str(scripts[SPARSE])), timeout=10)
    vocab = len(text.vocabulary())
    assert [int(v) for v, _ in RATIO.findall(output)] == [vocab], output[-3000:]
    with np.load(tmp_path / f"w-{vocab}.npz") as saved:
        arrays = {k: saved[k] for k in saved.files}
    n = len(arrays) // 2
    assert n == 9  # embedding, 2 x 3 LSTM arrays, dense kernel and bias
    for i in range(n):
        np.testing.assert_allclose(arrays[f"rows_{i}"], arrays[f"dense_{i}"], rtol=1e-5, atol=1e-6)
    assert arrays["rows_0"].shape == (vocab, 32)


def _start(script: Path, index: int, ports: list[int], args: list[str], tmp_path: Path):
    tf_config = {
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    }
    log = (tmp_path / f"worker-{index}.log").open("w")
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=no_ddlkit_env(tmp_path, TF_CONFIG=json.dumps(tf_config)),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the finally below ends all of it
    )


@pytest.mark.slow
def test_mwms_writes_every_checkpoint_format_once_on_the_chief(tmp_path):
    scripts = write_scripts(NOTEBOOK, tmp_path)
    rng = np.random.default_rng(0)
    data = tmp_path / "cifar.npz"  # shapes are what the callbacks need, not CIFAR's pictures
    np.savez(
        data,
        x_train=rng.integers(0, 255, (256, 32, 32, 3), dtype=np.uint8),
        y_train=rng.integers(0, 10, (256, 1)),
        x_test=rng.integers(0, 255, (64, 32, 32, 3), dtype=np.uint8),
        y_test=rng.integers(0, 10, (64, 1)),
    )
    out = tmp_path / "out"
    formats = ["h5", "weights.h5", "tf", "tf-weights", "keras"]
    args = [
        "--data",
        str(data),
        "--out",
        str(out),
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--formats",
        *formats,
    ]
    procs = []
    try:
        ports = free_ports(2)
        procs = [_start(scripts[MWMS], i, ports, args, tmp_path) for i in range(2)]
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    ckpt = sorted(p.name for p in (out / "ckpt").iterdir())
    assert ckpt == sorted(
        [
            "checkpoint",
            "model-01",
            "model-01.h5",
            "model-01.keras",
            "weights-01.data-00000-of-00001",
            "weights-01.index",
            "weights-01.weights.h5",
        ]
    ), ckpt
    assert not list(out.rglob("workertemp_*")), "a non-chief's temporary folder is left"
    assert [p.name for p in (out / "logs").iterdir()] == ["train"]
    progress = re.compile(r"^2/2 - .* - loss: ", re.MULTILINE)  # fit's line, verbose=2
    assert progress.search(logs[0]) and not progress.search(logs[1]), "the chief prints alone"
