"""Parameter-server and all-reduce runs side by side: time to accuracy and staleness.

One concern split out of :mod:`ddlkit.lessons.ps` (which re-exports every name here): a run read
back as a :class:`RunCurve` (:func:`load`), two runs as :class:`SyncAsync`
(:func:`compare`: synchronous against asynchronous) and any number as :class:`Comparison`
(:func:`compare_runs`: all-reduce, synchronous, asynchronous and Downpour parameter
servers), each as a table and one figure. Pure but for reading run directories and
drawing; no TensorFlow here.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlkit import contract
from ddlkit._tables import html_table
from ddlkit.errors import DdlkitError
from ddlkit.lessons.ps import _check_values, counts, eval_curve, from_counts, summarize
from ddlkit.metrics.evals import EvalPoint, time_to_accuracy


@dataclass(frozen=True)
class RunCurve:
    """One run for the comparison: a label, its eval curve and (async only) staleness."""

    label: str
    curve: tuple[EvalPoint, ...]
    staleness: tuple[int, ...] = ()
    examples_per_sec: float | None = None

    def __post_init__(self) -> None:
        if not self.curve:
            raise DdlkitError(
                f"run {self.label!r} has no eval points, so it has no time-to-accuracy curve. "
                f"Fix: run its script with --eval-every > 0 (the parameter server script, or "
                f"launch/train_sync_eval.py for synchronous training)."
            )
        object.__setattr__(self, "curve", tuple(self.curve))
        object.__setattr__(self, "staleness", tuple(_check_values(self.staleness)))

    @property
    def final_accuracy(self) -> float:
        return self.curve[-1].accuracy

    @property
    def train_seconds(self) -> float:
        return self.curve[-1].train_seconds


class _SideBySide:
    """What :class:`SyncAsync` and :class:`Comparison` share: the target, the table rows,
    and the HTML of figure plus table. Subclasses give their (run, kind) pairs and draw."""

    target: float | None
    UNMEASURED = "not measured (none by design)"  # the staleness cell of a run without any

    def pairs(self) -> tuple[tuple[RunCurve, str], ...]:
        raise NotImplementedError

    def plot(self, path: str | Path | None = None):
        raise NotImplementedError

    @property
    def chosen_target(self) -> float:
        """``target``, else the lowest final accuracy less 0.01, rounded down."""
        if self.target is not None:
            return self.target
        low = min(run.final_accuracy for run, _ in self.pairs())
        return max(0.0, math.floor((low - 0.01) * 100) / 100)

    def rows(self) -> list[list[str]]:
        rows = []
        for run, kind in self.pairs():
            tta = time_to_accuracy(run.curve, self.chosen_target)
            stale = summarize(run.staleness) if run.staleness else None
            rows.append(
                [
                    run.label,
                    kind,
                    f"{run.final_accuracy:.4f}",
                    f"{run.train_seconds:.1f}",
                    "not reached" if tta is None else f"{tta:.1f}",
                    "-" if run.examples_per_sec is None else f"{run.examples_per_sec:,.0f}",
                    self.UNMEASURED
                    if stale is None
                    else f"mean {stale.mean:.2f}, max {stale.max}, "
                    f"{stale.stale_fraction:.0%} stale",
                ]
            )
        return rows

    def table_html(self) -> str:
        head = ("run", "update rule", "final eval acc", "train s", f"s to {self.chosen_target:.2f}")
        return html_table((*head, "examples/s", "staleness"), self.rows())

    def __repr__(self) -> str:
        return "\n".join(" | ".join(r) for r in self.rows())

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.plot().savefig(buffer, format="png")
        return buffer.getvalue()

    def _repr_html_(self) -> str:
        image = base64.b64encode(self.png()).decode()
        return f"<img src='data:image/png;base64,{image}'/><br>{self.table_html()}"


@dataclass(frozen=True, repr=False)
class SyncAsync(_SideBySide):
    """A synchronous and an asynchronous run on the same model and data, side by side."""

    sync: RunCurve
    async_: RunCurve
    target: float | None = None  # None: the lower of the two final accuracies, minus 0.01

    UNMEASURED = "0 (by design)"

    def pairs(self) -> tuple[tuple[RunCurve, str], ...]:
        return ((self.sync, "synchronous"), (self.async_, "asynchronous"))

    def plot(self, path: str | Path | None = None):
        """One figure: held-out accuracy against training seconds for both runs, and the
        asynchronous run's staleness histogram. A matplotlib Figure not attached to pyplot
        (the notebook shows it through this object's HTML); ``path`` saves it too."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 3.6), dpi=100)
        FigureCanvasAgg(fig)
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": (3, 2)})
        for run, style in ((self.sync, "o-"), (self.async_, "s-")):
            left.plot(
                [p.train_seconds for p in run.curve],
                [p.accuracy for p in run.curve],
                style,
                label=run.label,
            )
        left.axhline(self.chosen_target, color="grey", linestyle=":", linewidth=1)
        left.set_xlabel("training seconds (evaluation excluded)")
        left.set_ylabel("held-out accuracy")
        left.set_title("time to accuracy")
        left.legend(loc="lower right")
        hist = counts(list(self.async_.staleness))
        right.bar([int(k) for k in hist], list(hist.values()), color="tab:orange")
        right.set_xticks([int(k) for k in hist])
        right.set_xlabel("staleness: other updates between read and apply")
        right.set_ylabel("steps")
        right.set_title(f"{self.async_.label}: gradient staleness")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
        return fig


def load(run_dir: str | Path, label: str | None = None) -> RunCurve:
    """A run's :class:`RunCurve` from its directory: the ``eval`` events of its metric
    files, the staleness histogram its chief saved (asynchronous runs only) and its
    steady-state examples/s (:func:`ddlkit.results.throughput`)."""
    from ddlkit.metrics import load_run
    from ddlkit.results import throughput

    run_dir = Path(run_dir)
    records = load_run(run_dir)
    histogram: dict[str, int] = {}
    for report in contract.read_results(run_dir).values():
        histogram = report.get("staleness_counts") or histogram
    steps = [r for r in records if r.kind == "step" and r.examples_per_sec]
    return RunCurve(
        label=label or run_dir.name,
        curve=tuple(eval_curve(records)),
        staleness=tuple(from_counts(histogram)),
        examples_per_sec=throughput(records) if steps else None,
    )


def compare(
    sync_run: str | Path,
    async_run: str | Path,
    *,
    target: float | None = None,
    labels: tuple[str, str] = ("synchronous (MWMS)", "asynchronous (PS)"),
) -> SyncAsync:
    """The side-by-side view of a synchronous and an asynchronous run directory."""
    return SyncAsync(load(sync_run, labels[0]), load(async_run, labels[1]), target)


@dataclass(frozen=True, repr=False)
class Comparison(_SideBySide):
    """Any number of runs of one model on one data set (e.g. MWMS all-reduce, synchronous,
    asynchronous and Downpour parameter servers), side by side: a table and one figure.

    ``kinds`` says how each run updates (shown in the table; "all-reduce" runs have no
    staleness by design). The target is the lowest final accuracy minus 0.01 unless given.
    """

    runs: tuple[RunCurve, ...]
    kinds: tuple[str, ...] = ()
    target: float | None = None

    def __post_init__(self) -> None:
        if len(self.runs) < 2:
            raise DdlkitError(
                f"a comparison needs at least two runs, got {len(self.runs)}. Fix: pass e.g. "
                f"{{'MWMS': mwms.run_dir, 'PS async': ps_run.run_dir}}."
            )
        kinds = self.kinds or ("",) * len(self.runs)
        if len(kinds) != len(self.runs):
            raise DdlkitError(
                f"{len(kinds)} kinds for {len(self.runs)} runs. Fix: one kind per run, or none."
            )
        object.__setattr__(self, "runs", tuple(self.runs))
        object.__setattr__(self, "kinds", tuple(kinds))

    def pairs(self) -> tuple[tuple[RunCurve, str], ...]:
        return tuple(zip(self.runs, self.kinds, strict=True))

    def times_to_target(self) -> dict[str, float | None]:
        """Training seconds each run took to reach the target (None: not reached)."""
        return {run.label: time_to_accuracy(run.curve, self.chosen_target) for run in self.runs}

    def plot(self, path: str | Path | None = None):
        """Left: held-out accuracy against training seconds of every run. Right: the share
        of updates (steps or pushes) with each staleness, one bar group per measured run."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(12, 3.8), dpi=100)
        FigureCanvasAgg(fig)
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": (3, 2)})
        for i, run in enumerate(self.runs):
            marker = "os^vDP*X"[i % 8]
            left.plot(
                [p.train_seconds for p in run.curve],
                [p.accuracy for p in run.curve],
                f"{marker}-",
                label=run.label,
            )
        left.axhline(self.chosen_target, color="grey", linestyle=":", linewidth=1)
        left.set_xlabel("training seconds (evaluation excluded)")
        left.set_ylabel("held-out accuracy")
        left.set_title("time to accuracy")
        left.legend(loc="lower right", fontsize="small")
        measured = [run for run in self.runs if run.staleness]
        width = 0.8 / max(1, len(measured))
        for i, run in enumerate(measured):
            hist = counts(list(run.staleness))
            total = sum(hist.values())
            right.bar(
                [int(k) + (i - (len(measured) - 1) / 2) * width for k in hist],
                [n / total for n in hist.values()],
                width=width,
                label=run.label,
                color=f"C{self.runs.index(run)}",
            )
        right.set_xlabel("staleness: other updates between read and apply")
        right.set_ylabel("share of updates")
        right.set_title("gradient staleness")
        if measured:
            right.legend(fontsize="small")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
        return fig


def compare_runs(
    runs: Mapping[str, str | Path | tuple[str | Path, str]], *, target: float | None = None
) -> Comparison:
    """The :class:`Comparison` of run directories, ``{label: run_dir}`` or
    ``{label: (run_dir, kind)}``, in the order given."""
    curves, kinds = [], []
    for label, where in runs.items():
        run_dir, kind = where if isinstance(where, tuple) else (where, "")
        curves.append(load(run_dir, label))
        kinds.append(kind)
    return Comparison(tuple(curves), tuple(kinds), target)
