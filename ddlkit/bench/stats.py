"""The numbers of a strategy benchmark, from metric records and reports (pure).

- :func:`measure`: one run's steady-state throughput and step time, after a warm-up.
- :func:`summarize`: repeats of a case to median and spread (min, max).
- :func:`scaling`: speed-up and scaling efficiency of each case against the same
  strategy with one worker.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from ddlkit.errors import DdlkitError
from ddlkit.results import throughput


@dataclass(frozen=True)
class Spread:
    """Median of repeated measurements and their range."""

    median: float
    min: float
    max: float
    n: int

    @property
    def rel_range(self) -> float:
        """(max - min) / median: 0 when every repeat agreed."""
        return (self.max - self.min) / self.median if self.median else 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values to summarize: a case needs at least one finished run")
    return Spread(statistics.median(values), min(values), max(values), len(values))


@dataclass(frozen=True)
class RunMeasure:
    """One finished run of a case."""

    run_id: str
    examples_per_sec: float
    step_time: float
    test_accuracy: float
    wall_seconds: float


def warmup_steps(steps: int) -> int:
    """Steps left out as warm-up (graph tracing, first all-reduces): a fifth, at most 10."""
    return min(10, steps // 5)


def steady(records: Iterable, warmup: int) -> list:
    """The step records after `warmup` steps (a record covering steps up to N has step N)."""
    return [r for r in records if r.kind == "step" and r.step > warmup]


def step_time(records: Iterable) -> float:
    """Seconds per step: each worker's median, the slowest worker's (it sets the pace)."""
    by_worker: dict[str, list[float]] = {}
    for r in records:
        if r.kind == "step" and r.step_time:
            by_worker.setdefault(r.worker, []).append(r.step_time)
    if not by_worker:
        raise DdlkitError("no step records with step_time: the worker script reports none")
    return max(statistics.median(v) for v in by_worker.values())


def measure(
    records: Sequence, report: Mapping, *, run_id: str, steps: int, wall_seconds: float
) -> RunMeasure:
    """A run's steady-state throughput (all workers' examples/s added up) and step time."""
    kept = steady(records, warmup_steps(steps))
    if not kept:
        raise DdlkitError(
            f"run {run_id} sent no step records after the first {warmup_steps(steps)} steps. "
            f"Fix: run more steps (--steps), and check the run's logs."
        )
    return RunMeasure(
        run_id=run_id,
        examples_per_sec=throughput(kept, skip=0),
        step_time=step_time(kept),
        test_accuracy=float(report["test_accuracy"]),
        wall_seconds=wall_seconds,
    )


@dataclass(frozen=True)
class Scaling:
    speedup: float  # throughput / the same strategy's 1-worker throughput
    efficiency: float  # speedup / workers: 1.0 is perfect linear scaling


def scaling(throughputs: Mapping[tuple[str, int], float]) -> dict[tuple[str, int], Scaling]:
    """Speed-up and efficiency of every (strategy, workers) against (strategy, 1).

    Cases whose strategy has no 1-worker throughput are left out (nothing to compare).
    """
    out = {}
    for (strategy, workers), rate in throughputs.items():
        base = throughputs.get((strategy, 1))
        if base is None or base <= 0:
            continue
        speedup = rate / base
        out[(strategy, workers)] = Scaling(speedup, speedup / workers)
    return out
