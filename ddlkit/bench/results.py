"""A strategy benchmark's results read back from ``bench.json``: typed, for notebooks.

One concern: showing a benchmark (its cases as the one table, with notes, where it ran,
the planned cases before a run); the file itself is :mod:`ddlkit.bench.schema`.

    res = load_results("runs/<bench-id>")        # the run directory or its bench.json
    res                                          # one row per case (HTML in a notebook)
    res.case("multi_worker-x2").efficiency       # speed-up over multi_worker-x1 / workers
    res.about()                                  # machine, date, command, load

Speed-up and efficiency are recomputed here from the cases' median throughputs
(:func:`ddlkit.bench.stats.scaling`), so every file, old or new, is read the same way:
against the same strategy with one worker, and against one device without a strategy
(``single-x1``), always among the cases of one architecture (``arch``: the CNN, or the
small ResNet of ``ddlkit bench --resnet``; :meth:`BenchResults.of_arch`). A number the
benchmark did not measure stays ``None`` with its reason (shown as ``not measured:
<reason>``); nothing is filled in. :func:`parse` is pure; :func:`load_results` also reads
the held-out accuracy curves from the runs' directories (bench.json keeps only each run's
time to the target).
"""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddlkit import contract
from ddlkit._tables import html_table, text_table
from ddlkit.bench import schema
from ddlkit.bench.config import describe
from ddlkit.bench.schema import BenchFile, CaseRecord, Spread
from ddlkit.bench.stats import drift_note, round_speeds, scaling
from ddlkit.errors import ConfigError
from ddlkit.metrics.evals import EvalPoint, eval_points


@dataclass(frozen=True)
class CaseSummary:
    """One case of a benchmark: a strategy with a worker count, over its repeats."""

    name: str
    strategy: str
    workers: int
    steps: int
    batch: int
    repeats: int
    model: str
    skipped: str  # "" unless the case was not run, then why
    error: str  # "" unless a run failed, then the error
    throughput: Spread | None  # examples/s, all workers added up
    step_time: Spread | None  # seconds per step (the slowest worker's)
    test_accuracy: Spread | None
    speedup: float | None = None  # throughput / the same strategy's x1 throughput
    efficiency: float | None = None  # speedup / workers
    vs_single: float | None = None  # throughput / single-x1 throughput
    vs_reference: float | None = None  # throughput / reference-x1 (the bare tf-keras loop)
    vs_ceiling: float | None = None  # xN: throughput / independent-xN (no communication)
    unstable: str = ""  # repeats that disagree (max/min > 1.10): how they split
    comm_share: float | None = None  # fraction of a step spent communicating
    comm_ms: float | None = None  # milliseconds of a step spent communicating
    comm_how: str = ""  # measured how, estimated how, or why not measured
    time_to_target: Spread | None = None  # training seconds to the target accuracy
    target_reached: str = ""  # "k/n" runs reached it
    target_note: str = ""  # why time_to_target is missing (or not every run reached it)
    foreign_cpu: Spread | None = None  # share of the case's cores other processes used
    eval_every: int = 0  # steps between held-out evaluations (0: none)
    arch: str = "cnn"  # what was trained on `model`: "cnn" or "small_resnet"
    run_ids: tuple[str, ...] = ()
    evals: tuple[tuple[EvalPoint, ...], ...] = ()  # one held-out curve per run, if found
    rates: tuple[float, ...] = ()  # each run's examples/s, in the order of the rounds

    @property
    def ok(self) -> bool:
        """Measured: run, not failed, with a throughput."""
        return self.throughput is not None and not self.skipped and not self.error

    @property
    def efficiency_vs_single(self) -> float | None:
        """vs_single / workers: each worker's share against one device without a strategy."""
        return None if self.vs_single is None else self.vs_single / self.workers

    @property
    def status(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.error:
            return f"FAILED: {self.error}"
        return "measured" if self.throughput is not None else "not run"

    @property
    def comm_measured(self) -> bool:
        """True when the communication share was measured, False when estimated."""
        return self.comm_how.startswith("measured")

    def comm_text(self) -> str:
        """The communication share with how it was found, or why it is missing."""
        if self.comm_share is not None:
            how = self.comm_how
            kind = (
                "measured" if self.comm_measured else "estimated" if how.startswith("est") else ""
            )
            return f"{self.comm_share:.0%}" + (f" ({kind})" if kind else "")
        how = self.comm_how
        if not how:
            return "not measured"
        if how.startswith("not "):
            return how
        return f"not measured: {how}"

    def target_text(self) -> str:
        if self.time_to_target is not None:
            reached = f", {self.target_reached} runs" if self.target_reached else ""
            return f"{self.time_to_target.median:.1f} s{reached}"
        note = self.target_note
        if not note:
            return "not measured"
        return note if note.startswith("not ") else f"not measured: {note}"


def _fmt(value: float | None, spec: str) -> str | None:
    return None if value is None else format(value, spec)


HEADERS = (
    "case",
    "examples/s (median)",
    "min-max (n)",
    "ms/step",
    "efficiency vs x1",
    "vs single-x1",
    "communication share",
    "time to target",
    "test acc",
    "others' CPU",
    "status",
    "vs ceiling",
    "vs reference",
)


@dataclass(frozen=True)
class BenchResults:
    """Every case of one benchmark, and where and how it was measured."""

    path: Path
    bench_id: str
    created: float  # Unix time the benchmark started
    quick: bool
    wall_seconds: float
    cores: tuple[int, ...]
    cores_per_worker: int
    cases: tuple[CaseSummary, ...]
    target_accuracy: float | None = None
    overhead_ratio: float | None = None  # examples/s through the kit / by hand (median)
    overhead_ratios: tuple[float, ...] = ()  # every pair's ratio
    overhead_note: str = ""  # why it is missing (it failed), "" when not asked for
    meta: tuple[tuple[str, str], ...] = ()  # what else the file says: command, host, load...

    def case(self, name: str) -> CaseSummary:
        for c in self.cases:
            if c.name == name:
                return c
        raise ConfigError(
            f"{self.path} has no case {name!r}. Fix: use one of "
            f"{', '.join(c.name for c in self.cases)}."
        )

    @property
    def measured(self) -> tuple[CaseSummary, ...]:
        return tuple(c for c in self.cases if c.ok)

    @property
    def strategies(self) -> tuple[str, ...]:
        """Strategies in the file's order, each once."""
        return tuple(dict.fromkeys(c.strategy for c in self.cases))

    @property
    def worker_counts(self) -> tuple[int, ...]:
        return tuple(sorted({c.workers for c in self.cases}))

    @property
    def archs(self) -> tuple[str, ...]:
        """The architectures the cases trained, in the file's order (``"cnn"`` first)."""
        return tuple(dict.fromkeys(c.arch for c in self.cases))

    def of_arch(self, arch: str) -> BenchResults:
        """These results with only the cases of `arch` (what a plot compares)."""
        if arch not in self.archs:
            raise ConfigError(
                f"{self.path} has no {arch!r} cases. Fix: use one of {', '.join(self.archs)}."
            )
        return replace(self, cases=tuple(c for c in self.cases if c.arch == arch))

    @property
    def single(self) -> CaseSummary | None:
        """The one-device case without a strategy of the first arch, if it was measured."""
        first = self.archs[0]
        return next((c for c in self.measured if (c.strategy, c.arch) == ("single", first)), None)

    @property
    def has_evals(self) -> bool:
        """Held-out curves were found (in the runs' directories)."""
        return any(c.evals for c in self.cases)

    @property
    def has_target_times(self) -> bool:
        return any(c.time_to_target is not None for c in self.cases)

    @property
    def round_speeds(self) -> tuple[float, ...] | None:
        """The machine's speed in each round, from every measured case (``stats.round_speeds``)."""
        return round_speeds([c.rates for c in self.measured])

    def unstable_note(self, c: CaseSummary) -> str:
        """How `c`'s repeats split, and whether the machine's drift between rounds explains it."""
        if not c.unstable:
            return ""
        others = [o.rates for o in self.measured if o.name != c.name]
        return c.unstable + drift_note(c.rates, others)

    @property
    def date(self) -> str:
        stamp = _dt.datetime.fromtimestamp(self.created, _dt.UTC)
        return stamp.strftime("%Y-%m-%d %H:%M UTC")

    def rows(self) -> list[tuple]:
        """One row per case; long reasons are numbered notes (see :meth:`notes`)."""
        return self._table()[0]

    def notes(self) -> list[str]:
        """The table's numbered notes: how a number was found, or why it is missing."""
        return self._table()[1]

    def _table(self) -> tuple[list[tuple], list[str]]:
        notes: list[str] = []

        def ref(short: str, text: str) -> str:
            if not text or text == short:
                return short
            if text not in notes:
                notes.append(text)
            return f"{short} [{notes.index(text) + 1}]"

        out = []
        for c in self.cases:
            rate, step, acc = c.throughput, c.step_time, c.test_accuracy
            comm = target = None
            if c.ok:
                if c.comm_share is not None:
                    comm = ref(c.comm_text(), c.comm_how)
                else:
                    comm = ref("not measured", c.comm_text())
                if c.time_to_target is not None:
                    target = ref(c.target_text(), c.target_note)
                else:
                    short = "not reached" if c.target_note.startswith("not reached") else ""
                    target = ref(short or "not measured", c.target_text())
            status = c.status
            if c.skipped or c.error:
                status = ref("skipped" if c.skipped else "FAILED", c.status)
            out.append(
                (
                    c.name,
                    _fmt(rate and rate.median, ",.0f"),
                    rate
                    and ref(f"{rate.min:,.0f}-{rate.max:,.0f} ({rate.n})", self.unstable_note(c)),
                    _fmt(step and step.median * 1000, ".1f"),
                    _fmt(c.efficiency, ".0%") if c.workers > 1 else None,
                    _fmt(c.vs_single, ".2f"),
                    comm,
                    target,
                    _fmt(acc and acc.median, ".3f"),
                    _fmt(c.foreign_cpu and c.foreign_cpu.median, ".0%"),
                    status,
                    _fmt(c.vs_ceiling, ".2f"),
                    _fmt(c.vs_reference, ".2f"),
                )
            )
        return out, [f"[{i}] {text}" for i, text in enumerate(notes, start=1)]

    @property
    def size(self) -> str:
        """``quick`` or ``full``, with the steps and repeats the cases were run with."""
        steps = sorted({c.steps for c in self.cases})
        repeats = sorted({c.repeats for c in self.cases})
        plural = "" if repeats == [1] else "s"
        each = f"{'/'.join(map(str, steps))} steps, {'/'.join(map(str, repeats))} repeat{plural}"
        return f"{'quick' if self.quick else 'full'}: {each}"

    def caption(self) -> str:
        return (
            f"bench {self.bench_id} ({self.size}), {self.date}: {len(self.cores)} cores, "
            f"{self.cores_per_worker} per worker, {self.wall_seconds:.0f} s"
        )

    def about_rows(self) -> list[tuple[str, str]]:
        overhead = (
            f"{self.overhead_ratio:.3f}: examples/s through the kit / by hand, median of "
            f"{len(self.overhead_ratios)} pair(s) "
            f"({', '.join(f'{r:.3f}' for r in self.overhead_ratios)})"
            if self.overhead_ratio is not None
            else f"not measured: {self.overhead_note}"
            if self.overhead_note
            else "not measured"
        )
        target = "none" if self.target_accuracy is None else f"{self.target_accuracy:.2f}"
        return [
            ("file", str(self.path)),
            ("benchmark", self.bench_id),
            ("date", self.date),
            ("size", self.size),
            ("cores", f"{len(self.cores)} ({self.cores_per_worker} per worker)"),
            ("wall time", f"{self.wall_seconds:.0f} s"),
            ("target accuracy", target),
            ("kit overhead", overhead),
            *self._speed_row(),
            *self.meta,
        ]

    def _speed_row(self) -> list[tuple[str, str]]:
        speeds = self.round_speeds
        if speeds is None:
            return []
        full = sum(1 for c in self.measured if len(c.rates) == len(speeds))
        return [
            (
                "machine by round",
                f"{', '.join(f'{s:.2f}' for s in speeds)}: each round's speed against the "
                f"benchmark's average (geometric mean over the {full} cases run in every "
                f"round, each against its own mean)",
            )
        ]

    def about(self) -> Table:
        """Where, when and how the benchmark ran, as a table."""
        return Table(("", ""), tuple(self.about_rows()), f"about {self.bench_id}")

    def summary(self) -> str:
        """One line per multi-worker case: the numbers that answer "which is faster"."""
        lines = []
        for c in self.cases:
            if c.workers == 1 and c.strategy != "single":
                continue  # x1 cases: in the table (vs single-x1)
            if not c.ok:
                lines.append(f"{c.name}: {c.status}")
                continue
            parts = [f"{c.throughput.median:,.0f} examples/s"]
            if c.efficiency is not None and c.workers > 1:
                parts.append(f"{c.speedup:.2f}x its own x1 ({c.efficiency:.0%} efficiency)")
            if c.vs_single is not None and c.strategy != "single":
                parts.append(f"{c.vs_single:.2f}x one device")
            if c.vs_ceiling is not None:
                parts.append(f"{c.vs_ceiling:.2f} of the independent-x{c.workers} ceiling")
            if c.strategy == "single" and c.vs_reference is not None:
                parts.append(f"{c.vs_reference:.2f}x the bare tf-keras loop")
            if c.unstable:
                parts.append(self.unstable_note(c))
            if c.workers > 1:
                parts.append(f"communication {c.comm_text()}")
            lines.append(f"{c.name}: " + ", ".join(parts))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows, notes = self._table()
        below = "".join(f"<br>{html.escape(n)}" for n in notes)
        return html_table(HEADERS, rows, self.caption()) + (f"<p>{below[4:]}</p>" if notes else "")

    def __str__(self) -> str:
        rows, notes = self._table()
        return "\n".join([text_table(HEADERS, rows, self.caption(), rule=True), *notes])


@dataclass(frozen=True)
class Table:
    """A small table a notebook shows as HTML and a terminal as text."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, str], ...]
    caption: str = ""

    def _repr_html_(self) -> str:
        return html_table(self.headers, self.rows, self.caption)

    def __str__(self) -> str:
        return text_table(self.headers, self.rows, self.caption)


def plan_table(cases: Sequence[Any]) -> Table:
    """The planned :class:`~ddlkit.bench.config.BenchCase` list, as a table to show before
    running it."""
    rows = tuple(
        (
            c.name,
            str(c.workers),
            str(c.steps),
            f"{c.batch} x {c.workers}",
            str(c.repeats),
            describe(c.model, getattr(c, "arch", "cnn")),
            f"every {c.eval_every} steps" if getattr(c, "eval_every", 0) else "none",
            c.skip or "",
        )
        for c in cases
    )
    headers = (
        "case",
        "workers",
        "steps",
        "global batch",
        "repeats",
        "model",
        "held-out eval",
        "skipped",
    )
    return Table(headers, rows, f"{len(cases)} cases")


# --- reading -------------------------------------------------------------------------


def summary(rec: CaseRecord) -> CaseSummary:
    """A case of the file as the table shows it (scaling filled in by :func:`with_scaling`)."""
    comm = rec.comm
    return CaseSummary(
        name=rec.name,
        strategy=rec.strategy,
        workers=rec.workers,
        steps=rec.steps,
        batch=rec.batch,
        repeats=rec.repeats,
        model=rec.model,
        skipped=rec.skipped or "",
        error=rec.error or "",
        throughput=rec.examples_per_sec,
        step_time=rec.step_time,
        test_accuracy=rec.test_accuracy,
        comm_share=comm.share if comm else None,
        comm_ms=comm.ms_per_step if comm else None,
        comm_how=comm.how if comm else "",
        time_to_target=rec.seconds_to_target,
        target_reached=rec.target_reached,
        target_note=rec.target_note or "",
        foreign_cpu=rec.foreign_cpu,
        unstable=rec.unstable or "",
        eval_every=rec.eval_every,
        arch=rec.architecture,
        run_ids=tuple(r.run_id for r in rec.runs),
        rates=tuple(r.examples_per_sec for r in rec.runs),
    )


def read_curves(runs_dir: Path, run_ids: Sequence[str]) -> tuple[tuple[EvalPoint, ...], ...]:
    """Held-out curves (the ``eval`` events) of the runs found in `runs_dir`, one per run.

    A benchmark keeps its runs in ``runs/<bench-id>/runs/<run-id>/``; bench.json holds
    only their summary. Runs whose directory is gone (e.g. a bench.json copied
    elsewhere) or that evaluated nothing add no curve.
    """
    from ddlkit.metrics.store import load_run

    out = []
    for run_id in run_ids:
        run_dir = Path(runs_dir) / run_id
        if not contract.metrics_dir(run_dir).is_dir():
            continue
        points = eval_points(load_run(run_dir))
        if points:
            out.append(tuple(points))
    return tuple(out)


def with_scaling(cases: Sequence[CaseSummary]) -> tuple[CaseSummary, ...]:
    """The cases with speed-up, efficiency and vs-single from their median throughputs,
    each against the cases of its own arch only."""
    out = []
    for c in cases:
        rates = {
            (o.strategy, o.workers): o.throughput.median for o in cases if o.ok and o.arch == c.arch
        }
        scale = scaling(rates)
        single = rates.get(("single", 1))
        reference = rates.get(("reference", 1))
        s = scale.get((c.strategy, c.workers)) if c.ok else None
        vs = c.throughput.median / single if c.ok and single else None
        ceiling = rates.get(("independent", c.workers)) if c.workers > 1 else None
        out.append(
            replace(
                c,
                speedup=s.speedup if s else None,
                efficiency=s.efficiency if s else None,
                vs_single=vs,
                vs_reference=c.throughput.median / reference if c.ok and reference else None,
                vs_ceiling=c.throughput.median / ceiling if c.ok and ceiling else None,
            )
        )
    return tuple(out)


def _meta(doc: BenchFile) -> tuple[tuple[str, str], ...]:
    """Everything else the file records about where it ran (machine details, command...)."""
    rows = [(key.replace("_", " "), _text(value)) for key, value in doc.machine.details]
    if doc.command is not None:
        rows.append(("command", doc.command or "not recorded"))
    for key, value in doc.extra:
        rows.append((key.replace("_", " "), _text(value) or "not recorded"))
    return tuple(rows)


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items())
    return "" if value is None else str(value)


def from_file(doc: BenchFile, path: str | Path = "bench.json") -> BenchResults:
    """The typed file (:mod:`ddlkit.bench.schema`) as results to show (pure)."""
    overhead = doc.overhead
    return BenchResults(
        path=Path(path),
        bench_id=doc.bench_id,
        created=doc.created,
        quick=doc.quick,
        wall_seconds=doc.wall_seconds,
        cores=doc.machine.cores,
        cores_per_worker=doc.machine.cores_per_worker,
        cases=with_scaling([summary(c) for c in doc.cases]),
        target_accuracy=doc.target_accuracy,
        overhead_ratio=overhead.ratio_median if overhead else None,
        overhead_ratios=overhead.ratios if overhead else (),
        overhead_note=doc.overhead_error or "",
        meta=_meta(doc),
    )


def parse(doc: Any, path: str | Path = "bench.json") -> BenchResults:
    """A :class:`BenchResults` from a parsed bench.json document (pure)."""
    return from_file(BenchFile.from_json(doc, path), path)


def load_results(path: str | Path, *, curves: bool = True) -> BenchResults:
    """Read a benchmark: ``runs/<bench-id>`` or its ``bench.json``.

    With ``curves``, each case's held-out accuracy curves are read from its runs'
    directories next to the file (``runs/<run-id>/``) where they exist.
    Raises :class:`ConfigError` naming the path and the fix when the file is missing,
    is not JSON, or is not a ddlkit benchmark result.
    """
    doc, file = schema.read(path)
    res = from_file(doc, file)
    if not curves:
        return res
    runs_dir = file.parent / "runs"
    cases = tuple(replace(c, evals=read_curves(runs_dir, c.run_ids)) for c in res.cases)
    return replace(res, cases=cases)
