"""The kit's offline cache: verified on every load, never used or deleted silently."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ddlkit import data
from ddlkit.data import cache
from ddlkit.errors import CorruptCacheError

FIX = "python -m ddlkit.data prepare --force fashion_mnist"


@pytest.fixture
def own_cache(prepared_data_home, tmp_path, monkeypatch):
    """A private copy of the prepared Fashion-MNIST entry that a test may damage."""
    home = tmp_path / "kit"
    (home / "datasets").mkdir(parents=True)
    for name in ("fashion_mnist.npz", "fashion_mnist.manifest.json"):
        shutil.copy(prepared_data_home / "datasets" / name, home / "datasets" / name)
    keras_home = tmp_path / "home"
    (keras_home / ".keras").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(keras_home))
    monkeypatch.setenv("DDLKIT_HOME", str(home))
    monkeypatch.setenv("DDLKIT_OFFLINE", "1")
    return home / "datasets"


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ddlkit.data", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )


def _flip_bytes(path, offset, count=16):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + count] = bytes(b ^ 0xFF for b in raw[offset : offset + count])
    path.write_bytes(bytes(raw))
    return bytes(raw)


def test_flipped_bytes_are_caught_and_the_file_is_left_alone(own_cache):
    npz = own_cache / "fashion_mnist.npz"
    damaged = _flip_bytes(npz, npz.stat().st_size // 2)
    with pytest.raises(CorruptCacheError) as err:
        data.load("fashion_mnist")
    message = str(err.value)
    assert str(npz) in message and "sha256" in message and FIX in message
    assert "\n" not in message
    assert npz.read_bytes() == damaged  # neither deleted nor "repaired"
    with pytest.raises(CorruptCacheError):
        data.load("fashion_mnist", source="kit-cache")


def test_truncated_file_is_caught(own_cache):
    npz = own_cache / "fashion_mnist.npz"
    size = npz.stat().st_size
    with open(npz, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CorruptCacheError, match=f"truncated: {size - 1000} bytes") as err:
        data.load("fashion_mnist")
    assert FIX in str(err.value)
    assert npz.stat().st_size == size - 1000


def test_missing_or_garbled_manifest_is_caught(own_cache):
    manifest = own_cache / "fashion_mnist.manifest.json"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(CorruptCacheError, match="manifest cannot be read"):
        data.load("fashion_mnist")
    manifest.unlink()
    with pytest.raises(CorruptCacheError, match="manifest fashion_mnist.manifest.json is missing"):
        data.load("fashion_mnist")


def test_manifest_that_disagrees_with_the_data_set_is_caught(own_cache):
    manifest = own_cache / "fashion_mnist.manifest.json"
    doc = json.loads(manifest.read_text())
    doc["arrays"]["x_train"]["shape"] = [59999, 28, 28]
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CorruptCacheError, match="expected"):
        data.load("fashion_mnist")


def test_status_reports_corruption_without_raising(own_cache):
    _flip_bytes(own_cache / "fashion_mnist.npz", 5000)
    rows = {row.name: row for row in data.status()}
    assert (rows["fashion_mnist"].cache, rows["fashion_mnist"].source) == ("corrupt", "error")
    assert FIX in rows["fashion_mnist"].detail
    assert (rows["mnist"].cache, rows["mnist"].source) == ("missing", "none")
    assert "<table>" in data.status()._repr_html_()
    done = _cli("status")
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("fashion_mnist"))
    assert "corrupt" in line and "error" in line


def test_prepare_without_force_refuses_a_corrupt_entry(own_cache):
    npz = own_cache / "fashion_mnist.npz"
    damaged = _flip_bytes(npz, 5000)
    with pytest.raises(CorruptCacheError, match="--force"):
        data.prepare(["fashion_mnist"], echo=None)
    assert npz.read_bytes() == damaged
    assert not list(own_cache.glob("*.corrupt"))


def test_prepare_force_moves_the_bad_file_aside_says_so_and_rebuilds(own_cache):
    npz = own_cache / "fashion_mnist.npz"
    good = data.load("fashion_mnist")
    damaged = _flip_bytes(npz, 5000)
    done = _cli("prepare", "--force", "fashion_mnist")
    assert done.returncode == 0, done.stderr
    aside = own_cache / "fashion_mnist.npz.corrupt"
    assert f"moved {npz} aside to {aside}" in done.stdout
    assert aside.read_bytes() == damaged
    assert "rebuilt" in done.stdout
    again = data.load("fashion_mnist")
    for (a, b), (c, d) in zip(good, again, strict=True):
        assert np.array_equal(a, c) and np.array_equal(b, d)


def test_prepare_is_idempotent_and_force_rebuilds(own_cache):
    npz = own_cache / "fashion_mnist.npz"
    before = npz.stat()
    (result,) = data.prepare(["fashion_mnist"], echo=None)
    assert result.status == "ready" and result.path == npz
    after = npz.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    said = []
    (result,) = data.prepare("fashion_mnist", force=True, echo=said.append)
    assert result.status == "rebuilt" and npz.stat().st_ino != before.st_ino
    assert any("wrote" in line for line in said)
    assert not list(own_cache.glob("*.corrupt"))


def test_prepare_reports_cifar10_as_unavailable_not_an_error(own_cache):
    (result,) = data.prepare(["cifar10"], echo=None)
    assert result.status == "unavailable" and "stand-in" in result.detail


def test_failed_write_leaves_the_old_entry_and_no_temporary_files(own_cache):
    npz = own_cache / "fashion_mnist.npz"
    before = npz.read_bytes()

    class Exploding:
        def __array__(self, *args, **kwargs):
            raise RuntimeError("disk full, say")

    good = data.load("fashion_mnist")
    arrays = {"x_train": good[0][0], "y_train": good[0][1], "x_test": Exploding()}
    arrays["y_test"] = good[1][1]
    with pytest.raises(RuntimeError, match="disk full"):
        cache.write("fashion_mnist", arrays, origin="test")
    assert npz.read_bytes() == before
    assert sorted(p.name for p in own_cache.iterdir()) == [
        "fashion_mnist.manifest.json",
        "fashion_mnist.npz",
    ]


def test_written_entry_round_trips_with_its_manifest(own_cache):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (5, 2, 2), dtype=np.uint8),
        "y_train": np.arange(5, dtype=np.uint8),
        "x_test": rng.integers(0, 256, (2, 2, 2), dtype=np.uint8),
        "y_test": np.arange(2, dtype=np.uint8),
    }
    layout = {k: (v.shape, "uint8") for k, v in arrays.items()}
    path = cache.write("tiny", arrays, origin="test")
    manifest = json.loads(cache.manifest_path("tiny").read_text())
    assert manifest["size"] == path.stat().st_size and manifest["sha256"] == cache.sha256_of(path)
    got = cache.read("tiny", layout, fix_name="tiny")
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    assert cache.read("absent", layout, fix_name="absent") is None
