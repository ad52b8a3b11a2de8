"""The numbers of a strategy benchmark, from metric records and reports (pure).

- :func:`measure`: one run's steady-state throughput and step time, after a warm-up,
  leaving out the steps that waited for a held-out evaluation; and the training seconds
  until the held-out accuracy first reached a target (:func:`time_to_target`).
- :func:`summarize`: repeats of a case to median and spread (min, max).
- :func:`scaling`: speed-up and scaling efficiency of each case against the same
  strategy with one worker.
- :func:`stability`, :func:`round_speeds`, :func:`drift_note`: whether a case's repeats
  agree, the machine's speed in each round, and whether that speed explains a spread.

:class:`Spread`, :class:`RunMeasure` and :class:`Communication` are bench.json's own
types (:mod:`ddlkit.bench.schema`), imported here for the functions that make them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ddlkit.bench.schema import Communication, RunMeasure, Spread
from ddlkit.errors import DdlkitError
from ddlkit.metrics.evals import EvalPoint, eval_points, eval_waits, time_to_accuracy
from ddlkit.results import throughput


def summarize(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values to summarize: a case needs at least one finished run")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def warmup_steps(steps: int) -> int:
    """Steps left out as warm-up (graph tracing, first all-reduces): a fifth, at most 10."""
    return min(10, steps // 5)


def steady(records: Iterable, warmup: int, leave_out: Collection[int] = ()) -> list:
    """The step records whose steps all come after `warmup` steps, without those whose
    steps include one in `leave_out` (see :func:`eval_waits`).

    A record covers the steps since its worker's previous step record: one step each
    with ``steps_per_execution=1``, k with k (the first record then holds the tracing).
    """
    kept, last = [], {}
    for r in records:
        if r.kind != "step":
            continue
        first = last.get(r.worker, 0) + 1  # the first step this record covers
        last[r.worker] = r.step
        if first > warmup and not any(first <= s <= r.step for s in leave_out):
            kept.append(r)
    return kept


def time_to_target(points: Sequence[EvalPoint], target: float) -> float | None:
    """Training seconds at the first evaluation with accuracy >= `target` (pure)."""
    return time_to_accuracy(points, target)


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
    records: Sequence,
    report: Mapping,
    *,
    run_id: str,
    steps: int,
    wall_seconds: float,
    target: float | None = None,
    foreign_cpu: float | None = None,
    comm_ms_per_step: float | None = None,
    evals_in_step_time: bool = True,
) -> RunMeasure:
    """A run's steady-state throughput (all workers' examples/s added up) and step time,
    without the steps that waited for an evaluation; the time to `target` accuracy.

    ``evals_in_step_time=False``: the script times its steps without its evaluations
    (the parameter-server chief evaluates between joins, outside the timed interval), so
    no record is left out for them."""
    waits = eval_waits(records) if evals_in_step_time else set()
    kept = steady(records, warmup_steps(steps), waits)
    if not kept:
        raise DdlkitError(
            f"run {run_id} sent no step records after the first {warmup_steps(steps)} steps. "
            f"Fix: run more steps (--steps), and check the run's logs."
        )
    found = eval_points(records)
    return RunMeasure(
        run_id=run_id,
        examples_per_sec=throughput(kept, skip=0),
        step_time=step_time(kept),
        test_accuracy=_accuracy(report.get("test_accuracy")),
        wall_seconds=wall_seconds,
        seconds_to_target=time_to_target(found, target) if target is not None else None,
        best_eval_accuracy=max((p.accuracy for p in found), default=None),
        evals=len(found),
        foreign_cpu=foreign_cpu,
        comm_ms_per_step=comm_ms_per_step,
    )


def _accuracy(value) -> float | None:
    """A worker's final test accuracy; None where its model has no accuracy metric."""
    return None if value is None else float(value)


STABLE = 1.10  # the largest max/min of a case's repeats that counts as agreeing
MODES = 1.5  # a gap this large between sorted repeats: two speeds, not noise


def stability(rates: Sequence[float]) -> tuple[float | None, str | None]:
    """``(max/min, note)`` of a case's repeated throughputs (pure): note is None when the
    repeats agree (max/min <= STABLE), else says how they split, so a reader never takes
    a median over two speeds for one (e.g. the exact halving some process starts showed)."""
    values = sorted(v for v in rates if v > 0)
    if len(values) < 2:
        return None, None
    ratio = values[-1] / values[0]
    if ratio <= STABLE:
        return ratio, None
    gaps = [values[i + 1] / values[i] for i in range(len(values) - 1)]
    cut = max(range(len(gaps)), key=gaps.__getitem__)
    if gaps[cut] >= MODES:
        slow, fast = values[: cut + 1], values[cut + 1 :]
        return ratio, (
            f"bimodal: {len(slow)} of {len(values)} runs at {statistics.median(slow):,.0f} "
            f"examples/s, {len(fast)} at {statistics.median(fast):,.0f} "
            f"({statistics.median(fast) / statistics.median(slow):.2f}x); the median "
            f"is not one speed"
        )
    # three decimals where two would print the threshold itself ("1.10 > 1.10")
    shown = f"{ratio:.2f}" if round(ratio, 2) > STABLE else f"{ratio:.3f}"
    return ratio, f"unstable: max/min of the runs {shown} > {STABLE:.2f}"


def round_speeds(rates_by_case: Sequence[Sequence[float]]) -> tuple[float, ...] | None:
    """The machine's speed in each round of a benchmark, 1.00 its average (pure).

    A benchmark runs every case once per round, so a case's runs are its rounds in order.
    Each case that ran in every round has its rates divided by their geometric mean; a
    round's speed is the geometric mean of those over the cases. A virtual machine whose
    speed drifts over the minutes of a benchmark slows every case of a round alike, and
    shows here. None: fewer than 2 rounds, or fewer than 2 cases ran in all of them.
    """
    rounds = max((len(r) for r in rates_by_case), default=0)
    full = [r for r in rates_by_case if len(r) == rounds and all(v > 0 for v in r)]
    if rounds < 2 or len(full) < 2:
        return None
    logs = [[math.log(v) for v in r] for r in full]
    centred = [[v - statistics.fmean(r) for v in r] for r in logs]
    return tuple(math.exp(statistics.fmean(col)) for col in zip(*centred, strict=True))


def drift_note(rates: Sequence[float], others: Sequence[Sequence[float]]) -> str:
    """What an unstable case's max/min becomes once each run is divided by its round's
    machine speed (:func:`round_speeds` of the other cases' rates, so a case does not
    correct itself); "" when the rounds cannot be lined up (pure)."""
    speeds = round_speeds(others)
    if speeds is None or len(rates) != len(speeds) or min(rates, default=0) <= 0:
        return ""
    adjusted = [v / s for v, s in zip(rates, speeds, strict=True)]
    ratio = max(adjusted) / min(adjusted)
    verdict = "within" if ratio <= STABLE else "still beyond"
    return (
        f"; {ratio:.2f} with each run divided by the machine's speed in its round "
        f"({', '.join(f'{s:.2f}' for s in speeds)}, from the other cases): {verdict} "
        f"{STABLE:.2f}"
    )


BASE = {"independent": "single"}  # the x1 a strategy's scaling is measured against


@dataclass(frozen=True)
class Scaling:
    speedup: float  # throughput / the same strategy's 1-worker throughput
    efficiency: float  # speedup / workers: 1.0 is perfect linear scaling


def scaling(throughputs: Mapping[tuple[str, int], float]) -> dict[tuple[str, int], Scaling]:
    """Speed-up and efficiency of every (strategy, workers) against (strategy, 1)
    (``independent`` against single-x1: it has no x1 of its own).

    Cases whose strategy has no 1-worker throughput are left out (nothing to compare).
    """
    out = {}
    for (strategy, workers), rate in throughputs.items():
        base = throughputs.get((BASE.get(strategy, strategy), 1))
        if base is None or base <= 0:
            continue
        speedup = rate / base
        out[(strategy, workers)] = Scaling(speedup, speedup / workers)
    return out


HOROVOD_COMM = (
    "measured: allreduce wall time per step in rank 0's Horovod timeline / that run's step "
    "time, in one extra run with the timeline on (kept out of the throughput numbers: "
    "writing it slows the steps, here {profiled:.0f} ms/step against {plain:.0f} without)"
)
HOROVOD_ONE_RANK = "one rank: Horovod's DistributedOptimizer does no allreduce"
ESTIMATED_COMM = (
    "estimate: (step time - single-x1 step time) / step time; single-x1 is the same "
    "per-replica batch on one core with no strategy, so this is everything the strategy "
    "adds to a step: communication, waiting for peers, its own per-step work"
)
PS_COMM = (
    "not measured: ParameterServerStrategy pulls and pushes variables inside each step's "
    "remote function; the coordinator sees whole steps only"
)
NO_COMM = "one device, no strategy: nothing to communicate"
INDEPENDENT_COMM = "independent processes: nothing to communicate (the scaling ceiling)"


def communication(
    strategy: str,
    step_time: float | None,
    comm_ms_per_step: float | None,
    single_step_time: float | None,
    *,
    workers: int = 2,
    profiled_step_time: float | None = None,
) -> Communication:
    """Communication share of a case's step (pure): measured for Horovod (its timeline, in
    a profiled run whose step time is `profiled_step_time`), estimated for the all-reduce
    strategies against single-x1, not measured for PS."""
    if strategy in ("single", "reference"):
        return Communication(None, None, NO_COMM)
    if strategy == "independent":
        return Communication(None, None, INDEPENDENT_COMM)
    if strategy == "parameter_server":
        return Communication(None, None, PS_COMM)
    if step_time is None or step_time <= 0:
        return Communication(None, None, "not measured: the case has no step time")
    if strategy == "horovod":
        if workers == 1:
            return Communication(0.0, 0.0, HOROVOD_ONE_RANK)
        if comm_ms_per_step is None or not profiled_step_time:
            return Communication(None, None, "not measured: no Horovod timeline was read")
        how = HOROVOD_COMM.format(profiled=profiled_step_time * 1000, plain=step_time * 1000)
        return Communication(comm_ms_per_step / 1000 / profiled_step_time, comm_ms_per_step, how)
    if single_step_time is None:
        return Communication(None, None, "not estimated: single-x1 was not measured")
    extra = max(0.0, step_time - single_step_time)
    return Communication(extra / step_time, extra * 1000, ESTIMATED_COMM)
