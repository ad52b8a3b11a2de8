"""ddlkit.data.load on this machine's real data: shapes, dtypes, labels, class counts, sources."""

from __future__ import annotations

import hashlib
import pickle
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import warnings

import numpy as np
import pytest

from ddlkit import data
from ddlkit.data import cache, catalog, sources, standin
from ddlkit.data.build import FASHION_DEFAULT_DIR
from ddlkit.data.catalog import FASHION_MNIST_FILES
from ddlkit.errors import ConfigError

# The official MNIST class counts (LeCun et al.), train and test.
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
# The widely published per-pixel mean and std of the training images (as fractions of 255).
MNIST_MEAN_STD = (0.1307, 0.3081)
FASHION_MEAN_STD = (0.2860, 0.3530)


def _load_real(name):
    """load(name), failing the test if it warns about synthetic data."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.SyntheticDataWarning)
        return data.load(name)


def _assert_keras_format(loaded, n_train, n_test, image_shape, label_shape):
    (x_train, y_train), (x_test, y_test) = loaded
    assert x_train.shape == (n_train, *image_shape) and x_train.dtype == np.uint8
    assert x_test.shape == (n_test, *image_shape) and x_test.dtype == np.uint8
    assert y_train.shape == (n_train, *label_shape) and y_train.dtype == np.uint8
    assert y_test.shape == (n_test, *label_shape) and y_test.dtype == np.uint8
    assert y_train.min() == 0 and y_train.max() == 9
    assert y_test.min() == 0 and y_test.max() == 9


def _assert_same(a, b):
    for split_a, split_b in zip(a, b, strict=True):
        for arr_a, arr_b in zip(split_a, split_b, strict=True):
            assert arr_a.dtype == arr_b.dtype and arr_a.shape == arr_b.shape
            assert np.array_equal(arr_a, arr_b)


@pytest.fixture(scope="module")
def standin_loaded(tmp_path_factory):
    """One full stand-in load, offline with an empty Keras cache, and the warnings it gave."""
    home = tmp_path_factory.mktemp("home")
    (home / ".keras").mkdir()
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.setenv("DDLKIT_OFFLINE", "1")
        mp.setenv("HOME", str(home))
        mp.delenv("KERAS_HOME", raising=False)
        loaded = data.load("cifar10")
    return loaded, caught


def test_mnist_is_the_real_mnist(data_env):
    loaded = _load_real("mnist")
    _assert_keras_format(loaded, 60000, 10000, (28, 28), ())
    (x_train, y_train), (x_test, y_test) = loaded
    assert np.bincount(y_train).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(y_test).tolist() == MNIST_TEST_COUNTS
    assert x_train.min() == 0 and x_train.max() == 255
    mean, std = MNIST_MEAN_STD
    assert abs(x_train.mean() / 255 - mean) < 5e-4 and abs(x_train.std() / 255 - std) < 5e-4
    info = loaded.info
    assert (info.name, info.display_name, info.source, info.synthetic) == (
        "mnist",
        "MNIST",
        "kit-cache",
        False,
    )
    assert info.path == data_env / "datasets" / "mnist.npz"
    assert info.class_names == tuple("0123456789") and info.num_classes == 10
    assert info.image_shape == (28, 28)


def test_fashion_mnist_is_the_real_fashion_mnist(data_env):
    loaded = _load_real("fashion_mnist")
    _assert_keras_format(loaded, 60000, 10000, (28, 28), ())
    (x_train, y_train), (x_test, y_test) = loaded
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert np.bincount(y_test).tolist() == [1000] * 10
    mean, std = FASHION_MEAN_STD
    assert abs(x_train.mean() / 255 - mean) < 5e-4 and abs(x_train.std() / 255 - std) < 5e-4
    assert loaded.info.source == "kit-cache" and not loaded.info.synthetic
    assert (
        loaded.info.class_names[0] == "T-shirt/top" and loaded.info.class_names[9] == "Ankle boot"
    )
    assert data.class_names("fashion_mnist") == loaded.info.class_names


def test_cifar10_falls_back_to_the_announced_stand_in(standin_loaded):
    loaded, caught = standin_loaded
    ours = [w for w in caught if issubclass(w.category, data.SyntheticDataWarning)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "NOT CIFAR-10" in message and "never report" in message
    assert ours[0].filename == __file__  # it points at the caller's line
    _assert_keras_format(loaded, 50000, 10000, (32, 32, 3), (1,))
    (x_train, y_train), (x_test, y_test) = loaded
    assert np.bincount(y_train[:, 0]).tolist() == [5000] * 10
    assert np.bincount(y_test[:, 0]).tolist() == [1000] * 10
    info = loaded.info
    assert info.synthetic and info.source == "synthetic" and info.path is None
    assert info.display_name == "CIFAR-10 stand-in (synthetic)"
    assert info.class_names == data.class_names("cifar10") and info.class_names[0] == "airplane"
    assert "NOT CIFAR-10" in info._repr_html_() and "NOT CIFAR-10" in loaded._repr_html_()
    # Images vary: not a handful of templates.
    assert len(np.unique(x_train[:500].reshape(500, -1), axis=0)) == 500


def test_loads_are_deterministic(data_env, standin_loaded):
    _assert_same(_load_real("mnist"), _load_real("mnist"))
    with pytest.warns(data.SyntheticDataWarning):
        again = data.load("cifar10", source="synthetic")
    _assert_same(standin_loaded[0], again)


def _standin_home(tmp_path, monkeypatch):
    """An empty kit home and Keras cache, offline; returns the kit's data folder."""
    (tmp_path / "home" / ".keras").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    monkeypatch.setenv("DDLKIT_HOME", str(tmp_path / "kit"))
    monkeypatch.setenv("DDLKIT_OFFLINE", "1")
    return tmp_path / "kit" / "datasets"


def _load_standin():
    with pytest.warns(data.SyntheticDataWarning, match="NOT CIFAR-10"):
        return data.load("cifar10")


def _counting_generate(monkeypatch):
    calls = []
    real = standin.generate

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(standin, "generate", counted)
    return calls


def test_the_standin_is_generated_once_then_read_from_the_kit_folder(tmp_path, monkeypatch):
    folder = _standin_home(tmp_path, monkeypatch)
    calls = _counting_generate(monkeypatch)
    first = _load_standin()
    assert len(calls) == 1
    assert sorted(p.name for p in folder.iterdir()) == [
        ".cifar10-standin.lock", "cifar10-standin.manifest.json", "cifar10-standin.npz"
    ]  # fmt: skip
    spec = catalog.spec("cifar10")
    manifest = cache.verify("cifar10-standin", sources.layout(spec), fix_name="cifar10")
    assert manifest.origin == sources.standin_origin() and "sha256:" in manifest.origin
    again = _load_standin()  # read back: still announced as synthetic, never as CIFAR-10
    assert len(calls) == 1
    _assert_same(first, again)
    assert again.info == first.info and again.info.synthetic and again.info.path is None
    assert not cache.exists("cifar10")  # the real data's entry stays empty
    with pytest.warns(data.SyntheticDataWarning):
        _assert_same(first, data.load("cifar10", source="synthetic"))


def test_a_damaged_or_outdated_standin_is_made_again(tmp_path, monkeypatch):
    folder = _standin_home(tmp_path, monkeypatch)
    first = _load_standin()
    calls = _counting_generate(monkeypatch)
    npz = folder / "cifar10-standin.npz"
    with open(npz, "r+b") as f:
        f.truncate(npz.stat().st_size // 2)
    _assert_same(first, _load_standin())
    assert len(calls) == 1
    spec = catalog.spec("cifar10")
    cache.verify("cifar10-standin", sources.layout(spec), fix_name="cifar10")  # whole again
    mpath = folder / "cifar10-standin.manifest.json"
    mpath.write_text(mpath.read_text().replace(sources.standin_origin(), "an older generator"))
    _assert_same(first, _load_standin())
    assert len(calls) == 2
    assert sources.standin_origin() in mpath.read_text()


def test_a_folder_that_cannot_hold_it_warns_and_still_gives_the_standin(tmp_path, monkeypatch):
    _standin_home(tmp_path, monkeypatch)
    (tmp_path / "kit").write_text("a file where the kit's folder should be")
    with pytest.warns(UserWarning) as caught:
        loaded = data.load("cifar10")
    messages = [str(w.message) for w in caught]
    assert any("NOT CIFAR-10" in m for m in messages)
    (kept,) = [m for m in messages if "could not be kept" in m]
    assert str(tmp_path / "kit" / "datasets") in kept and "DDLKIT_HOME" in kept
    assert {w.filename for w in caught} == {__file__}  # both point at the line that loads
    assert loaded.info.synthetic and loaded[0][0].shape == (50000, 32, 32, 3)


def test_processes_that_load_the_standin_together_get_the_same_arrays(tmp_path, monkeypatch):
    folder = _standin_home(tmp_path, monkeypatch)
    probe = (
        "import hashlib, warnings; from ddlkit import data\n"
        "warnings.simplefilter('ignore')\n"
        "(x, y), (xt, yt) = data.load('cifar10')\n"
        "print(hashlib.sha256(x.tobytes() + y.tobytes() + xt.tobytes() + yt.tobytes()).hexdigest())"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    digests = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    spec = catalog.spec("cifar10")
    arrays = cache.read("cifar10-standin", sources.layout(spec), fix_name="cifar10")
    assert arrays is not None and len(digests) == 1
    whole = b"".join(arrays[k].tobytes() for k in ("x_train", "y_train", "x_test", "y_test"))
    assert digests == {hashlib.sha256(whole).hexdigest()}
    assert not list(folder.glob(".*.tmp"))


def test_standin_seed_matters_and_per_class_sizes_are_exact():
    a = standin.generate(train_per_class=30, test_per_class=5, seed=1)
    b = standin.generate(train_per_class=30, test_per_class=5, seed=2)
    assert a["x_train"].shape == (300, 32, 32, 3) and a["y_test"].shape == (50, 1)
    assert np.bincount(a["y_train"][:, 0]).tolist() == [30] * 10
    assert not np.array_equal(a["x_train"], b["x_train"])


def test_loaded_unpacks_like_keras_and_survives_pickle(data_env):
    loaded = _load_real("fashion_mnist")
    assert isinstance(loaded, tuple) and len(loaded) == 2
    (x_train, _), (x_test, _) = loaded
    assert loaded.train[0] is x_train and loaded.test[0] is x_test
    assert "Fashion-MNIST from kit-cache" in repr(loaded) and "uint8[60000, 28, 28]" in repr(loaded)
    copy = pickle.loads(pickle.dumps(loaded))
    assert copy.info == loaded.info
    _assert_same(copy, loaded)


def test_dataset_info_checks_itself():
    good = dict(
        name="cifar10",
        display_name="CIFAR-10",
        source="keras",
        synthetic=False,
        num_classes=10,
        class_names=data.class_names("cifar10"),
        image_shape=(32, 32, 3),
        path=None,
    )
    assert data.DatasetInfo(**good).source == "keras"
    with pytest.raises(ConfigError, match="synthetic"):
        data.DatasetInfo(**{**good, "synthetic": True})
    with pytest.raises(ConfigError, match="source"):
        data.DatasetInfo(**{**good, "source": "internet"})
    with pytest.raises(ConfigError, match="num_classes"):
        data.DatasetInfo(**{**good, "num_classes": 9})


def test_offline_status_names_the_source_load_uses(data_env):
    rows = {row.name: row for row in data.status()}
    assert (rows["mnist"].source, rows["mnist"].cache) == ("kit-cache", "ok")
    assert (rows["fashion_mnist"].source, rows["fashion_mnist"].cache) == ("kit-cache", "ok")
    assert (rows["cifar10"].source, rows["cifar10"].cache) == ("synthetic", "n/a")
    assert "NOT CIFAR-10" in rows["cifar10"].detail


def test_online_without_network_skips_keras_quickly(data_env, monkeypatch):
    """Not offline, no route to Keras' host: load() must fall back fast, not hang."""
    monkeypatch.delenv("DDLKIT_OFFLINE")
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    start = time.monotonic()
    loaded = _load_real("mnist")
    assert loaded.info.source == "kit-cache"
    assert time.monotonic() - start < 30


def _keras_cache_with_fashion(home):
    target = home / ".keras" / "datasets" / "fashion-mnist"
    target.mkdir(parents=True)
    for name in FASHION_MNIST_FILES:
        shutil.copy(FASHION_DEFAULT_DIR / name, target / name)
    return target


@pytest.mark.slow
def test_keras_cache_comes_first_and_matches_the_kit_cache(data_env, tmp_path):
    """Fashion-MNIST in Keras' own cache: the real Keras loader reads it, same bytes as ours."""
    target = _keras_cache_with_fashion(tmp_path / "home")
    from_keras = _load_real("fashion_mnist")
    assert from_keras.info.source == "keras" and from_keras.info.path == target
    _assert_same(from_keras, data.load("fashion_mnist", source="kit-cache"))
    rows = {row.name: row for row in data.status()}
    assert rows["fashion_mnist"].source == "keras"


class _RefusingProxy:
    """A loopback HTTP proxy that answers every request with 502: downloads fail for real."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        deadline = time.monotonic() + 120
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    if conn.recv(4096):
                        self.requests += 1
                        conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.slow
def test_failed_keras_download_falls_back_to_the_kit_cache(data_env, tmp_path, monkeypatch):
    """Online as far as the probe can tell, but Keras' download fails: the kit cache is used."""
    monkeypatch.delenv("DDLKIT_OFFLINE")
    # urllib builds its global opener, proxies included, at the first urlopen of the
    # process; an earlier test's download would pin it to "no proxy". Start afresh.
    monkeypatch.setattr(urllib.request, "_opener", None)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with _RefusingProxy() as proxy:
        for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(var, f"http://127.0.0.1:{proxy.port}")
        loaded = _load_real("mnist")
    assert proxy.requests >= 1  # Keras really tried to download through the proxy
    assert loaded.info.source == "kit-cache"
    assert not (tmp_path / "home" / ".keras" / "datasets" / "mnist.npz").exists()


@pytest.mark.slow
def test_a_small_cnn_learns_the_standin_well_above_chance():
    from ddlkit import backend

    keras = backend.keras()
    keras.utils.set_random_seed(0)
    arrays = standin.generate(train_per_class=800, test_per_class=100)
    model = keras.Sequential(
        [
            keras.layers.Input((32, 32, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(arrays["x_train"], arrays["y_train"], epochs=2, batch_size=64, verbose=0)
    _, accuracy = model.evaluate(arrays["x_test"], arrays["y_test"], verbose=0)
    assert accuracy > 0.35  # chance is 0.10


def test_a_bad_file_in_keras_cache_is_not_handed_to_keras_offline(data_env, tmp_path):
    """Keras would try to download over a file that fails its hash (and delete it on failure)."""
    fake = tmp_path / "home" / ".keras" / "datasets" / "mnist.npz"
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"not Keras' mnist.npz")
    loaded = _load_real("mnist")
    assert loaded.info.source == "kit-cache"
    assert fake.read_bytes() == b"not Keras' mnist.npz"
    row = data.status(["mnist"])[0]
    assert row.source == "kit-cache"
