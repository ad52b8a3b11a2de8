"""A GPipe-style pipeline: stages on their own devices, run by their own threads.

::

    pipe = parallel.Pipeline(split, micro_batches=4, learning_rate=1e-3)
    step = pipe.step(images, labels)      # one mini-batch: loss, accuracy, timeline
    step.timeline                         # when each F/B/U task of each stage ran

One training step splits the mini-batch into ``micro_batches`` equal parts and
runs the schedule of :mod:`ddlkit.parallel.schedule`: each stage is a Python
thread that works through its task list in order, waiting for activations from
the stage before it (forward) and gradients from the stage after it (backward).
TensorFlow releases the GIL while an op runs, so two stage threads really
compute at the same time when there are cores (or GPUs) for both.

The math is that of one big batch: the loss of micro-batch ``m`` is its summed
per-example loss divided by the *mini-batch* size, so the gradients summed over
micro-batches are exactly the mini-batch gradient (:meth:`Pipeline.gradients`
returns them; a test checks them against one tape over the whole batch). Each
stage applies them once per step with its own optimizer; Adam works per
variable, so per-stage Adams are one Adam over the whole model.

Like GPipe, a backward task recomputes its stage's forward pass instead of
keeping the activations (re-materialisation): it saves memory at the cost of
about a third more compute. Layers that behave randomly or keep state in
training (dropout, batch normalisation) therefore see each micro-batch twice;
the models :func:`~ddlkit.parallel.split` can cut in this kit have none.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ddlkit._tables import html_table
from ddlkit.backend import keras, tf
from ddlkit.errors import ConfigError
from ddlkit.parallel.schedule import (
    Timeline,
    Timing,
    check_micro_batches,
    gpipe_schedule,
    micro_batch_size,
)
from ddlkit.parallel.split import SplitModel

WAIT_TIMEOUT = 600.0  # a stage waiting longer than this means a bug: fail, don't hang


@dataclass(frozen=True)
class StepResult:
    """One pipelined training step: mean loss and accuracy over the mini-batch, and its timeline."""

    loss: float
    accuracy: float
    seconds: float
    timeline: Timeline

    def _repr_html_(self) -> str:
        return self.timeline._repr_html_()


class _Mailbox:
    """Tensors handed between stage threads, keyed by (kind, stage, micro-batch)."""

    def __init__(self) -> None:
        self._items: dict[tuple, Any] = {}
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    def put(self, key: tuple, value: Any) -> None:
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def take(self, key: tuple) -> Any:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: key in self._items or self.error is not None, timeout=WAIT_TIMEOUT
            )
            if self.error is not None:
                raise _Aborted()
            if not ok:
                raise TimeoutError(f"pipeline stage waited {WAIT_TIMEOUT} s for {key}")
            return self._items.pop(key)

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = exc
            self._cond.notify_all()


class _Aborted(Exception):
    """Another stage failed; this one stops."""


class _Stage:
    """One stage's compiled functions, all placed on its device."""

    def __init__(self, model: Any, device: str, last: bool, learning_rate: float) -> None:
        self.model = model
        self.device = device
        self.last = last
        self.variables = list(model.trainable_variables)
        T = tf()
        in_spec = T.TensorSpec((None, *model.input_shape[1:]), T.float32)
        out_spec = T.TensorSpec((None, *model.output_shape[1:]), T.float32)
        with T.device(device):
            self.optimizer = keras().optimizers.Adam(learning_rate)
            self.optimizer.build(self.variables)

        @T.function(input_signature=[in_spec], reduce_retracing=True)
        def forward(x):
            with T.device(device):
                return model(x, training=True)

        @T.function(input_signature=[in_spec, out_spec], reduce_retracing=True)
        def backward(x, dy):
            with T.device(device):
                with T.GradientTape() as tape:
                    tape.watch(x)
                    y = model(x, training=True)  # re-materialised forward
                dx, *grads = tape.gradient(y, [x, *self.variables], output_gradients=dy)
                return dx, grads

        label_spec = T.TensorSpec((None,), T.int64)
        scale_spec = T.TensorSpec((), T.float32)

        @T.function(input_signature=[in_spec, label_spec, scale_spec], reduce_retracing=True)
        def backward_loss(x, labels, batch_size):
            with T.device(device):
                with T.GradientTape() as tape:
                    tape.watch(x)
                    logits = model(x, training=True)
                    per_example = T.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                    loss = T.reduce_sum(per_example) / batch_size
                dx, *grads = tape.gradient(loss, [x, *self.variables])
                correct = T.reduce_sum(
                    T.cast(T.equal(T.argmax(logits, axis=-1), labels), T.float32)
                )
                return dx, grads, loss, correct

        @T.function(reduce_retracing=True)
        def update(grads):
            with T.device(device):
                self.optimizer.apply_gradients(zip(grads, self.variables, strict=True))

        self.forward, self.backward, self.backward_loss, self.update = (
            forward,
            backward,
            backward_loss,
            update,
        )


class Pipeline:
    """Trains a :class:`SplitModel` with GPipe's schedule; see the module docstring."""

    def __init__(
        self, model: SplitModel, micro_batches: int, *, learning_rate: float = 1e-3
    ) -> None:
        if not isinstance(model, SplitModel):
            raise ConfigError(
                f"Pipeline needs a SplitModel, got {type(model).__name__}. Fix: "
                f"parallel.split(model, devices, at=[...]) first."
            )
        check_micro_batches(micro_batches)
        if not learning_rate > 0:
            raise ConfigError(f"learning_rate={learning_rate!r} must be > 0. Fix: e.g. 1e-3.")
        self.model = model
        self.micro_batches = micro_batches
        self.learning_rate = learning_rate
        n = len(model)
        self._stages = [
            _Stage(stage, device, i == n - 1, learning_rate)
            for i, (stage, device) in enumerate(zip(model.stages, model.devices, strict=True))
        ]

    @property
    def devices(self) -> tuple[str, ...]:
        return self.model.devices

    def __repr__(self) -> str:
        return (
            f"Pipeline({len(self._stages)} stages on {', '.join(self.devices)}, "
            f"micro_batches={self.micro_batches})"
        )

    def _repr_html_(self) -> str:
        rows = [
            (i, s.device, ", ".join(layer.name for layer in s.model.layers))
            for i, s in enumerate(self._stages)
        ]
        return html_table(
            ("stage", "device", "layers"),
            rows,
            caption=f"GPipe pipeline: {self.micro_batches} micro-batches per mini-batch",
        )

    # -- one mini-batch ---------------------------------------------------------
    def gradients(self, x: Any, y: Any) -> tuple[float, list[list[Any]], StepResult]:
        """Run the schedule without updating: ``(loss, grads per stage, result)``."""
        return self._run(x, y, apply=False)

    def step(self, x: Any, y: Any) -> StepResult:
        """One training step on the mini-batch ``(x, y)``: all micro-batches, then one update."""
        return self._run(x, y, apply=True)[2]

    def _run(self, x: Any, y: Any, apply: bool):
        T = tf()
        x = T.convert_to_tensor(x, T.float32)
        y = T.cast(T.reshape(T.convert_to_tensor(y), [-1]), T.int64)
        batch = int(x.shape[0])
        micro_batch_size(batch, self.micro_batches)
        with T.device(self.devices[0]):
            xs = T.split(x, self.micro_batches)
        with T.device(self.devices[-1]):
            ys = T.split(y, self.micro_batches)
        run = _StepRun(self._stages, self.micro_batches, xs, ys, batch, apply)
        seconds = run.execute()
        timeline = Timeline(len(self._stages), self.micro_batches, run.timings(), label=repr(self))
        result = StepResult(run.loss, run.correct / batch, seconds, timeline)
        return run.loss, run.grads, result


class _StepRun:
    """One mini-batch through the schedule: one thread per stage, tensors via a mailbox."""

    def __init__(self, stages: list[_Stage], micro_batches: int, xs, ys, batch: int, apply: bool):
        self.stages = stages
        self.schedule = gpipe_schedule(len(stages), micro_batches)
        self.xs, self.ys, self.apply = xs, ys, apply
        self.scale = tf().constant(float(batch))
        self.box = _Mailbox()
        self._timings: list[list[Timing]] = [[] for _ in stages]
        self.grads: list[list[Any]] = [[] for _ in stages]
        self.loss = self.correct = 0.0
        self._lock = threading.Lock()
        self.t0 = 0.0

    def execute(self) -> float:
        """Run every stage's task list in its own thread; the step's wall time."""
        threads = [
            threading.Thread(target=self._stage, args=(s,), name=f"pipeline-stage-{s}", daemon=True)
            for s in range(len(self.stages))
        ]
        self.t0 = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - self.t0
        if self.box.error is not None:
            raise self.box.error
        return seconds

    def timings(self) -> tuple[Timing, ...]:
        return tuple(t for per in self._timings for t in per)

    def _stage(self, s: int) -> None:
        stage = self.stages[s]
        inputs: dict[int, Any] = {}  # each micro-batch's stage input, kept for the backward
        summed: list[Any] | None = None
        try:
            # the stage's calls (and so their outputs) stay on its device
            with tf().device(stage.device):
                for task in self.schedule[s]:
                    m = task.micro_batch
                    send = None  # (key, tensor) for the neighbour, handed over after `end`
                    if task.kind == "F":
                        xin = self.xs[m] if s == 0 else self.box.take(("act", s - 1, m))
                        start = time.perf_counter()  # waiting is idle time, not work
                        inputs[m] = xin
                        out = stage.forward(xin)
                        if not stage.last:
                            send = (("act", s, m), out)
                    elif task.kind == "B":
                        dy = None if stage.last else self.box.take(("grad", s + 1, m))
                        start = time.perf_counter()
                        dx, g = self._backward(stage, inputs.pop(m), dy, m)
                        summed = g if summed is None else _add(summed, g)
                        if s > 0:
                            send = (("grad", s, m), dx)
                    else:  # "U": one update with the gradients summed over micro-batches
                        start = time.perf_counter()
                        if self.apply:
                            stage.update(summed)
                        self.grads[s] = list(summed)
                    end = time.perf_counter()
                    self._timings[s].append(Timing(task, start - self.t0, end - self.t0))
                    if send is not None:  # so a task that waits for it starts after `end`
                        self.box.put(*send)
        except _Aborted:
            return
        except BaseException as exc:  # noqa: BLE001 - execute() raises it in the caller
            self.box.fail(exc)

    def _backward(self, stage: _Stage, xin: Any, dy: Any, m: int):
        if not stage.last:
            return stage.backward(xin, dy)
        dx, g, loss, correct = stage.backward_loss(xin, self.ys[m], self.scale)
        with self._lock:
            self.loss += float(loss)
            self.correct += float(correct)
        return dx, g


def _add(a: list[Any], b: list[Any]) -> list[Any]:
    return [x + y for x, y in zip(a, b, strict=True)]


def full_batch_gradients(model: SplitModel, x: Any, y: Any) -> tuple[float, list[Any]]:
    """The reference: loss and gradients of the whole mini-batch under one tape, no pipeline."""
    T = tf()
    x = T.convert_to_tensor(x, T.float32)
    y = T.cast(T.reshape(T.convert_to_tensor(y), [-1]), T.int64)
    with T.GradientTape() as tape:
        logits = model(x, training=True)
        loss = T.reduce_mean(T.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    return float(loss), tape.gradient(loss, model.trainable_variables)
