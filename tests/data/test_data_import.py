"""``python -m ddlkit.data import cifar10 PATH``: the learner's own archive, checked, then used.

The archives are made here with the official layout (``cifar-10-batches-py/``
holding ``data_batch_1..5``, ``test_batch`` and ``batches.meta``, pickled
dicts with bytes keys). The checksum is checked in every test: against the
official one (which these archives fail) or against the test archive's own
sha256, passed explicitly as ``expected``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ddlkit import data
from ddlkit.data import archive
from ddlkit.errors import DataError


def _pickled(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _batch(index: int, n: int) -> dict:
    rows = (np.arange(n)[:, None] * 7 + np.arange(3072)[None, :] + index) % 256
    return {
        b"batch_label": f"batch {index}".encode(),
        b"labels": [(i + index) % 10 for i in range(n)],
        b"data": rows.astype(np.uint8),
        b"filenames": [f"img_{index}_{i}.png".encode() for i in range(n)],
    }


def make_archive(path, per_batch: int = 10000, skip: str | None = None):
    """A CIFAR-10-shaped .tar.gz at ``path``; ``skip`` leaves one member out."""
    members = {f"data_batch_{i}": _batch(i, per_batch) for i in range(1, 6)}
    members["test_batch"] = _batch(6, per_batch)
    members["batches.meta"] = {
        b"num_cases_per_batch": per_batch,
        b"label_names": [name.encode() for name in data.class_names("cifar10")],
        b"num_vis": 3072,
    }
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, obj in members.items():
            if name == skip:
                continue
            raw = _pickled(obj)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return members


def checksum_of(path) -> archive.Checksum:
    raw = path.read_bytes()
    return archive.Checksum(sha256=hashlib.sha256(raw).hexdigest(), size=len(raw))


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """Fresh Keras and kit homes, offline; returns (keras datasets dir, kit datasets dir)."""
    home = tmp_path / "home"
    (home / ".keras").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    monkeypatch.delenv("DDLKIT_KERAS", raising=False)
    monkeypatch.setenv("DDLKIT_HOME", str(tmp_path / "kit"))
    monkeypatch.setenv("DDLKIT_OFFLINE", "1")
    return home / ".keras" / "datasets", tmp_path / "kit" / "datasets"


@pytest.fixture(scope="module")
def full_archive(tmp_path_factory):
    """A full-size (50000 + 10000 images) archive with the official layout; built once."""
    path = tmp_path_factory.mktemp("cifar") / "cifar-10-python.tar.gz"
    members = make_archive(path)
    return path, members


def _nothing_written(keras_dir, kit_dir):
    keras_files = sorted(p.name for p in keras_dir.iterdir()) if keras_dir.exists() else []
    kit_files = sorted(p.name for p in kit_dir.iterdir()) if kit_dir.exists() else []
    assert keras_files == [] and kit_files == []


def test_official_checksum_is_the_one_tf_keras_checks():
    # Read tf-keras' loader as a file: finding the package does not import TensorFlow.
    package = importlib.util.find_spec("tf_keras").submodule_search_locations[0]
    text = (Path(package) / "src" / "datasets" / "cifar10.py").read_text()
    assert f'"{archive.OFFICIAL.sha256}"' in text and "file_hash=" in text
    assert archive.OFFICIAL.md5 == "c58f30108f718f92721af3b95e74349a"


def test_import_puts_the_archive_where_tf_keras_and_the_kit_find_it(homes, full_archive):
    keras_dir, kit_dir = homes
    path, members = full_archive
    done = archive.import_cifar10(path, expected=checksum_of(path))
    assert done.archive == keras_dir / "cifar-10-batches-py.tar.gz"
    assert done.archive.read_bytes() == path.read_bytes()
    extracted = sorted(p.name for p in (keras_dir / "cifar-10-batches-py").iterdir())
    assert extracted == sorted(archive.MEMBERS)
    assert (keras_dir / "cifar-10-batches-py" / "test_batch").read_bytes() == _pickled(
        members["test_batch"]
    )
    assert [p.name for p in keras_dir.iterdir() if p.name.startswith(".")] == []
    assert done.cache == kit_dir / "cifar10.npz"

    loaded = data.load("cifar10")  # offline: Keras refuses a non-official hash, the kit cache not
    (x_train, y_train), (x_test, y_test) = loaded
    assert loaded.info.source == "kit-cache" and not loaded.info.synthetic
    assert x_train.shape == (50000, 32, 32, 3) and y_train.shape == (50000, 1)
    first = members["data_batch_1"][b"data"][0].reshape(3, 32, 32).transpose(1, 2, 0)
    np.testing.assert_array_equal(x_train[0], first)
    last = members["test_batch"][b"data"][-1].reshape(3, 32, 32).transpose(1, 2, 0)
    np.testing.assert_array_equal(x_test[-1], last)
    assert y_train[10000, 0] == members["data_batch_2"][b"labels"][0]
    assert y_test[:5, 0].tolist() == members["test_batch"][b"labels"][:5]


def test_a_wrong_file_is_refused_against_the_official_checksum(homes, full_archive):
    path, _ = full_archive
    with pytest.raises(DataError) as err:
        archive.import_cifar10(path)  # the real check: this archive is not the official one
    message = str(err.value)
    assert str(path) in message and archive.OFFICIAL.sha256 in message
    assert "c58f30108f718f92721af3b95e74349a" in message and "Fix:" in message
    assert "\n" not in message
    _nothing_written(*homes)


def test_a_truncated_file_is_refused(homes, full_archive, tmp_path):
    path, _ = full_archive
    short = tmp_path / "cifar-10-python.tar.gz"
    short.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(
        DataError, match=r"truncated \(or another file\): [\d,]+ bytes, the archive has [\d,]+"
    ):
        archive.import_cifar10(short, expected=checksum_of(path))
    _nothing_written(*homes)
    # Without a known size the hash catches it all the same.
    unsized = archive.Checksum(sha256=checksum_of(path).sha256)
    with pytest.raises(DataError, match="sha256"):
        archive.import_cifar10(short, expected=unsized)
    _nothing_written(*homes)


def test_a_missing_path_and_a_directory_are_refused(homes, tmp_path):
    with pytest.raises(DataError, match=r"no such file\. Nothing was written\. Fix: give the path"):
        archive.import_cifar10(tmp_path / "nope.tar.gz")
    with pytest.raises(DataError, match="not a file"):
        archive.import_cifar10(tmp_path)
    _nothing_written(*homes)


def test_an_archive_without_a_batch_is_refused(homes, tmp_path):
    path = tmp_path / "cifar-10-python.tar.gz"
    make_archive(path, per_batch=10, skip="data_batch_3")
    with pytest.raises(DataError, match="lacks cifar-10-batches-py/data_batch_3"):
        archive.import_cifar10(path, expected=checksum_of(path))
    _nothing_written(*homes)


def test_a_small_archive_is_refused_for_its_shapes(homes, tmp_path):
    path = tmp_path / "cifar-10-python.tar.gz"
    make_archive(path, per_batch=10)
    with pytest.raises(DataError, match=r"'x_train': \[50, 32, 32, 3\]"):
        archive.import_cifar10(path, expected=checksum_of(path))
    _nothing_written(*homes)


def test_a_failed_copy_leaves_no_temporary_file(homes, full_archive, monkeypatch):
    path, _ = full_archive

    def disk_full(src, dst):
        with open(dst, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(archive.shutil, "copyfile", disk_full)
    with pytest.raises(OSError, match="No space"):
        archive.import_cifar10(path, expected=checksum_of(path))
    _nothing_written(*homes)


def test_command_lines_refuse_with_one_line(homes, tmp_path, capsys):
    from ddlkit.cli import main as ddlkit_main

    wrong = tmp_path / "cifar-10-python.tar.gz"
    wrong.write_bytes(b"not an archive")
    assert ddlkit_main(["data", "import", "cifar10", str(wrong)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Refused") and "sha256" in err and "\n" not in err
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit.data", "import", "cifar10", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and proc.stdout.count("\n") == 1
    assert proc.stderr.strip().count("\n") == 0 and "no such file" in proc.stderr
    _nothing_written(*homes)
