"""Held-out evaluations: the ``eval`` events of a run's records, read in one place (pure).

A worker script reports each evaluation on held-out data as an ``eval`` event
(``reporter.event("eval", step=..., examples=..., train_seconds=..., accuracy=...,
loss=...)``; ``train_seconds`` leaves evaluation time out). Everything that reads them
goes through :func:`eval_points`: the benchmark's time to a target accuracy
(:mod:`ddlkit.bench.stats`) and its held-out curves (:mod:`ddlkit.bench.results`), and
the parameter-server sync/async comparison (:mod:`ddlkit.lessons.ps`).

    points = eval_points(run.records())        # EvalPoint(train_seconds, accuracy, step...)
    time_to_accuracy(points, 0.95)             # training seconds, or None if never reached
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from ddlkit.errors import DdlkitError

EVAL_EVENT = "eval"
FIELDS = ("step", "examples", "train_seconds", "accuracy", "loss")
REQUIRED = ("train_seconds", "accuracy")


@dataclass(frozen=True)
class EvalPoint:
    """Held-out accuracy after ``train_seconds`` of training (evaluation time left out),
    at ``step`` (examples seen and loss where the event has them)."""

    train_seconds: float
    accuracy: float
    step: int | None = None
    examples: int | None = None
    loss: float | None = None

    @property
    def seconds(self) -> float:
        """``train_seconds`` (the x axis of a time-to-accuracy curve)."""
        return self.train_seconds


def _optional(info: dict, key: str, kind: type):
    return None if info.get(key) is None else kind(info[key])


def eval_points(records: Iterable, *, require: Collection[str] = ()) -> list[EvalPoint]:
    """The ``eval`` events of `records` (:class:`ddlkit.metrics.Record`), in training-time
    order. Each needs ``train_seconds`` and ``accuracy``, and the fields in `require`
    (of ``step``, ``examples``, ``loss``); a missing one raises :class:`DdlkitError`
    naming the worker, the event and the fix."""
    needed = (*REQUIRED, *(f for f in FIELDS if f in require and f not in REQUIRED))
    points = []
    for r in records:
        if r.kind != "event" or r.name != EVAL_EVENT:
            continue
        info = r.info or {}
        try:
            missing = [f for f in needed if info.get(f) is None]
            if missing:
                raise KeyError(", ".join(missing))
            points.append(
                EvalPoint(
                    train_seconds=float(info["train_seconds"]),
                    accuracy=float(info["accuracy"]),
                    step=_optional(info, "step", int),
                    examples=_optional(info, "examples", int),
                    loss=_optional(info, "loss", float),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DdlkitError(
                f"eval event of {r.worker!r} (seq {r.seq}) lacks or garbles "
                f"{' or '.join(needed)} ({exc!r}). Fix: report evals with "
                f"reporter.event('eval', step=..., examples=..., train_seconds=..., "
                f"accuracy=..., loss=...) (this ddlkit's worker scripts do)."
            ) from None
    return sorted(points, key=lambda p: (p.train_seconds, p.step or 0))


def time_to_accuracy(points: Sequence[EvalPoint], target: float) -> float | None:
    """Training seconds at the first evaluation reaching `target`; None if none did."""
    if not 0.0 <= target <= 1.0:
        raise DdlkitError(f"target accuracy {target!r} must be in [0, 1]. Fix: pass e.g. 0.9.")
    for p in points:
        if p.accuracy >= target:
            return p.train_seconds
    return None


def eval_waits(records: Iterable) -> set[int]:
    """Steps whose time includes a held-out evaluation: the one after each eval (pure).

    An evaluation runs after step N's record, so step N+1's time holds it (and on the
    other workers, which wait for the evaluating one at the next all-reduce).
    """
    return {p.step + 1 for p in eval_points(records) if p.step is not None}
