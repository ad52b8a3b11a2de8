"""ddlkit: learn and measure distributed training with TensorFlow and Horovod.

``import ddlkit as dk`` is cheap: it only chooses Keras (see
:mod:`ddlkit.backend`) and loads submodules when first used, so a worker or
the CLI does not pay for TensorFlow until it needs it.
"""

from __future__ import annotations

import importlib

from ddlkit import backend as _backend

_backend.select()

__version__ = "0.1.0"

# What each name under ``dk.`` loads. The lessons' helpers live in ddlkit/lessons/, apart from
# the machinery, and keep their lesson's name here: dk.mirrored, dk.ps, dk.faults...
_SUBMODULES = {
    name: f"ddlkit.{name}"
    for name in (
        "backend", "bench", "check", "cluster", "contract", "data", "env", "environments",
        "errors", "experiments", "horovod", "hosts", "interactive", "k8s", "launch", "lessons",
        "metrics", "models", "parallel", "plots", "ray", "recorded", "results", "scale",
        "settings", "slurm", "spark", "strategies", "where",
    )
} | {
    "faults": "ddlkit.lessons.faults",
    "lesson": "ddlkit.lessons.scripts",
    "memory": "ddlkit.lessons.memory",
    "mirrored": "ddlkit.lessons.mirrored",
    "ps": "ddlkit.lessons.ps",
    "replicas": "ddlkit.lessons.replicas",
}  # fmt: skip
# Functions of a submodule offered at the top: dk.workers(2, strategy=...).
_FUNCTIONS = {"workers": "ddlkit.interactive.session", "experiment": "ddlkit.experiments"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(_SUBMODULES[name])
        globals()[name] = module
        return module
    if name in _FUNCTIONS:
        value = getattr(importlib.import_module(_FUNCTIONS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddlkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES) + list(_FUNCTIONS))
