"""Data sets in Keras' format, offline: ``(x_train, y_train), (x_test, y_test) = load("mnist")``.

- :func:`load` tries Keras' own cache or download, then the kit's verified
  offline cache, then (CIFAR-10 only) a synthetic stand-in that warns.
- :func:`prepare` builds the offline cache (``python -m ddlkit.data prepare``).
- :func:`status` tells what ``load`` would use (``python -m ddlkit.data status``).

Nothing here imports TensorFlow until Keras' loaders are actually used.
"""

from __future__ import annotations

from ddlkit.data.build import PrepareResult, prepare
from ddlkit.data.catalog import NAMES, SOURCES, class_names
from ddlkit.data.info import DatasetInfo, Loaded
from ddlkit.data.sources import load
from ddlkit.data.standin import SyntheticDataWarning
from ddlkit.data.status import DataStatus, status

__all__ = [
    "NAMES",
    "SOURCES",
    "DataStatus",
    "DatasetInfo",
    "Loaded",
    "PrepareResult",
    "SyntheticDataWarning",
    "class_names",
    "load",
    "prepare",
    "status",
]


def __getattr__(name: str):
    # `dk.data.pipeline` (it loads TensorFlow), `dk.data.image_folder` and `dk.data.text` without an
    # explicit import, loaded only on use.
    if name in ("pipeline", "image_folder", "text"):
        import importlib

        module = importlib.import_module(f"ddlkit.data.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'ddlkit.data' has no attribute {name!r}")
