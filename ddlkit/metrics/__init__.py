"""Live metrics: records, the worker-side reporter and Keras callback, the
notebook's collector, JSONL run files and the dashboard.

Importing this package is cheap (standard library only): the Keras callback,
the dashboard and the plots load TensorFlow, ipywidgets and matplotlib only
when first used.
"""

from __future__ import annotations

from ddlkit._lazy import lazy_attributes
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


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)
