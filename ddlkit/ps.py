"""Parameter-server training seen from the notebook: where the variables live, gradient
staleness, and synchronous against asynchronous time-to-accuracy.

Functions over what ``launch/train_parameter_server.py`` and ``launch/train_sync_eval.py``
report (no TensorFlow here):

- :class:`Placement` shows which ps task holds each variable (or each shard of it);
- :func:`summarize` and :func:`counts` turn the staleness of each asynchronous
  step (how many updates by other workers landed between reading the weights
  and applying the step's gradients) into summary numbers and a histogram;
- :func:`eval_curve` reads the ``eval`` events a run's chief (parameter server
  script) or worker-0 (``launch/train_sync_eval.py``) reported: accuracy on the
  same held-out images against training seconds (evaluation time left out);
- :func:`time_to_accuracy` is the first training second a curve reached a target
  (both from :mod:`ddlkit.metrics.evals`, where every reader of eval events goes);
- :class:`SyncAsync` puts a synchronous and an asynchronous run side by side as
  a table and one figure (:meth:`SyncAsync.plot`); :class:`Comparison` (built by
  :func:`compare_runs`) does the same for any number of runs (all-reduce, synchronous,
  asynchronous and Downpour parameter servers: ``launch/train_ps_modes.py``);
- :func:`throughput_around` compares examples/s before and after a step (a killed
  worker), and :func:`wait_for_step` waits until a running job reports a step.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ddlkit import contract
from ddlkit._tables import html_table
from ddlkit.errors import DdlkitError
from ddlkit.metrics.evals import EvalPoint, eval_points, time_to_accuracy
from ddlkit.metrics.waiting import wait_for

_PS_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


@dataclass(frozen=True)
class Placement:
    """Where a PS job's variables live: ``rows`` of (variable, shape, [(task, shard shape)]).

    Build it from the chief's report: ``Placement.from_report(run.results()["chief-0"])``.
    """

    rows: tuple[tuple[str, tuple[int, ...], tuple[tuple[str, tuple[int, ...]], ...]], ...]

    @classmethod
    def from_report(cls, report: Mapping) -> Placement:
        if "placement" not in report:
            raise DdlkitError(
                "this report has no 'placement' (which ps task holds which variable). Fix: "
                "pass the chief's result of launch/train_parameter_server.py, "
                "run.results()['chief-0']."
            )
        rows = []
        for v in report["placement"]:
            shards = tuple((task_of(s["device"]), tuple(s["shape"])) for s in v["shards"])
            rows.append((v["name"], tuple(v["shape"]), shards))
        return cls(tuple(rows))

    def tasks(self) -> dict[str, int]:
        """Parameters held by each task (shards counted where they are)."""
        held: dict[str, int] = {}
        for _, _, shards in self.rows:
            for task, shape in shards:
                held[task] = held.get(task, 0) + math.prod(shape)
        return dict(sorted(held.items()))

    def _repr_html_(self) -> str:
        rows = [
            (name, "x".join(map(str, shape)) or "scalar",
             " + ".join(f"{task} {'x'.join(map(str, s))}" for task, s in shards))
            for name, shape, shards in self.rows
        ]  # fmt: skip
        held = ", ".join(f"{task}: {n:,} parameters" for task, n in self.tasks().items())
        return html_table(("variable", "shape", "shards (task, shape)"), rows, caption=held)


def task_of(device: str) -> str:
    """``ps-1`` for ``/job:ps/replica:0/task:1/device:CPU:0`` (pure)."""
    found = _PS_TASK.search(device)
    if not found:
        raise DdlkitError(
            f"device {device!r} names no task (/job:NAME/replica:R/task:N). Fix: pass a "
            f"variable's .device from a multi-process job."
        )
    return f"{found.group(1)}-{found.group(2)}"


@dataclass(frozen=True)
class StalenessSummary:
    """Staleness of a set of asynchronous steps (0 = no other update in between)."""

    count: int
    mean: float
    median: float
    max: int
    stale_fraction: float  # share of steps with staleness > 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _check_values(values: Sequence[int]) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise DdlkitError(
                f"staleness {v!r} is not an integer >= 0: it counts updates between a step's "
                f"read of the weights and its own update. Fix: pass the step function's "
                f"int(iterations_after - iterations_before) values."
            )
        out.append(v)
    return out


def summarize(values: Sequence[int]) -> StalenessSummary:
    """Count, mean, median, max and the share of stale steps (pure)."""
    vals = sorted(_check_values(values))
    if not vals:
        raise DdlkitError(
            "no staleness values to summarize. Fix: pass the values of at least one step."
        )
    n = len(vals)
    mid = n // 2
    median = float(vals[mid]) if n % 2 else (vals[mid - 1] + vals[mid]) / 2
    return StalenessSummary(
        count=n,
        mean=sum(vals) / n,
        median=median,
        max=vals[-1],
        stale_fraction=sum(1 for v in vals if v > 0) / n,
    )


def counts(values: Sequence[int]) -> dict[str, int]:
    """A histogram ``{"0": steps, "1": steps, ...}`` with every value up to the max (pure).

    Keys are strings so the histogram survives JSON unchanged.
    """
    vals = _check_values(values)
    if not vals:
        return {}
    out = {str(k): 0 for k in range(max(vals) + 1)}
    for v in vals:
        out[str(v)] += 1
    return out


def from_counts(histogram: Mapping[str, int]) -> list[int]:
    """The values a :func:`counts` histogram was made from, in sorted order (pure)."""
    out: list[int] = []
    for key, n in sorted(histogram.items(), key=lambda kv: int(kv[0])):
        out.extend([int(key)] * int(n))
    return out


def eval_curve(records: Iterable) -> list[EvalPoint]:
    """The ``eval`` events of a run's records, in training-time order (pure), each with
    its step, examples, train_seconds, accuracy and loss
    (:func:`ddlkit.metrics.evals.eval_points`, which raises naming a missing one).

    ``records`` are :class:`ddlkit.metrics.Record` objects (``dk.metrics.load_run``
    or ``run.records()``); only events named ``eval`` count.
    """
    return eval_points(records, require=("step", "examples", "loss"))


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


@dataclass(frozen=True)
class SyncAsync:
    """A synchronous and an asynchronous run on the same model and data, side by side."""

    sync: RunCurve
    async_: RunCurve
    target: float | None = None  # None: the lower of the two final accuracies, minus 0.01

    @property
    def chosen_target(self) -> float:
        if self.target is not None:
            return self.target
        low = min(self.sync.final_accuracy, self.async_.final_accuracy)
        return max(0.0, math.floor((low - 0.01) * 100) / 100)

    def rows(self) -> list[list[str]]:
        target = self.chosen_target
        rows = []
        for kind, run in (("synchronous", self.sync), ("asynchronous", self.async_)):
            tta = time_to_accuracy(run.curve, target)
            stale = summarize(run.staleness) if run.staleness else None
            rows.append(
                [
                    run.label,
                    kind,
                    f"{run.final_accuracy:.4f}",
                    f"{run.train_seconds:.1f}",
                    "not reached" if tta is None else f"{tta:.1f}",
                    "-" if run.examples_per_sec is None else f"{run.examples_per_sec:,.0f}",
                    "0 (by design)"
                    if stale is None
                    else f"mean {stale.mean:.2f}, max {stale.max}, "
                    f"{stale.stale_fraction:.0%} stale",
                ]
            )
        return rows

    def table_html(self) -> str:
        head = (
            "run",
            "updates",
            "final eval acc",
            "train s",
            f"s to {self.chosen_target:.2f}",
            "examples/s",
            "staleness",
        )
        return html_table(head, self.rows())

    def __repr__(self) -> str:
        return "\n".join(" | ".join(r) for r in self.rows())

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

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.plot().savefig(buffer, format="png")
        return buffer.getvalue()

    def _repr_html_(self) -> str:
        image = base64.b64encode(self.png()).decode()
        return f"<img src='data:image/png;base64,{image}'/><br>{self.table_html()}"


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


@dataclass(frozen=True)
class Comparison:
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

    @property
    def chosen_target(self) -> float:
        if self.target is not None:
            return self.target
        low = min(run.final_accuracy for run in self.runs)
        return max(0.0, math.floor((low - 0.01) * 100) / 100)

    def times_to_target(self) -> dict[str, float | None]:
        """Training seconds each run took to reach the target (None: not reached)."""
        return {run.label: time_to_accuracy(run.curve, self.chosen_target) for run in self.runs}

    def rows(self) -> list[list[str]]:
        rows = []
        for run, kind in zip(self.runs, self.kinds, strict=True):
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
                    "not measured (none by design)"
                    if stale is None
                    else f"mean {stale.mean:.2f}, max {stale.max}, "
                    f"{stale.stale_fraction:.0%} stale",
                ]
            )
        return rows

    def table_html(self) -> str:
        head = ("run", "updates", "final eval acc", "train s", f"s to {self.chosen_target:.2f}")
        return html_table((*head, "examples/s", "staleness"), self.rows())

    def __repr__(self) -> str:
        return "\n".join(" | ".join(r) for r in self.rows())

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

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.plot().savefig(buffer, format="png")
        return buffer.getvalue()

    def _repr_html_(self) -> str:
        image = base64.b64encode(self.png()).decode()
        return f"<img src='data:image/png;base64,{image}'/><br>{self.table_html()}"


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


def throughput_around(records: Iterable, step: int, worker: str = "chief-0") -> tuple[float, float]:
    """Median examples/s of ``worker``'s step records up to ``step`` and after it (pure).

    For a worker killed when the chief had reported ``step``: the cluster's speed with
    every worker, and with the ones left. The first record (tracing, start-up) is left out.
    """
    steps = [r for r in records if r.kind == "step" and r.worker == worker and r.examples_per_sec]
    before = [r.examples_per_sec for r in steps[1:] if r.step <= step]
    after = [r.examples_per_sec for r in steps[1:] if r.step > step]
    if not before or not after:
        raise DdlkitError(
            f"{worker} reported {len(before)} step record(s) up to step {step} and {len(after)} "
            f"after it (the first one left out); both sides need one. Fix: kill later, or run "
            f"more steps after the kill."
        )
    return _median(before), _median(after)


def _median(values: Sequence[float]) -> float:
    vals = sorted(values)
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def wait_for_step(run, step: int, *, worker: str = "chief-0", timeout: float = 600) -> int:
    """Wait until ``worker`` of a running job reported at least ``step`` steps; the step.

    Raises JobTimeoutError after ``timeout`` seconds (the job keeps running), the
    run's WorkerFailedError if a worker failed first, and DdlkitError if the job ended
    first without failing (:func:`ddlkit.metrics.waiting.wait_for`).
    """

    def last(records: Sequence) -> int:
        return max((r.step for r in records if r.kind == "step"), default=0)

    def found(records: Sequence) -> int | None:
        return last(records) if last(records) >= step else None

    def ended(records: Sequence) -> str:
        return (
            f"run {run.run_id} ended ({run.job.state}) before {worker} reported step {step} "
            f"(last: {last(records)}). Fix: wait for an earlier step, or run more steps."
        )

    def late(records: Sequence) -> str:
        return (
            f"{worker} of run {run.run_id} has not reported step {step} after {timeout} s "
            f"(last: {last(records)}). Fix: wait longer, or look at run.tail({worker!r})."
        )

    return wait_for(run, found, timeout=timeout, ended=ended, late=late, worker=worker)
