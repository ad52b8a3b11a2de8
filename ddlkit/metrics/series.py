"""Records gathered per worker into plottable series and status facts (pure).

:class:`RunData` is what the dashboard and :func:`ddlkit.metrics.plot_run`
both draw from: per worker, the step records (or, for workers that report
only epochs, e.g. under ParameterServerStrategy, the epoch records) as
columns; the latest record; what ``train_begin`` said (epochs, steps); and
whether the worker reported ``train_end``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import numpy as np

from ddlkit.metrics.records import Record

# matplotlib's "tab10" colours, so the status table can show the lines' colours.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
COLUMNS = ("step", "loss", "accuracy", "wall_time", "examples_per_sec")


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


class _Columns:
    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {name: [] for name in COLUMNS}

    def add(self, record: Record) -> None:
        for name in COLUMNS:
            self.values[name].append(_nan(getattr(record, name)))

    def __len__(self) -> int:
        return len(self.values["step"])


class WorkerData:
    """One worker's series and latest state."""

    def __init__(self, name: str, color: str) -> None:
        self.name = name
        self.color = color
        self.steps = _Columns()
        self.epochs = _Columns()
        self.latest: Record | None = None
        self.latest_epoch: Record | None = None
        self.begin: dict = {}
        self.ended = False

    def add(self, record: Record) -> None:
        self.latest = record
        if record.kind == "step":
            self.steps.add(record)
        elif record.kind == "epoch":
            self.epochs.add(record)
            self.latest_epoch = record
        elif record.name == "train_begin":
            self.begin = dict(record.info)
            self.ended = False
        elif record.name == "train_end":
            self.ended = True

    def columns(self) -> dict[str, np.ndarray]:
        """Step columns if the worker reported steps, else its epoch columns."""
        source = self.steps if len(self.steps) else self.epochs
        return {name: np.asarray(values, dtype=float) for name, values in source.values.items()}

    @property
    def total_steps(self) -> int | None:
        """The ``step`` this worker's training ends at, from ``train_begin``."""
        epochs, steps = self.begin.get("epochs"), self.begin.get("steps")
        initial = self.begin.get("initial_step", 0)
        if not isinstance(initial, int) or isinstance(initial, bool) or initial < 0:
            initial = 0
        if isinstance(epochs, int) and isinstance(steps, int) and epochs > 0 and steps > 0:
            return initial + epochs * steps
        return None

    @property
    def epochs_total(self) -> int | None:
        epochs = self.begin.get("epochs")
        return epochs if isinstance(epochs, int) and epochs > 0 else None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What one redraw needs: per worker ``(colour, columns)``, and the run's start time."""

    t0: float | None
    version: int
    workers: Mapping[str, tuple[str, dict[str, np.ndarray]]]


class RunData:
    """Records of one run, gathered per worker; ``version`` counts records added."""

    def __init__(self, workers: Iterable[str] = ()) -> None:
        self.workers: dict[str, WorkerData] = {}
        self.t0: float | None = None
        self.version = 0
        for name in workers:
            self.worker(name)

    def worker(self, name: str) -> WorkerData:
        if name not in self.workers:
            color = PALETTE[len(self.workers) % len(PALETTE)]
            self.workers[name] = WorkerData(name, color)
        return self.workers[name]

    def add(self, record: Record) -> None:
        self.worker(record.worker).add(record)
        if self.t0 is None or record.wall_time < self.t0:
            self.t0 = record.wall_time
        self.version += 1

    def extend(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)

    def snapshot(self) -> Snapshot:
        """Copies of the columns of every worker that has values, safe to draw while
        records keep arriving."""
        return Snapshot(
            t0=self.t0,
            version=self.version,
            workers={
                name: (w.color, w.columns())
                for name, w in self.workers.items()
                if len(w.steps) or len(w.epochs)
            },
        )

    def total_steps(self) -> int | None:
        totals = [w.total_steps for w in self.workers.values() if w.total_steps]
        return max(totals) if totals else None

    def steps_done(self) -> int:
        """Steps of the slowest worker that has reported anything."""
        done = [w.latest.step for w in self.workers.values() if w.latest is not None]
        return min(done) if done else 0


def downsample(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: means of equal consecutive buckets (NaNs ignored)."""
    n = len(x)
    if n <= max_points:
        return x, y
    size = math.ceil(n / max_points)
    starts = np.arange(0, n, size)
    counts = np.diff(np.append(starts, n))
    valid = ~np.isnan(y)
    y_sum = np.add.reduceat(np.where(valid, y, 0.0), starts)
    y_count = np.add.reduceat(valid.astype(float), starts)
    x_mean = np.add.reduceat(x, starts) / counts
    with np.errstate(invalid="ignore", divide="ignore"):
        y_mean = np.where(y_count > 0, y_sum / np.maximum(y_count, 1), np.nan)
    return x_mean, y_mean
