"""Notebook 02b's worker script, run by hand on two workers where ddlkit cannot be imported.

``workers/nb02b_images_mwms.py`` is taken out of the committed notebook and started as two
processes with hand-written ``TF_CONFIG`` on a small class-per-folder tree and TFRecord files
of it. What the notebook states is asserted on these runs:

- ``FILE`` on ``list_files(...).map(read)`` fails on both workers with ``NotFoundError``
  ("Found an unshardable source dataset"); ``AUTO`` on it gives each worker half of the
  examples, disjoint, all of them together;
- ``FILE`` on four TFRecord files gives worker 0 files 0 and 2, worker 1 files 1 and 3, every
  example once;
- one TFRecord file for two workers: worker 0 raises ``InvalidArgumentError`` ("Could not
  apply FILE based sharding: the dataset only has 1 file(s)"), worker 1 (no file, no such
  error) fails in the aborted collective, and both processes end by themselves, without a hang.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.nbscripts import (
    NOTEBOOKS,
    extract,
    imported_roots,
    no_ddlkit_env,
    private_attributes,
    write_scripts,
)

from ddlkit import settings
from ddlkit.cluster.ports import free_ports
from ddlkit.data import image_folder

NOTEBOOK = NOTEBOOKS / "02b_images_from_files.ipynb"
SCRIPT = "workers/nb02b_images_mwms.py"
TIMEOUT = 300  # seconds; two TensorFlow processes on a loaded 2-core machine
PER_CLASS = 4  # 20 images


def test_script_is_plain_tensorflow():
    text = extract(NOTEBOOK)[SCRIPT]
    tree = ast.parse(text)
    assert "ddlkit" not in imported_roots(tree), "the script must run without ddlkit"
    assert not private_attributes(tree)
    top = [ast.unparse(n) for n in tree.body]
    keras = next(i for i, line in enumerate(top) if "TF_USE_LEGACY_KERAS" in line)
    assert keras < top.index("import tensorflow as tf"), "tf-keras must be chosen before TF loads"
    for api in ("image_dataset_from_directory", "AutoShardPolicy", "TFRecordDataset", "Rescaling"):
        assert api in text, api


@pytest.fixture
def inputs(tmp_path):
    """The script, a 5-class tree of PNG files, and its images in 4 and in 1 TFRecord files."""
    if not (settings.data_dir() / "fashion_mnist.npz").exists():
        pytest.skip("Fashion-MNIST is not prepared: run `python -m ddlkit.data prepare`")
    import tensorflow as tf

    script = write_scripts(NOTEBOOK, tmp_path)[SCRIPT]
    tree = image_folder.write(tmp_path / "tree", per_class=PER_CLASS)
    classes = sorted(tree.folders)
    folders = {}
    for n in (4, 1):
        folder = tmp_path / f"records-{n}"
        folder.mkdir()
        names = [f"images-{k}-of-{n}.tfrecord" for k in range(n)]
        writers = [tf.io.TFRecordWriter(str(folder / name)) for name in names]
        for i, path in enumerate(tree.paths()):
            feature = {
                "png": tf.train.Feature(bytes_list=tf.train.BytesList(value=[path.read_bytes()])),
                "label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[classes.index(path.parent.name)])
                ),
                "shard": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[names[i % n].encode()])
                ),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[i % n].write(example.SerializeToString())
        for writer in writers:
            writer.close()
        folders[n] = folder
    return script, tree, folders


def _run_two(script: Path, args: list[str], tmp_path: Path, tag: str):
    """Both workers by hand; their exit codes (None: still running at the timeout, then
    killed) and logs. Nothing is left running."""
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs, logs = [], [tmp_path / f"{tag}-{i}.log" for i in range(2)]
    try:
        for i in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            with logs[i].open("w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(script), *args],
                        cwd=tmp_path,
                        env=no_ddlkit_env(tmp_path, TF_CONFIG=tf_config),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=TIMEOUT))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return codes, [log.read_text() for log in logs]


def _fingerprints(tree) -> set[str]:
    import hashlib

    import numpy as np
    import tensorflow as tf

    return {
        hashlib.sha1(
            np.asarray(tf.io.decode_png(p.read_bytes(), channels=1).numpy(), np.uint8).tobytes()
        ).hexdigest()[:16]
        for p in tree.paths()
    }


@pytest.mark.slow
def test_file_data_and_auto_counts_by_hand(inputs, tmp_path):
    script, tree, records = inputs
    out = tmp_path / "out"
    out.mkdir()
    cases = ["png:FILE", "png:AUTO", "tfrecord:FILE"]
    args = ["--tree", str(tree.root), "--records", str(records[4]), "--out", str(out)]
    args += ["--epochs", "0", "--batch-size", "2"] + [a for c in cases for a in ("--case", c)]
    codes, logs = _run_two(script, args, tmp_path, "counts")
    assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    got = [json.loads((out / f"worker-{w}.json").read_text())["cases"] for w in (0, 1)]
    everything = _fingerprints(tree)
    assert len(everything) == len(tree.files) == 5 * PER_CLASS

    for worker in got:
        assert worker["png:FILE"]["error"].startswith("NotFoundError"), worker["png:FILE"]
        assert "Found an unshardable source dataset" in worker["png:FILE"]["error"]
    for case in ("png:AUTO", "tfrecord:FILE"):
        a, b = (set(w[case]["ids"]) for w in got)
        assert len(a) == len(b) == len(everything) // 2, (case, len(a), len(b))
        assert not a & b and a | b == everything, case
    files = [sorted(set(w["tfrecord:FILE"]["origins"])) for w in got]
    names = [f"images-{k}-of-4.tfrecord" for k in range(4)]
    assert files == [names[0::2], names[1::2]]
    png_files = [set(w["png:AUTO"]["origins"]) for w in got]
    assert not png_files[0] & png_files[1] and len(png_files[0] | png_files[1]) == 20


@pytest.mark.slow
def test_fewer_files_than_workers_fails_on_both_without_a_hang(inputs, tmp_path):
    script, tree, records = inputs
    out = tmp_path / "out"
    out.mkdir()
    args = ["--tree", str(tree.root), "--records", str(records[1]), "--out", str(out)]
    args += ["--epochs", "1", "--case", "tfrecord:FILE"]
    codes, logs = _run_two(script, args, tmp_path, "one-file")
    assert None not in codes, f"a worker was still running after {TIMEOUT} s: {codes}"
    assert codes[0] != 0 and codes[1] != 0, codes
    assert "errors_impl.InvalidArgumentError" in logs[0], logs[0][-3000:]
    assert "Could not apply FILE based sharding: the dataset only has 1 file(s)" in logs[0]
    assert "Collective ops is aborted" in logs[1], logs[1][-3000:]
    assert "Could not apply FILE based sharding" not in logs[1], "worker 1 has no file to shard"
    assert not list(out.iterdir()), "a worker finished its epoch"
