"""The GPipe schedule as pure data, the bubble arithmetic, and an ideal simulator.

A pipeline of ``S`` stages trains one mini-batch as ``M`` micro-batches. Every
stage runs its own task list, in order (GPipe, Huang et al. 2019)::

    stage s:  F(s,0) F(s,1) ... F(s,M-1)   B(s,M-1) ... B(s,1) B(s,0)   U(s)

``F`` is a forward pass of one micro-batch, ``B`` its backward pass, ``U`` the
one optimizer update of the stage's weights with the gradients summed over all
micro-batches. A task may start only when the tasks it needs have ended
(:func:`dependencies`): ``F(s,m)`` needs the activations of ``F(s-1,m)``;
``B(s,m)`` needs the gradient from ``B(s+1,m)`` (the last stage needs only its
own ``F``). While a stage waits, it idles: that idle time is the **bubble**.

With equal stages, forward time ``f`` and backward time ``b`` per micro-batch,
a step takes ``(M + S - 1)(f + b)`` and each stage works ``M (f + b)`` of it, so
the idle share is ``(S - 1) / (M + S - 1)`` (:func:`theoretical_bubble`): more
micro-batches, smaller bubble. :func:`simulate` replays a schedule with given
task times; :class:`Timeline` holds measured ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ddlkit._tables import html_table
from ddlkit.errors import ConfigError

KINDS = ("F", "B", "U")


@dataclass(frozen=True, order=True)
class Task:
    """One unit of work of one stage: ``kind`` F (forward), B (backward) or U (update)."""

    stage: int
    micro_batch: int  # -1 for an update, which covers all micro-batches
    kind: str

    def __str__(self) -> str:
        if self.kind == "U":
            return f"U{self.stage}"
        return f"{self.kind}{self.stage},{self.micro_batch}"


def _check_int(name: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1. Fix: {fix}.")
    return value


def check_micro_batches(micro_batches: int) -> int:
    """``micro_batches`` if it is a usable count (an int >= 1), else ConfigError."""
    return _check_int(
        "micro_batches", micro_batches, "pass how many micro-batches split a mini-batch, e.g. 4"
    )


def micro_batch_size(batch_size: int, micro_batches: int) -> int:
    """Examples per micro-batch; ConfigError unless ``micro_batches`` divides the batch."""
    _check_int("batch_size", batch_size, "pass the mini-batch size, e.g. 256")
    check_micro_batches(micro_batches)
    if batch_size % micro_batches:
        fits = [m for m in (1, 2, 4, 8, 16, 32) if batch_size % m == 0 and m <= batch_size]
        raise ConfigError(
            f"micro_batches={micro_batches} does not divide batch_size={batch_size}, so the "
            f"micro-batches would differ in size and their summed gradients would not be the "
            f"mini-batch gradient. Fix: pick micro_batches from {fits} (or change batch_size)."
        )
    return batch_size // micro_batches


def gpipe_schedule(stages: int, micro_batches: int) -> tuple[tuple[Task, ...], ...]:
    """Each stage's task list, in the order that stage runs it (see the module docstring)."""
    _check_int("stages", stages, "pass the number of pipeline stages, e.g. 2")
    _check_int("micro_batches", micro_batches, "pass e.g. 4")
    return tuple(
        tuple(Task(s, m, "F") for m in range(micro_batches))
        + tuple(Task(s, m, "B") for m in reversed(range(micro_batches)))
        + (Task(s, -1, "U"),)
        for s in range(stages)
    )


def dependencies(task: Task, stages: int, micro_batches: int) -> tuple[Task, ...]:
    """The tasks of *other* stages or earlier phases that must end before ``task`` starts."""
    s, m = task.stage, task.micro_batch
    if task.kind == "F":
        return (Task(s - 1, m, "F"),) if s > 0 else ()
    if task.kind == "B":
        return (Task(s, m, "F"),) + ((Task(s + 1, m, "B"),) if s < stages - 1 else ())
    if task.kind == "U":
        return tuple(Task(s, k, "B") for k in range(micro_batches))
    raise ConfigError(f"unknown task kind {task.kind!r}. Fix: use one of {KINDS}.")


def theoretical_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step with equal stages: ``(S - 1) / (M + S - 1)``."""
    _check_int("stages", stages, "pass e.g. 2")
    _check_int("micro_batches", micro_batches, "pass e.g. 4")
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_fraction(busy: Sequence[float], makespan: float) -> float:
    """Idle share of ``S = len(busy)`` stages in ``makespan`` s: ``1 - sum(busy) / (S * makespan)``.

    ``busy[s]`` is the time stage ``s`` spent working within the step.
    """
    if not busy:
        raise ConfigError("no stages: busy is empty. Fix: pass one busy time per stage.")
    if makespan <= 0:
        raise ConfigError(f"makespan={makespan!r} must be > 0. Fix: pass the step's wall time.")
    for i, b in enumerate(busy):
        # a tiny tolerance: busy times are sums of measured intervals
        if b < 0 or b > makespan * (1 + 1e-9):
            raise ConfigError(
                f"stage {i} was busy {b!r} s, outside [0, makespan={makespan!r}]. Fix: pass "
                f"each stage's summed task time within one step."
            )
    return max(0.0, 1.0 - sum(busy) / (len(busy) * makespan))


@dataclass(frozen=True)
class Timing:
    """When one task ran, in seconds from the start of its step."""

    task: Task
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Timeline:
    """One step's tasks with their times: measured by a pipeline, or simulated."""

    stages: int
    micro_batches: int
    timings: tuple[Timing, ...]
    label: str = ""
    measured: bool = True  # False: made by simulate()

    @property
    def makespan(self) -> float:
        """Wall time from the first task's start to the last task's end."""
        return max(t.end for t in self.timings) - min(t.start for t in self.timings)

    def busy(self) -> tuple[float, ...]:
        """Seconds each stage spent running tasks."""
        per = [0.0] * self.stages
        for t in self.timings:
            per[t.task.stage] += t.seconds
        return tuple(per)

    @property
    def bubble(self) -> float:
        """Measured idle share: ``1 - sum(busy) / (stages * makespan)``."""
        return bubble_fraction(self.busy(), self.makespan)

    @property
    def theoretical_bubble(self) -> float:
        return theoretical_bubble(self.stages, self.micro_batches)

    def order_violations(self) -> list[str]:
        """Tasks that started before a task they depend on ended, or that are missing."""
        by_task = {t.task: t for t in self.timings}
        problems = []
        for tasks in gpipe_schedule(self.stages, self.micro_batches):
            for task in tasks:
                if task not in by_task:
                    problems.append(f"{task} did not run")
                    continue
                for dep in dependencies(task, self.stages, self.micro_batches):
                    if dep in by_task and by_task[dep].end > by_task[task].start:
                        problems.append(f"{task} started before {dep} ended")
        for tasks in gpipe_schedule(self.stages, self.micro_batches):
            ran = [by_task[t] for t in tasks if t in by_task]
            for a, b in zip(ran, ran[1:], strict=False):
                if b.start < a.end:
                    problems.append(f"{b.task} overlapped {a.task} on stage {a.task.stage}")
        return problems

    def _repr_html_(self) -> str:
        rows = [
            (s, f"{b * 1000:.1f}", f"{(self.makespan - b) * 1000:.1f}")
            for s, b in enumerate(self.busy())
        ]
        caption = (
            f"{self.label + ': ' if self.label else ''}{self.stages} stages, "
            f"{'' if self.measured else 'simulated, '}"
            f"{self.micro_batches} micro-batches, step {self.makespan * 1000:.1f} ms, "
            f"bubble {self.bubble:.1%} (theory {self.theoretical_bubble:.1%})"
        )
        return html_table(("stage", "busy ms", "idle ms"), rows, caption)


def simulate(
    stages: int,
    micro_batches: int,
    forward: float | Sequence[float] = 0.001,
    backward: float | Sequence[float] = 0.002,
    update: float | Sequence[float] = 0.0,
) -> Timeline:
    """The ideal timeline: every task starts as soon as its stage and its inputs are free.

    Times are seconds per micro-batch and stage (one number for all stages, or one per
    stage): by default a forward takes 1 ms and a backward 2 ms. No communication cost.
    With equal stages and ``update=0`` the bubble is exactly :func:`theoretical_bubble`.
    """
    gpipe_schedule(stages, micro_batches)  # checks both counts first
    length = {
        "F": _per_stage("forward", forward, stages),
        "B": _per_stage("backward", backward, stages),
        "U": _per_stage("update", update, stages),
    }
    end: dict[Task, float] = {}
    timings = []
    lists = gpipe_schedule(stages, micro_batches)
    cursor = [0] * stages
    free = [0.0] * stages
    # Repeatedly run any stage whose next task has its inputs ready (a list scheduler).
    remaining = sum(len(t) for t in lists)
    while remaining:
        progressed = False
        for s in range(stages):
            if cursor[s] == len(lists[s]):
                continue
            task = lists[s][cursor[s]]
            deps = dependencies(task, stages, micro_batches)
            if all(d in end for d in deps):
                start = max([free[s], *(end[d] for d in deps)])
                finish = start + length[task.kind][s]
                timings.append(Timing(task, start, finish))
                end[task] = free[s] = finish
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the schedule has no cycles
            raise RuntimeError("the schedule deadlocked")
    return Timeline(stages, micro_batches, tuple(timings), label="ideal", measured=False)


def _per_stage(name: str, value: float | Sequence[float], stages: int) -> tuple[float, ...]:
    values = tuple(value) if isinstance(value, Iterable) else (value,) * stages
    if len(values) != stages or any(v < 0 for v in values):
        raise ConfigError(
            f"{name}={value!r}: need one time >= 0, or one per stage ({stages}). "
            f"Fix: pass e.g. {name}=1.0."
        )
    return tuple(float(v) for v in values)
