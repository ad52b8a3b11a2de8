"""Keras callbacks that report training to ddlkit: :class:`KerasReporter` and :func:`live_plot`.

::

    model.fit(ds, epochs=3, callbacks=[dk.metrics.KerasReporter(batch_size=128)])
    model.fit(ds, epochs=3, callbacks=[dk.metrics.live_plot("Baseline: MNIST", batch_size=128)])

The classes derive from the Keras in use (tf-keras or Keras 3, see
:mod:`ddlkit.backend`), so they are built on first access: importing
``ddlkit.metrics`` does not import TensorFlow.

What a ``KerasReporter`` reports, through a :class:`~ddlkit.metrics.Reporter`
(configured from the environment unless given; see there for where records go):

- event ``train_begin`` (``epochs``, ``steps`` per epoch, ``batch_size``, ``every``,
  ``initial_step``: steps done by earlier ``fit`` calls with this callback, since
  ``step`` keeps counting across them);
- a step record every ``every`` training steps (with ``compile(steps_per_execution=k)``
  Keras calls back once per execution: a record then covers ``steps`` = k steps and
  ``step`` is the number of the last of them): Keras' loss and accuracy logs
  (running means over the epoch), ``step_time`` (wall time per step since the
  previous step record, data loading included) and ``examples_per_sec``
  (``batch_size / step_time``);
- an epoch record at each epoch end: the epoch's logs (``val_*`` in ``metrics``),
  training-only throughput, and ``epoch_time`` (validation included);
- event ``train_end``, after which queued records are flushed (bounded wait);
- event ``evaluate`` (``loss``, ``accuracy``, ``steps``) when the callback is passed to a
  ``model.evaluate(...)`` call of its own, e.g. on the test set after training
  (validation inside ``fit`` is not reported this way: it is in the epoch records).

``train_begin`` also carries ``replicas``: the strategy's ``num_replicas_in_sync``.

``batch_size`` is the number of examples one step of *this* worker counts. For
MultiWorkerMirroredStrategy or Horovod pass the per-worker share of the global
batch (global batch / workers) so the workers' throughputs add up; without
``batch_size`` there is no ``examples_per_sec``. ``every=0`` reports epochs only
and declares no batch-level hooks, which ParameterServerStrategy requires.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from ddlkit import backend
from ddlkit.errors import ConfigError
from ddlkit.metrics.reporter import Reporter

ACCURACY_KEYS = (
    "accuracy",
    "acc",
    "sparse_categorical_accuracy",
    "categorical_accuracy",
    "binary_accuracy",
)
FLUSH_TIMEOUT = 2.0


def split_logs(logs: Mapping[str, Any] | None) -> tuple[float | None, float | None, dict]:
    """``(loss, accuracy, other numeric metrics)`` from Keras logs (pure).

    Values that are not scalars are left out; metric names are made safe for
    records (``dense/loss`` becomes ``dense_loss``).
    """
    loss = accuracy = None
    extra: dict[str, float] = {}
    accuracy_key = next((k for k in ACCURACY_KEYS if k in (logs or {})), None)
    for key, value in (logs or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if key == "loss":
            loss = number
        elif key == accuracy_key:
            accuracy = number
        else:
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(key))[:64]
            if not re.match(r"[A-Za-z_]", name):
                name = f"m_{name}"[:64]
            extra[name] = number
    return loss, accuracy, extra


class _ReporterMixin:
    """The callback's behaviour; combined with Keras' Callback class on first use."""

    def __init__(
        self,
        batch_size: int | None = None,
        every: int = 1,
        *,
        worker: str | None = None,
        run_dir: str | os.PathLike | None = None,
        collector: str | None = None,
        token: str | None = None,
        sink=None,
        reporter: Reporter | None = None,
    ) -> None:
        super().__init__()
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
        ):
            raise ConfigError(
                f"batch_size must be a positive int or None, got {batch_size!r}. Fix: pass the "
                f"examples one training step of this worker processes, e.g. batch_size=128."
            )
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ConfigError(
                f"every must be an int >= 0, got {every!r}. Fix: every=1 reports each step, "
                f"every=10 every tenth, every=0 epochs only."
            )
        self.batch_size = batch_size
        self.every = every
        self.reporter = reporter
        self._reporter_args = {
            "worker": worker,
            "run_dir": run_dir,
            "collector": collector,
            "token": token,
            "sink": sink,
        }
        self._step = 0
        self._epoch = 0
        self._pending = 0
        self._mark = self._epoch_start = self._last_batch_end = time.perf_counter()
        self._epoch_steps = 0
        self._fitting = False

    # Keras asks this to decide whether to call batch hooks (and ParameterServerStrategy
    # refuses callbacks that have them).
    def _implements_train_batch_hooks(self) -> bool:
        return self.every > 0

    def _ensure_reporter(self) -> Reporter:
        if self.reporter is None or self.reporter.closed:
            self.reporter = Reporter(**self._reporter_args)
        return self.reporter

    def _before_train(self) -> None:
        """Hook for subclasses: runs after the reporter exists, before train_begin."""

    def on_train_begin(self, logs=None) -> None:
        reporter = self._ensure_reporter()
        self._fitting = True
        self._before_train()
        params = self.params or {}
        reporter.event(
            "train_begin",
            epochs=_int_or_none(params.get("epochs")),
            steps=_int_or_none(params.get("steps")),
            batch_size=self.batch_size,
            every=self.every,
            initial_step=self._step,
            replicas=_replicas(self.model),
        )

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = int(epoch)
        self._epoch_steps = self._pending = 0
        self._mark = self._epoch_start = self._last_batch_end = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        if not self.every:  # other callbacks made Keras call batch hooks anyway
            return
        now = time.perf_counter()
        # With compile(steps_per_execution=k) Keras calls this once per execution of k
        # steps (fewer for the epoch's last), passing the epoch's index of the LAST step
        # run: count the steps done since the previous call, not one per call.
        done = steps_done(batch, self._epoch_steps)
        self._step += done
        self._epoch_steps += done
        self._pending += done
        self._last_batch_end = now
        if self._pending >= self.every:
            loss, accuracy, extra = split_logs(logs)
            self.reporter.step(
                step=self._step,
                epoch=self._epoch,
                loss=loss,
                accuracy=accuracy,
                batch_size=self.batch_size,
                step_time=(now - self._mark) / self._pending,
                steps=self._pending,
                metrics=extra,
            )
            self._mark = now
            self._pending = 0

    def on_epoch_end(self, epoch, logs=None) -> None:
        now = time.perf_counter()
        if not self.every:  # no batch hooks: count the epoch's steps from Keras' params
            steps = _int_or_none((self.params or {}).get("steps")) or 0
            self._step += steps
            self._epoch_steps = steps
            self._last_batch_end = now
        train_time = self._last_batch_end - self._epoch_start
        step_time = train_time / self._epoch_steps if self._epoch_steps else None
        eps = None
        if self.batch_size and self._epoch_steps and train_time > 0:
            eps = self.batch_size * self._epoch_steps / train_time
        loss, accuracy, extra = split_logs(logs)
        extra["epoch_time"] = now - self._epoch_start
        self.reporter.epoch(
            epoch=int(epoch),
            step=self._step,
            loss=loss,
            accuracy=accuracy,
            examples_per_sec=eps,
            step_time=step_time,
            metrics=extra,
        )

    def on_train_end(self, logs=None) -> None:
        self._fitting = False
        self.reporter.event("train_end", steps=self._step)
        self.reporter.flush(FLUSH_TIMEOUT)

    def on_test_end(self, logs=None) -> None:
        if self._fitting:  # validation inside fit: the epoch record has it as val_*
            return
        loss, accuracy, _ = split_logs(logs)
        steps = _int_or_none((self.params or {}).get("steps"))
        self._ensure_reporter().event("evaluate", loss=loss, accuracy=accuracy, steps=steps)
        self.reporter.flush(FLUSH_TIMEOUT)

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Close the reporter (also done at interpreter exit)."""
        if self.reporter is not None:
            self.reporter.close(timeout)


class _LivePlotMixin(_ReporterMixin):
    """A KerasReporter that also shows a :class:`~ddlkit.metrics.dashboard.Dashboard`."""

    def __init__(
        self,
        title: str = "Training",
        batch_size: int | None = None,
        every: int = 1,
        *,
        mode: str | None = None,
        save_path: str | os.PathLike | None = None,
        **reporter_args: Any,
    ) -> None:
        super().__init__(batch_size, every, **reporter_args)
        self.title = title
        self.mode = mode
        self.save_path = save_path
        self.dashboard = None

    def _before_train(self) -> None:
        from ddlkit.metrics.dashboard import Dashboard

        if self.dashboard is None or self.dashboard.finished:
            params = self.params or {}
            epochs, steps = _int_or_none(params.get("epochs")), _int_or_none(params.get("steps"))
            self.dashboard = Dashboard(
                self.title,
                workers=[self.reporter.worker],
                total_steps=self._step + epochs * steps if epochs and steps else None,
                mode=self.mode,
                run_dir=self.reporter.run_dir,
                save_path=self.save_path,
            )
            self.dashboard.show()
        self.reporter.sink = self.dashboard

    def on_train_end(self, logs=None) -> None:
        super().on_train_end(logs)
        self.dashboard.finish()


def _replicas(model) -> int | None:
    """The number of replicas training ``model`` in sync: the strategy's, times the
    Horovod job's size when Horovod is initialised in this process (its ranks train under
    the default one-replica strategy)."""
    strategy = getattr(model, "distribute_strategy", None)
    replicas = _int_or_none(getattr(strategy, "num_replicas_in_sync", None))
    hvd = sys.modules.get("horovod.tensorflow")
    if replicas and hvd is not None and hvd.is_initialized():
        replicas *= int(hvd.size())
    return replicas


def steps_done(batch: Any, epoch_steps: int) -> int:
    """Steps one ``on_train_batch_end(batch)`` call covers (pure): ``batch`` is the
    epoch's 0-based index of the last step run, ``epoch_steps`` the steps counted before
    it this epoch. At least 1, also for a ``batch`` Keras does not give as an index."""
    index = _int_or_none(batch)
    return max(1, index + 1 - epoch_steps) if index is not None else 1


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


_CLASSES: dict[type, tuple[type, type]] = {}


def _classes() -> tuple[type, type]:
    """``(KerasReporter, LivePlot)`` for the Keras TensorFlow uses in this process."""
    base = backend.keras().callbacks.Callback
    if base not in _CLASSES:
        reporter_cls = type(
            "KerasReporter",
            (_ReporterMixin, base),
            {"__module__": __name__, "__doc__": __doc__},
        )
        live_cls = type(
            "LivePlot",
            (_LivePlotMixin, reporter_cls),
            {"__module__": __name__, "__doc__": _LivePlotMixin.__doc__},
        )
        _CLASSES[base] = (reporter_cls, live_cls)
    return _CLASSES[base]


def live_plot(
    title: str = "Training",
    batch_size: int | None = None,
    every: int = 1,
    **kwargs: Any,
):
    """A Keras callback that shows a live dashboard of this training in the cell.

    It shows a :class:`~ddlkit.metrics.dashboard.Dashboard` (curves, status,
    progress bar over ``epochs * steps``) when training begins, feeds it every
    record in-process, and finishes it at the end (headless: epoch lines and a
    final figure). Records also go to the JSONL file (and to a collector, if
    configured), as with :class:`KerasReporter`. ``kwargs``: ``mode``,
    ``save_path``, and the reporter's ``worker``, ``run_dir``, ``collector``, ``token``.
    """
    return _classes()[1](title, batch_size, every, **kwargs)


def __getattr__(name: str):
    if name == "KerasReporter":
        return _classes()[0]
    if name == "LivePlot":
        return _classes()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
