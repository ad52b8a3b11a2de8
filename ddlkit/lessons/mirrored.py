"""MirroredStrategy made visible: what is mirrored, what is all-reduced, how a batch splits.

Notebook 01 uses these to show, on real TensorFlow objects, what
``tf.distribute.MirroredStrategy`` does inside one process:

- :func:`replica_values`: the copies of a mirrored variable, one per device;
- :func:`all_reduce`: each replica's own value, and what an all-reduce gives back;
- :func:`batch_split`: how one global batch is cut into per-replica batches;
- :func:`one_step_check`: one training step with N replicas against one device
  on the same global batch; equal weights show that the gradients are
  all-reduced to the mean over the global batch;
- :func:`train_and_measure`: train with a live plot and return a
  :class:`ddlkit.results.Result` (examples/s, test accuracy) for the comparison table.

The strategy's devices come from :func:`ddlkit.lessons.replicas.devices` (GPUs where
there are enough, else logical CPU devices), which must run before any other
TensorFlow code.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError


@dataclass(frozen=True)
class ReplicaTable:
    """One row per replica; shows as a table in a notebook and as text elsewhere."""

    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def column(self, name: str) -> list[Any]:
        """The values of one column, replica by replica."""
        i = self.headers.index(name)
        return [row[i] for row in self.rows]

    def _repr_html_(self) -> str:
        return html_table(self.headers, self.rows, self.caption)

    def __str__(self) -> str:
        return text_table(self.headers, self.rows, self.caption)


def short_device(name: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:1`` -> ``CPU:1`` (pure)."""
    return name.rsplit("device:", 1)[-1] if "device:" in name else name


def _components(value: Any, what: str) -> tuple[Any, ...]:
    """The per-replica parts of a distributed value (MirroredVariable, PerReplica, ...)."""
    parts = getattr(value, "values", None)
    if not isinstance(parts, tuple) or not parts:
        raise ConfigError(
            f"{what} is a {type(value).__name__}, not a distributed value with one part per "
            f"replica. Fix: create the variable inside `with strategy.scope():` (or pass a "
            f"result of strategy.run)."
        )
    return parts


def _preview(array: np.ndarray, n: int) -> str:
    flat = np.asarray(array).reshape(-1)[:n]
    return "[" + ", ".join(f"{v:+.4f}" for v in flat) + (", ...]" if array.size > n else "]")


@contextmanager
def _quiet_tf_logs():
    """Hide TensorFlow's Python INFO and WARNING lines while a demo runs."""
    import tensorflow as tf

    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def replica_values(variable: Any, n: int = 3) -> ReplicaTable:
    """Each replica's copy of a mirrored variable: its device, shape and first ``n`` values."""
    parts = _components(variable, "variable")
    first = parts[0].numpy()
    rows = []
    for i, part in enumerate(parts):
        value = part.numpy()
        rows.append(
            (
                i,
                short_device(part.device),
                part.name,
                str(tuple(value.shape)),
                _preview(value, n),
                bool(np.array_equal(value, first)),
            )
        )
    return ReplicaTable(
        f"{type(variable).__name__} {getattr(variable, 'name', '')}: one copy per replica",
        ("replica", "device", "copy", "shape", "first values", "same as replica 0"),
        tuple(rows),
    )


def all_reduce(strategy: Any) -> ReplicaTable:
    """Replica ``i`` holds the number ``i + 1``; every replica all-reduces it (sum and mean).

    The same collective sums the gradients in every training step.
    """
    import tensorflow as tf

    def step():
        ctx = tf.distribute.get_replica_context()
        own = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, own)
        mean = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, own)
        return own, summed, mean

    # Eagerly, so each result stays on its replica's device (a tf.function would return
    # them all on the caller's device). TensorFlow warns that eager replicas are slow.
    with _quiet_tf_logs():
        own, summed, mean = strategy.run(step)
    rows = []
    for i, (o, s, m) in enumerate(
        zip(
            strategy.experimental_local_results(own),
            strategy.experimental_local_results(summed),
            strategy.experimental_local_results(mean),
            strict=True,
        )
    ):
        rows.append((i, short_device(o.device), float(o), float(s), float(m)))
    return ReplicaTable(
        f"all-reduce across {strategy.num_replicas_in_sync} replicas",
        ("replica", "device", "own value", "after all_reduce(SUM)", "after all_reduce(MEAN)"),
        tuple(rows),
    )


def batch_split(strategy: Any, dataset: Any) -> ReplicaTable:
    """The first batch of a distributed data set, as each replica receives it."""
    images, labels = next(iter(dataset))
    local_images = strategy.experimental_local_results(images)
    local_labels = strategy.experimental_local_results(labels)
    rows = [
        (i, short_device(x.device), str(tuple(x.shape)), str(tuple(y.shape)))
        for i, (x, y) in enumerate(zip(local_images, local_labels, strict=True))
    ]
    total = sum(int(x.shape[0]) for x in local_images)
    return ReplicaTable(
        f"one step: global batch {total} = {len(rows)} replicas x per-replica batch",
        ("replica", "device", "images", "labels"),
        tuple(rows),
    )


@dataclass(frozen=True)
class StepCheck:
    """One SGD step with N replicas against one device, on the same global batch."""

    replicas: int
    global_batch: int
    learning_rate: float
    max_update: float  # the largest weight change of the single-device step
    max_diff: float  # N replicas vs one device, same learning rate
    max_diff_if_summed: float  # N replicas vs one device taking N x the step (summed gradients)

    @property
    def per_replica_batch(self) -> int:
        return self.global_batch // self.replicas

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("replicas", str(self.replicas)),
            ("global batch", f"{self.global_batch} ({self.per_replica_batch} per replica)"),
            ("optimizer", f"SGD, learning rate {self.learning_rate:g}"),
            ("largest weight change in the step", f"{self.max_update:.3e}"),
            ("N replicas vs one device: largest difference", f"{self.max_diff:.3e}"),
            ("... vs one device with summed gradients", f"{self.max_diff_if_summed:.3e}"),
        ]

    def _repr_html_(self) -> str:
        return html_table(("one training step", "value"), self.rows())

    def __str__(self) -> str:
        return text_table(("one training step", "value"), self.rows())


def _weights_after_one_step(strategy, dataset_name, x, y, learning_rate, seed):
    from ddlkit import models
    from ddlkit.backend import keras
    from ddlkit.data import pipeline

    with strategy.scope():
        model = models.for_dataset(dataset_name, seed=seed)
        models.compile_classifier(model, optimizer=keras().optimizers.SGD(learning_rate))
    batch = pipeline.make_dataset(x, y, batch_size=len(x), shuffle=False)
    before = [w.copy() for w in model.get_weights()]
    model.fit(batch, epochs=1, verbose=0)
    return before, model.get_weights()


def one_step_check(
    strategy: Any,
    x: Any,
    y: Any,
    *,
    dataset: str = "mnist",
    global_batch: int = 64,
    learning_rate: float = 0.1,
    seed: int = 0,
) -> StepCheck:
    """Train one step on the first ``global_batch`` examples under ``strategy`` and on one
    device (TensorFlow's default strategy), from the same initial weights.

    Each replica computes the gradient of its slice's mean loss divided by the number of
    replicas (tf-keras' scaling: the slice's total over the *global* batch); the all-reduce
    sums them, which gives the gradient of the mean loss over the global batch: exactly
    the single-device gradient. SGD is used because its step is
    proportional to the gradient (Adam's first step is nearly ``lr * sign(gradient)``
    and would hide a wrong scale).
    """
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    if not isinstance(global_batch, int) or global_batch < replicas or global_batch % replicas:
        raise ConfigError(
            f"global_batch={global_batch!r} cannot be split evenly into {replicas} replicas. "
            f"Fix: pass a multiple of {replicas}, e.g. {replicas * 32}."
        )
    if len(x) < global_batch:
        raise ConfigError(
            f"{len(x)} examples are fewer than global_batch={global_batch}. "
            f"Fix: pass more examples or a smaller global_batch."
        )
    x, y = x[:global_batch], y[:global_batch]
    default = tf.distribute.get_strategy()
    if default is strategy or default.num_replicas_in_sync != 1:
        raise ConfigError(
            "one_step_check was called inside a strategy scope, so it cannot train on one "
            "device for comparison. Fix: call it outside `with strategy.scope():`."
        )
    with _quiet_tf_logs():  # one line per reduction of Keras' metrics, three models' worth
        before, mirrored = _weights_after_one_step(strategy, dataset, x, y, learning_rate, seed)
        _, single = _weights_after_one_step(default, dataset, x, y, learning_rate, seed)
        _, summed = _weights_after_one_step(default, dataset, x, y, learning_rate * replicas, seed)

    def largest(a, b):
        return float(max(np.abs(u - v).max() for u, v in zip(a, b, strict=True)))

    return StepCheck(
        replicas=replicas,
        global_batch=global_batch,
        learning_rate=learning_rate,
        max_update=largest(single, before),
        max_diff=largest(mirrored, single),
        max_diff_if_summed=largest(mirrored, summed),
    )


def train_and_measure(
    name: str,
    strategy: Any,
    dataset: str,
    *,
    per_replica_batch: int,
    epochs: int,
    steps_per_epoch: int | None,
    base_lr: float,
    learning_rate: float | None = None,
    seed: int = 0,
    notes: str = "",
):
    """Train the data set's tutorial CNN under ``strategy`` with a live plot; its Result.

    What notebook 01's sections 6 and 8-10 write out, in one call: the global batch is
    ``per_replica_batch x replicas``; the input is a ``dataset_fn(input_context)`` that
    shards by input pipeline and batches by ``input_context.get_per_replica_batch_size``,
    given to ``strategy.distribute_datasets_from_function`` without options (one input
    pipeline per process, as the notebook's); the model and ``Adam(learning_rate)`` are
    built in ``strategy.scope()``, with ``learning_rate = base_lr x replicas`` (the linear
    scaling rule) unless ``learning_rate`` is given. Throughput is the steady-state
    examples/s of the step records (:func:`ddlkit.results.throughput`); test accuracy is
    measured on the whole test set.
    """
    from ddlkit import data, models, results
    from ddlkit.data import pipeline
    from ddlkit.metrics import live_plot, load_run

    replicas = strategy.num_replicas_in_sync
    global_batch = pipeline.global_batch_size(per_replica_batch, replicas)
    if learning_rate is None:
        learning_rate = base_lr * replicas
    elif not (isinstance(learning_rate, int | float) and learning_rate > 0):
        raise ConfigError(
            f"learning_rate={learning_rate!r} must be a positive number. Fix: pass e.g. "
            f"base_lr * replicas ** 0.5, or leave it out for base_lr * replicas."
        )
    loaded = data.load(dataset)
    (x_train, y_train), (x_test, y_test) = loaded

    def dataset_fn(input_context):
        return pipeline.make_dataset(
            x_train,
            y_train,
            batch_size=input_context.get_per_replica_batch_size(global_batch),
            num_shards=input_context.num_input_pipelines,
            shard_index=input_context.input_pipeline_id,
            seed=seed,
            repeat=True,
        )

    train = strategy.distribute_datasets_from_function(dataset_fn)
    test = pipeline.make_dataset(x_test, y_test, batch_size=512, shuffle=False)
    steps = steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    with strategy.scope():
        model = models.for_dataset(dataset, seed=seed)
        models.compile_classifier(model, learning_rate)
    title = f"{name}: {loaded.info.display_name}, {replicas} replica(s)"
    live = live_plot(title, batch_size=global_batch)
    model.fit(train, epochs=epochs, steps_per_epoch=steps, callbacks=[live], verbose=0)
    test_accuracy = float(model.evaluate(test, verbose=0)[1])
    records = load_run(live.reporter.run_dir)
    return results.Result(
        name=name,
        strategy="MirroredStrategy",
        dataset=dataset,
        workers=1,
        replicas=replicas,
        global_batch=global_batch,
        epochs=epochs,
        steps=epochs * steps,
        examples_per_sec=results.throughput(records),
        test_accuracy=test_accuracy,
        train_seconds=records[-1].wall_time - records[0].wall_time,
        synthetic_data=loaded.info.synthetic,
        notes=", ".join(n for n in (notes, f"learning rate {learning_rate:g}") if n),
    )
