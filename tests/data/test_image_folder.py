"""ddlkit.data.image_folder: a class-per-folder PNG tree, atomic and idempotent.

The trees are written from the kit's prepared Fashion-MNIST (``make test`` prepares it
before the tests run) into ``tmp_path``; the PNG files are decoded by TensorFlow, the reader
``image_dataset_from_directory`` uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ddlkit import settings
from ddlkit.data import image_folder
from ddlkit.errors import DataError

FIVE = ["ankle_boot", "bag", "sandal", "t_shirt_top", "trouser"]


@pytest.fixture(scope="module")
def fashion():
    if not (settings.data_dir() / "fashion_mnist.npz").exists():
        pytest.skip("Fashion-MNIST is not prepared: run `python -m ddlkit.data prepare`")
    from ddlkit.data import load

    return load("fashion_mnist", source="kit-cache")


def _decode(data: bytes, channels: int) -> np.ndarray:
    import tensorflow as tf

    return tf.io.decode_png(data, channels=channels).numpy()


def _siblings(root):
    return sorted(p.name for p in root.parent.iterdir() if p.name != root.name)


def test_png_bytes_decode_to_the_same_pixels():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    rgb = rng.integers(0, 256, (4, 3, 3), dtype=np.uint8)
    assert np.array_equal(_decode(image_folder.png_bytes(grey), 1)[..., 0], grey)
    assert np.array_equal(_decode(image_folder.png_bytes(grey[..., None]), 1)[..., 0], grey)
    assert np.array_equal(_decode(image_folder.png_bytes(rgb), 3), rgb)
    with pytest.raises(DataError, match="uint8"):
        image_folder.png_bytes(grey.astype(np.float32))
    with pytest.raises(DataError, match=r"\(H, W, 3\)"):
        image_folder.png_bytes(np.zeros((2, 2, 4), np.uint8))


def test_folder_names():
    assert image_folder.folder_name("T-shirt/top") == "t_shirt_top"
    assert image_folder.folder_name("Ankle boot") == "ankle_boot"
    with pytest.raises(DataError, match="empty folder name"):
        image_folder.folder_name("//")


def test_write_a_tree_then_find_it(fashion, tmp_path):
    (x_train, y_train), _ = fashion
    root = tmp_path / "tree"
    tree = image_folder.write(root, "fashion_mnist", per_class=3)
    assert tree.created and tree.per_class == 3 and not tree.synthetic
    assert sorted(tree.folders) == FIVE
    assert tree.counts() == dict.fromkeys(FIVE, 3)
    on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))
    assert on_disk == list(tree.files)
    assert _siblings(root) == [], "a temporary folder was left beside the tree"
    for name in tree.files:  # each file: its class's folder, decoding to the data set's pixels
        folder, index = name.split("/")[0], int(name.rsplit("_", 1)[1].split(".")[0])
        label = tree.class_names[tree.folders.index(folder)]
        assert fashion.info.class_names[y_train[index]] == label, name
        assert np.array_equal(_decode((root / name).read_bytes(), 1)[..., 0], x_train[index])
    for folder, label in zip(tree.folders, tree.class_names, strict=True):  # the first 3 each
        first3 = np.flatnonzero(y_train == fashion.info.class_names.index(label))[:3]
        assert {f"{folder}/train_{i:05d}.png" for i in first3} <= set(tree.files), folder

    mtimes = {f: (root / f).stat().st_mtime_ns for f in tree.files}
    again = image_folder.write(root, "fashion_mnist", per_class=3)
    assert not again.created and again.files == tree.files
    assert mtimes == {f: (root / f).stat().st_mtime_ns for f in tree.files}, "files rewritten"


def test_another_request_needs_replace_and_a_foreign_folder_is_never_replaced(fashion, tmp_path):
    root = tmp_path / "tree"
    image_folder.write(root, per_class=2)
    with pytest.raises(DataError, match=r"per_class: 2, asked 4.*replace=True"):
        image_folder.write(root, per_class=4)
    tree = image_folder.write(root, per_class=4, replace=True)
    assert tree.created and tree.counts() == dict.fromkeys(FIVE, 4)
    assert len(list(root.rglob("*.png"))) == 20 and _siblings(root) == []

    mine = tmp_path / "mine"
    (mine / "cats").mkdir(parents=True)
    (mine / "cats" / "a.png").write_bytes(b"not the kit's")
    for replace in (False, True):
        with pytest.raises(DataError, match="not written by ddlkit"):
            image_folder.write(mine, per_class=2, replace=replace)
    assert (mine / "cats" / "a.png").read_bytes() == b"not the kit's"


def test_an_incomplete_tree_is_reported_not_used(fashion, tmp_path):
    root = tmp_path / "tree"
    tree = image_folder.write(root, per_class=2)
    (root / tree.files[3]).unlink()
    with pytest.raises(DataError, match=r"incomplete: 1 of its 10 files are missing"):
        image_folder.write(root, per_class=2)
    assert image_folder.write(root, per_class=2, replace=True).created


def test_an_interrupted_write_leaves_nothing(fashion, tmp_path, monkeypatch):
    calls = []
    real = image_folder.png_bytes

    def failing(image):
        calls.append(1)
        if len(calls) == 7:
            raise OSError("disk full")
        return real(image)

    monkeypatch.setattr(image_folder, "png_bytes", failing)
    root = tmp_path / "tree"
    with pytest.raises(OSError, match="disk full"):
        image_folder.write(root, per_class=3)
    assert not root.exists() and list(tmp_path.iterdir()) == []


def test_bad_requests_name_the_fix(fashion, tmp_path):
    with pytest.raises(DataError, match="not a class of fashion_mnist"):
        image_folder.write(tmp_path / "t", classes=["Sneaker", "Dragon"], per_class=1)
    with pytest.raises(DataError, match="name each class once"):
        image_folder.write(tmp_path / "t", classes=["Bag", 8], per_class=1)
    with pytest.raises(DataError, match="at least one image"):
        image_folder.write(tmp_path / "t", per_class=0)
    with pytest.raises(DataError, match="'train' or 'test'"):
        image_folder.write(tmp_path / "t", split="valid", per_class=1)
    assert not (tmp_path / "t").exists()


def test_fast_mode_default_and_other_data_sets(fashion, tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_FAST", "0")
    assert image_folder.default_per_class() == image_folder.PER_CLASS
    monkeypatch.setenv("DDLKIT_FAST", "1")
    assert image_folder.default_per_class() == image_folder.PER_CLASS_FAST
    tree = image_folder.write(tmp_path / "fast")
    assert tree.per_class == image_folder.PER_CLASS_FAST
    assert len(tree.files) == 5 * image_folder.PER_CLASS_FAST
    test_tree = image_folder.write(tmp_path / "test", classes=[7, "Bag"], per_class=2, split="test")
    assert test_tree.folders == ("sneaker", "bag") and test_tree.files[0].endswith(".png")
    assert all("/test_" in f for f in test_tree.files)


WRITER = """
import sys
from ddlkit.data import image_folder
tree = image_folder.write(sys.argv[1], per_class=30)
print(tree.created, len(tree.files))
"""


def test_two_processes_writing_one_tree_agree(fashion, tmp_path):
    root = tmp_path / "tree"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for _ in range(2)
    ]
    try:
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    outs = sorted(out.split() for out, _ in results)
    assert all(n == "150" for _, n in outs), outs
    assert {created for created, _ in outs} <= {"True", "False"}
    assert _siblings(root) == [] and len(list(root.rglob("*.png"))) == 150
    manifest = json.loads((root / image_folder.MANIFEST).read_text())
    assert manifest["per_class"] == 30 and len(manifest["files"]) == 150
