"""Training a pipeline with live metrics, evaluating a split model, sweeping micro-batches.

::

    summary = parallel.train(pipe, train_ds, steps=200, title="Pipeline, M=4")
    accuracy = parallel.evaluate(split, test_ds)
    sweep = parallel.sweep(split, images, labels, micro_batches=(1, 2, 4, 8))
    sweep.plot()

:func:`train` reports every step through a :class:`ddlkit.metrics.Reporter`
(loss, accuracy, examples/s, and the step's measured bubble as the extra metric
``bubble``) and shows them live in a :class:`ddlkit.metrics.Dashboard`, like
``dk.metrics.live_plot`` does for ``model.fit``. Its examples/s is measured the
same way as the baseline's (time between step records, data loading included).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlkit._tables import html_table
from ddlkit.backend import tf
from ddlkit.errors import ConfigError
from ddlkit.parallel.pipeline import Pipeline
from ddlkit.parallel.schedule import Timeline, micro_batch_size, theoretical_bubble
from ddlkit.parallel.split import SplitModel


@dataclass(frozen=True)
class TrainSummary:
    """What :func:`train` measured."""

    steps: int
    batch_size: int
    micro_batches: int
    loss: float  # mean over the last steps (at most 10)
    accuracy: float  # training accuracy, same window
    examples_per_sec: float  # steady state: median over steps after the first 5
    train_seconds: float
    bubble: float  # median measured bubble over the steps
    run_dir: Path
    last_timeline: Timeline

    def _repr_html_(self) -> str:
        theory = theoretical_bubble(self.last_timeline.stages, self.micro_batches)
        rows = [
            ("steps", self.steps),
            ("mini-batch / micro-batches", f"{self.batch_size} / {self.micro_batches}"),
            ("train loss, accuracy (last steps)", f"{self.loss:.4f}, {self.accuracy:.4f}"),
            ("examples/s (steady state)", f"{self.examples_per_sec:,.0f}"),
            ("train time", f"{self.train_seconds:.1f} s"),
            ("bubble, measured (median)", f"{self.bubble:.1%}"),
            ("bubble, theory (equal stages)", f"{theory:.1%}"),
            ("metrics file", str(self.run_dir)),
        ]
        return html_table(("", "value"), rows, caption="Pipeline training")


def train(
    pipeline: Pipeline,
    dataset: Any,
    steps: int,
    *,
    title: str | None = None,
    reporter: Any = None,
) -> TrainSummary:
    """Train ``steps`` mini-batches from ``dataset`` (an iterable of ``(images, labels)``).

    Without a ``reporter``, a new one writes ``runs/local-*/metrics/pipeline.jsonl`` and
    feeds a live dashboard titled ``title``. The batches must all have one size that
    ``pipeline.micro_batches`` divides (``make_dataset(..., repeat=True)`` gives that).
    """
    from ddlkit.metrics import Reporter, load_run
    from ddlkit.metrics.dashboard import Dashboard
    from ddlkit.results import throughput

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be an integer >= 1. Fix: pass e.g. steps=100.")
    dashboard = None
    own_reporter = reporter is None
    if own_reporter:
        reporter = Reporter(worker="pipeline")
        dashboard = Dashboard(
            title or repr(pipeline),
            workers=[reporter.worker],
            total_steps=steps,
            run_dir=reporter.run_dir,
        )
        dashboard.show()
        reporter.sink = dashboard
    iterator = iter(dataset)
    batch_size = None
    losses, accuracies, bubbles = [], [], []
    result = None
    reporter.event("train_begin", epochs=1, steps=steps, batch_size=None, every=1, initial_step=0)
    start = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            x, y = next(iterator)
            _check_batch(int(x.shape[0]), batch_size, pipeline.micro_batches, step)
            batch_size = int(x.shape[0])
            result = pipeline.step(x, y)
            losses.append(result.loss)
            accuracies.append(result.accuracy)
            bubbles.append(result.timeline.bubble)
            reporter.step(
                step=step,
                epoch=0,
                loss=result.loss,
                accuracy=result.accuracy,
                batch_size=batch_size,
                metrics={"bubble": result.timeline.bubble},
            )
        seconds = time.perf_counter() - start
        reporter.epoch(epoch=0, step=steps, loss=losses[-1], accuracy=accuracies[-1])
        reporter.event("train_end", steps=steps)
    except StopIteration:
        raise ConfigError(
            f"the dataset ended after {len(losses)} of {steps} steps. Fix: build it with "
            f"make_dataset(..., repeat=True), or train fewer steps."
        ) from None
    finally:
        if dashboard is not None:
            dashboard.finish()
        if own_reporter:
            reporter.close()
    records = load_run(reporter.run_dir)
    window = slice(-10, None)
    return TrainSummary(
        steps=steps,
        batch_size=batch_size,
        micro_batches=pipeline.micro_batches,
        loss=statistics.fmean(losses[window]),
        accuracy=statistics.fmean(accuracies[window]),
        examples_per_sec=throughput([r for r in records if r.worker == reporter.worker]),
        train_seconds=seconds,
        bubble=statistics.median(bubbles),
        run_dir=reporter.run_dir,
        last_timeline=result.timeline,
    )


def _check_batch(size: int, first: int | None, micro_batches: int, step: int) -> None:
    if first is not None and size != first:
        raise ConfigError(
            f"step {step} got a batch of {size} examples after batches of {first}: a short "
            f"last batch. Fix: build the dataset with make_dataset(..., repeat=True) (or "
            f"drop_remainder=True), so every batch is full."
        )
    micro_batch_size(size, micro_batches)


def evaluate(model: SplitModel, dataset: Any) -> float:
    """Accuracy of ``model`` (its stages run on their devices) over ``dataset``."""
    T = tf()
    correct = total = 0
    for x, y in dataset:
        logits = model(x, training=False)
        labels = T.cast(T.reshape(y, [-1]), T.int64)
        correct += int(T.reduce_sum(T.cast(T.argmax(logits, -1) == labels, T.int32)))
        total += int(labels.shape[0])
    if not total:
        raise ConfigError("the evaluation dataset is empty. Fix: pass the test set's dataset.")
    return correct / total


@dataclass(frozen=True)
class SweepPoint:
    """Steady-state measurements of one micro-batch count."""

    micro_batches: int
    step_seconds: float  # median
    examples_per_sec: float  # batch / median step time
    bubble: float  # median measured
    theory: float
    cores_used: float  # this process's CPU time / wall time over the timed steps
    timeline: Timeline  # the step with the median makespan


@dataclass(frozen=True)
class Sweep:
    """A pipeline measured at several micro-batch counts on one fixed mini-batch."""

    stages: int
    batch_size: int
    steps: int
    points: tuple[SweepPoint, ...]

    def point(self, micro_batches: int) -> SweepPoint:
        for p in self.points:
            if p.micro_batches == micro_batches:
                return p
        have = [p.micro_batches for p in self.points]
        raise ConfigError(f"no measurement for M={micro_batches}. Fix: pick one of {have}.")

    def rows(self) -> list[tuple]:
        base = self.points[0].examples_per_sec
        return [
            (
                p.micro_batches,
                self.batch_size // p.micro_batches,
                f"{p.step_seconds * 1000:.1f}",
                f"{p.examples_per_sec:,.0f}",
                f"{p.examples_per_sec / base:.2f}x",
                f"{p.bubble:.1%}",
                f"{p.theory:.1%}",
                f"{p.cores_used:.2f}",
            )
            for p in self.points
        ]

    HEADERS = (
        "M",
        "micro-batch",
        "step ms",
        "examples/s",
        "vs first",
        "bubble",
        "theory",
        "CPU cores busy",
    )

    def _repr_html_(self) -> str:
        caption = (
            f"{self.stages} stages, mini-batch {self.batch_size}, median of {self.steps} steps"
        )
        return html_table(self.HEADERS, self.rows(), caption)

    def plot(self):
        """Measured bubble against the theory, and throughput, against M."""
        from ddlkit.parallel.gantt import plot_bubble

        return plot_bubble(
            self.stages,
            [p.micro_batches for p in self.points],
            [p.bubble for p in self.points],
            [p.examples_per_sec for p in self.points],
        )

    def gantt(self, *micro_batches: int):
        """Gantt charts of the median steps of the given counts (all when none given)."""
        from ddlkit.parallel.gantt import plot_timelines

        chosen = [self.point(m) for m in micro_batches] if micro_batches else list(self.points)
        return plot_timelines([p.timeline for p in chosen])


def sweep(
    model: SplitModel,
    x: Any,
    y: Any,
    micro_batches: Sequence[int] = (1, 2, 4, 8),
    *,
    steps: int = 5,
    warmup: int = 2,
    learning_rate: float = 1e-3,
    progress: bool = True,
) -> Sweep:
    """Train ``model`` on the one mini-batch ``(x, y)`` with each micro-batch count.

    Each count gets a new :class:`Pipeline` (and optimizer); ``warmup`` steps (tracing)
    are not measured, then ``steps`` are. The model's weights keep training across counts.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be an integer >= 1. Fix: e.g. steps=5.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup={warmup!r} must be an integer >= 0. Fix: e.g. warmup=2.")
    if not micro_batches:
        raise ConfigError("no micro-batch counts. Fix: pass e.g. micro_batches=(1, 2, 4, 8).")
    batch = int(x.shape[0])
    for m in micro_batches:
        micro_batch_size(batch, m)
    points = []
    for m in micro_batches:
        pipe = Pipeline(model, m, learning_rate=learning_rate)
        for _ in range(warmup):
            pipe.step(x, y)
        wall, cpu = time.perf_counter(), time.process_time()
        results = [pipe.step(x, y) for _ in range(steps)]
        cores_used = (time.process_time() - cpu) / (time.perf_counter() - wall)
        results.sort(key=lambda r: r.seconds)
        median = results[len(results) // 2]
        point = SweepPoint(
            micro_batches=m,
            step_seconds=median.seconds,
            examples_per_sec=batch / median.seconds,
            bubble=statistics.median(r.timeline.bubble for r in results),
            theory=theoretical_bubble(len(model), m),
            cores_used=cores_used,
            timeline=median.timeline,
        )
        points.append(point)
        if progress:
            print(
                f"M={m}: step {point.step_seconds * 1000:.1f} ms, "
                f"{point.examples_per_sec:,.0f} examples/s, bubble {point.bubble:.1%} "
                f"(theory {point.theory:.1%}), {point.cores_used:.2f} cores busy",
                flush=True,
            )
    return Sweep(len(model), batch, steps, tuple(points))
