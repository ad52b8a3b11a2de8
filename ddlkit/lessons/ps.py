"""Parameter-server training seen from the notebook: where the variables live, gradient
staleness, and synchronous against asynchronous time-to-accuracy.

Functions over what ``launch/train_parameter_server.py`` and ``launch/train_sync_eval.py``
report (no TensorFlow here):

- :class:`Placement` shows which ps task holds each variable (or each shard of it);
- :func:`summarize` and :func:`counts` turn the staleness of each asynchronous
  step (how many updates by other workers landed between reading the weights
  and applying the step's gradients) into summary numbers and a histogram;
- :func:`eval_curve` reads the ``eval`` events a run's chief (parameter server
  scripts) or its evaluating worker (``launch/train_sync_eval.py``) reported: accuracy on the
  same held-out images against training seconds (evaluation time left out);
- :func:`time_to_accuracy` is the first training second a curve reached a target
  (both from :mod:`ddlkit.metrics.evals`, where every reader of eval events goes);
- the comparison views live in :mod:`ddlkit.lessons.ps_compare` and are importable from here:
  :class:`SyncAsync` (:func:`compare`) puts a synchronous and an asynchronous run side by
  side as a table and one figure; :class:`Comparison` (:func:`compare_runs`) does the same
  for any number of runs (all-reduce, synchronous, asynchronous and Downpour parameter
  servers: ``launch/train_ps_modes.py``); :func:`load` reads one run as a :class:`RunCurve`;
- :func:`throughput_around` compares examples/s before and after a step (a killed
  worker), and :func:`wait_for_step` waits until a running job reports a step;
- :func:`call_size` and :func:`split_steps` cut the chief's intervals between joins into
  scheduled functions of one size (one trace).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from ddlkit._lazy import lazy_attributes
from ddlkit._tables import html_table
from ddlkit.errors import DdlkitError
from ddlkit.metrics.evals import EvalPoint, eval_points, time_to_accuracy  # noqa: F401 (re-exported)
from ddlkit.metrics.waiting import wait_for

_VIEWS = ("RunCurve", "SyncAsync", "Comparison", "load", "compare", "compare_runs")
__getattr__, __dir__ = lazy_attributes(
    __name__, dict.fromkeys(_VIEWS, "ddlkit.lessons.ps_compare"), globals(), _VIEWS
)

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


def call_size(per_call: int, report_every: int, eval_every: int = 0, workers: int = 1) -> int:
    """Training steps per scheduled function (pure): the most, up to ``per_call``, that
    divide both ``report_every`` and ``eval_every`` (0: no evaluations).

    The chief joins every ``report_every`` steps and at every evaluation, so every
    interval between joins is a multiple of this size (all but a run's last, when its
    steps are not): every scheduled function has the same number of steps, and is traced
    once. A function of another size would be traced again on the chief and instantiated
    again on the worker on its first call, inside the interval being timed. At most
    ``report_every // workers``, so every worker gets a function between two joins.
    """
    for name, value in (("per_call", per_call), ("report_every", report_every)):
        if type(value) is not int or value < 1:
            raise DdlkitError(f"{name}={value!r}: must be an int >= 1. Fix: e.g. 10.")
    if type(eval_every) is not int or eval_every < 0 or type(workers) is not int or workers < 1:
        raise DdlkitError(
            f"eval_every={eval_every!r}, workers={workers!r}: need an int >= 0 and an int >= 1. "
            f"Fix: eval_every 0 (no evaluations) or the steps between them; 1 or more workers."
        )
    between = math.gcd(report_every, eval_every)  # gcd(n, 0) == n: no evaluations
    cap = max(1, min(per_call, report_every // workers))
    return max(d for d in range(1, cap + 1) if between % d == 0)


def split_steps(steps: int, size: int) -> list[int]:
    """``steps`` as scheduled functions of ``size`` steps, the last one shorter (pure)."""
    return [min(size, steps - i) for i in range(0, steps, size)]


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
