"""Live metrics: records, the worker-side reporter and Keras callback, the
notebook's collector, JSONL run files and the dashboard.

Importing this package is cheap (standard library only): the Keras callback,
the dashboard and the plots load TensorFlow, ipywidgets and matplotlib only
when first used.
"""

from __future__ import annotations

import importlib

from ddlkit.metrics.collector import Collector, CollectorStats, WorkerStats
from ddlkit.metrics.records import Record
from ddlkit.metrics.reporter import Reporter, ReporterStats
from ddlkit.metrics.store import load_run, metrics_path

_LAZY = {
    "Dashboard": "ddlkit.metrics.dashboard",
    "plot_run": "ddlkit.metrics.plotting",
    "KerasReporter": "ddlkit.metrics.keras_callback",
    "LivePlot": "ddlkit.metrics.keras_callback",
    "live_plot": "ddlkit.metrics.keras_callback",
}

__all__ = [
    "Collector",
    "CollectorStats",
    "Dashboard",
    "KerasReporter",
    "LivePlot",
    "Record",
    "Reporter",
    "ReporterStats",
    "WorkerStats",
    "live_plot",
    "load_run",
    "metrics_path",
    "plot_run",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddlkit.metrics' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
