"""Measured results that notebooks save and later notebooks compare against.

Notebook 00 saves the single-device baseline; every strategy notebook saves
its own run and shows it next to the baseline with `compare()`. Results are
small JSON files under ``runs/results/`` (never pickle).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ddlkit import contract, settings, strategies
from ddlkit._tables import html_table
from ddlkit.errors import DdlkitError


@dataclass(frozen=True)
class Result:
    """One measured training run, as a learner would compare it."""

    name: str
    strategy: str
    dataset: str
    workers: int
    replicas: int
    global_batch: int
    epochs: float
    steps: int
    examples_per_sec: float
    test_accuracy: float
    train_seconds: float
    synthetic_data: bool = False
    notes: str = ""
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(
                f"result name {self.name!r} must be a plain file name, e.g. 'baseline'"
            )
        for attr in ("workers", "replicas", "global_batch", "steps"):
            if getattr(self, attr) < 1:
                raise ValueError(f"{attr} must be >= 1, got {getattr(self, attr)}")
        if not 0.0 <= self.test_accuracy <= 1.0:
            raise ValueError(f"test_accuracy must be in [0, 1], got {self.test_accuracy}")
        if self.examples_per_sec <= 0 or self.train_seconds <= 0:
            raise ValueError("examples_per_sec and train_seconds must be positive")

    @property
    def steps_per_sec(self) -> float:
        return self.examples_per_sec / self.global_batch

    @property
    def label(self) -> str:
        data = f"{self.dataset} (synthetic stand-in)" if self.synthetic_data else self.dataset
        return f"{self.strategy} x{self.replicas} on {data}"

    def _repr_html_(self) -> str:
        return table([self])


def throughput(records, *, skip: int = 5) -> float:
    """Steady-state examples/sec of a run, from its metric records (pure).

    For each worker, the median ``examples_per_sec`` of its step records after
    the first `skip` (graph tracing and warm-up); the workers' medians add up,
    since each reports the examples it processed.
    """
    by_worker: dict[str, list[float]] = {}
    for r in records:
        if r.kind == "step" and r.examples_per_sec:
            by_worker.setdefault(r.worker, []).append(r.examples_per_sec)
    if not by_worker:
        raise DdlkitError(
            "no step records with examples_per_sec to measure throughput from. Fix: report "
            "steps with KerasReporter(batch_size=...) or live_plot(..., batch_size=...)."
        )
    total = 0.0
    for values in by_worker.values():
        steady = values[skip:] if len(values) > skip else values
        steady = sorted(steady)
        mid = len(steady) // 2
        total += steady[mid] if len(steady) % 2 else (steady[mid - 1] + steady[mid]) / 2
    return total


# What every worker script of launch/ reports (launch/_common.py checks it), so that
# `from_run` can turn any run into a Result.
REPORT_KEYS = (
    "dataset",
    "epochs",
    "steps",
    "global_batch",
    "replicas",
    "examples_per_sec",
    "test_accuracy",
    "train_seconds",
)
# Whose record speaks for a run of unknown strategy (from_records): the coordinator, else
# the first worker or rank. A launched run's strategy says it (ddlkit.strategies).
_SPOKESMEN = (
    contract.task_name("chief", 0),
    "chief",  # results saved before the chief was named chief-0
    contract.MAIN,
    contract.task_name("worker", 0),
    contract.rank_name(0),
)


def from_run(
    run,
    name: str,
    strategy: str,
    *,
    worker: str | None = None,
    notes: str = "",
    dataset: str | None = None,
    global_batch: int | None = None,
) -> Result:
    """The Result of a finished launched run (``dk.launch.start``), from what its worker
    scripts reported and its metric records.

    Throughput is the steady-state rate of the step records where there are any (all
    workers added up), else the rate the worker reported. Fast-mode runs say so in notes.

    Scripts of ``launch/`` report their result (``launch/_common.py``). A plain script that
    only adds a ``KerasReporter`` to its callbacks has no report: then everything comes from
    its records (:func:`from_records`), and ``dataset`` must be given.
    """
    impl = strategies.get(run.config.strategy)  # its conventions: speaker, process count
    reports = run.results()
    if not reports:
        records = run.records() or _records_on_disk(run.run_dir)
        if not records:
            raise DdlkitError(
                f"run {run.run_id} has neither worker results in "
                f"{contract.results_dir(run.run_dir)} nor metric records. Fix: wait for it "
                f"to finish (run.wait()); its scripts must call report() from "
                f"launch/_common.py or add a ddlkit KerasReporter."
            )
        return from_records(
            records,
            name,
            strategy,
            dataset=dataset,
            workers=impl.result_processes(run.config),
            global_batch=global_batch,
            worker=worker,
            notes=notes,
            speakers=impl.speakers,
        )
    if worker is None:
        # whose report speaks for the run: the strategy says (ddlkit.strategies)
        worker = impl.speaker(list(reports))
    if worker not in reports:
        raise DdlkitError(
            f"run {run.run_id} has no result from {worker!r}. Fix: use one of "
            f"{', '.join(sorted(reports))}."
        )
    report = reports[worker]
    missing = [k for k in REPORT_KEYS if k not in report]
    if missing:
        raise DdlkitError(
            f"{worker}'s result in run {run.run_id} lacks {', '.join(missing)}. Fix: report "
            f"every key of ddlkit.results.REPORT_KEYS from the worker script."
        )
    records = run.records()
    try:
        rate = throughput(records) if records else float(report["examples_per_sec"])
    except DdlkitError:
        rate = float(report["examples_per_sec"])
    if settings.fast_mode():
        notes = ", ".join(n for n in (notes, "fast mode") if n)
    return Result(
        name=name,
        strategy=strategy,
        dataset=str(report["dataset"]),
        workers=impl.result_processes(run.config),
        replicas=int(report["replicas"]),
        global_batch=int(report["global_batch"]),
        epochs=float(report["epochs"]),
        steps=int(report["steps"]),
        examples_per_sec=rate,
        test_accuracy=float(report["test_accuracy"]),
        train_seconds=float(report["train_seconds"]),
        synthetic_data=bool(report.get("synthetic_data", False)),
        notes=notes,
    )


def from_records(
    records,
    name: str,
    strategy: str,
    *,
    dataset: str | None,
    workers: int,
    global_batch: int | None = None,
    worker: str | None = None,
    notes: str = "",
    speakers: Sequence[str] = _SPOKESMEN,
) -> Result:
    """A Result from the records a ``KerasReporter`` sends (pure).

    - throughput: :func:`throughput` of the step records (all workers added up);
    - test accuracy: the ``evaluate`` event of ``worker`` (default: the one that speaks for
      the run: the chief, else worker or rank 0), sent when the script calls
      ``model.evaluate(test_ds, callbacks=callbacks)`` with the reporter in ``callbacks``;
    - epochs, steps, train seconds: that worker's ``train_begin`` and ``train_end`` events;
    - replicas: ``train_begin``'s ``replicas``; global batch: ``global_batch``, else the sum
      of every worker's ``batch_size`` (each reports the examples its steps count).
    """
    if not dataset:
        raise DdlkitError(
            f"result {name!r}: the run's scripts report no data set (they send only metric "
            f"records). Fix: pass dataset=, e.g. from_run(run, {name!r}, {strategy!r}, "
            f"dataset='mnist')."
        )
    events: dict[str, dict[str, list]] = {}
    for r in records:
        if r.kind == "event" and r.name in ("train_begin", "train_end", "evaluate"):
            events.setdefault(r.worker, {}).setdefault(r.name, []).append(r)
    evaluated = sorted(w for w, e in events.items() if "evaluate" in e)
    if worker is None:
        worker = next((w for w in speakers if w in evaluated), evaluated[0] if evaluated else None)
    if worker is None or "evaluate" not in events.get(worker, {}):
        raise DdlkitError(
            f"result {name!r}: no 'evaluate' event from {worker or 'any worker'} "
            f"(workers with one: {', '.join(evaluated) or 'none'}). Fix: end the script with "
            f"model.evaluate(test_ds, callbacks=callbacks) where callbacks holds its "
            f"KerasReporter."
        )
    mine = events[worker]
    if not mine.get("train_begin") or not mine.get("train_end"):
        raise DdlkitError(
            f"result {name!r}: {worker} sent no train_begin/train_end events: its training "
            f"did not finish. Fix: wait for the run (run.wait()) and check its log (run.tail)."
        )
    begin, end = mine["train_begin"][0], mine["train_end"][-1]
    accuracy = mine["evaluate"][-1].info.get("accuracy")
    if accuracy is None:
        raise DdlkitError(
            f"result {name!r}: {worker}'s evaluate event has no accuracy. Fix: compile the "
            f"model with metrics=['accuracy']."
        )
    if global_batch is None:
        sizes = [
            e["train_begin"][0].info.get("batch_size")
            for e in events.values()
            if e.get("train_begin")
        ]
        if not sizes or not all(sizes):
            raise DdlkitError(
                f"result {name!r}: not every worker reported its batch size. Fix: pass "
                f"global_batch=, or KerasReporter(batch_size=...) in every worker."
            )
        global_batch = int(sum(sizes))
    if settings.fast_mode():
        notes = ", ".join(n for n in (notes, "fast mode") if n)
    return Result(
        name=name,
        strategy=strategy,
        dataset=dataset,
        workers=workers,
        replicas=int(begin.info.get("replicas") or 1),
        global_batch=int(global_batch),
        epochs=float(begin.info.get("epochs") or 1),
        steps=int(end.info.get("steps") or end.step),
        examples_per_sec=throughput(records),
        test_accuracy=float(accuracy),
        train_seconds=end.wall_time - begin.wall_time,
        notes=notes,
    )


def _records_on_disk(run_dir) -> list:
    """The run's JSONL records (a run without a live collector), or none."""
    from ddlkit.metrics import load_run

    return load_run(run_dir) if contract.metrics_dir(run_dir).is_dir() else []


def results_dir() -> Path:
    return contract.saved_results_dir(settings.runs_dir())


def save(result: Result, directory: Path | None = None) -> Path:
    """Write `result` as JSON, atomically, and return its path."""
    directory = Path(directory) if directory else results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(result), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def load(name: str, directory: Path | None = None) -> Result:
    directory = Path(directory) if directory else results_dir()
    path = directory / f"{name}.json"
    if not path.exists():
        have = sorted(p.stem for p in directory.glob("*.json")) if directory.exists() else []
        hint = (
            "run notebooks/00_start_here.ipynb to measure the baseline"
            if name == "baseline"
            else "run the notebook that saves it"
        )
        raise DdlkitError(
            f"no saved result {name!r} in {directory} (saved: {', '.join(have) or 'none'}). "
            f"Fix: {hint}."
        )
    raw = json.loads(path.read_text())
    known = {f.name for f in fields(Result)}
    return Result(**{k: v for k, v in raw.items() if k in known})


def table(results: list[Result], baseline: Result | None = None) -> str:
    """An HTML table of results; with a baseline, speed-up and accuracy change too."""
    head = [
        "run",
        "strategy",
        "replicas",
        "global batch",
        "examples/s",
        "steps/s",
        "test acc",
        "train s",
    ]
    if baseline:
        head += ["speed-up", "acc change"]
    rows = []
    for r in results:
        cells = [
            r.name,
            r.label,
            str(r.replicas),
            str(r.global_batch),
            f"{r.examples_per_sec:,.0f}",
            f"{r.steps_per_sec:.2f}",
            f"{r.test_accuracy:.4f}",
            f"{r.train_seconds:.1f}",
        ]
        if baseline:
            cells += [
                f"{r.examples_per_sec / baseline.examples_per_sec:.2f}x",
                f"{r.test_accuracy - baseline.test_accuracy:+.4f}",
            ]
        rows.append(cells)
    return html_table(head, rows)


class Comparison:
    """Results side by side with the baseline; shows as a table in a notebook."""

    def __init__(self, results: list[Result], baseline: Result | None) -> None:
        self.results = results
        self.baseline = baseline

    def _repr_html_(self) -> str:
        rows = ([self.baseline] if self.baseline else []) + self.results
        return table(rows, self.baseline)

    def __repr__(self) -> str:
        base = self.baseline
        lines = []
        for r in ([base] if base else []) + self.results:
            speed = f"  {r.examples_per_sec / base.examples_per_sec:.2f}x" if base else ""
            lines.append(
                f"{r.name:<16} {r.label:<40} {r.examples_per_sec:>10,.0f} ex/s  "
                f"acc {r.test_accuracy:.4f}{speed}"
            )
        return "\n".join(lines)


def compare(*results: Result, baseline: str | Result | None = "baseline") -> Comparison:
    """Show `results` next to the saved baseline (or the given one)."""
    base = load(baseline) if isinstance(baseline, str) else baseline
    return Comparison(list(results), base)
