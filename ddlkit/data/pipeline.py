"""``tf.data`` input pipelines that stay correct under every strategy the kit teaches.

One concern, kept whole (about 510 lines): building the input pipeline and sharding it.

One function builds every pipeline, :func:`make_dataset`; the others only
decide its shard and batch size for a strategy:

=======================================  ==========================  ==================
strategy                                 call                        shard by
=======================================  ==========================  ==================
one device                               :func:`make_dataset`        (none)
MirroredStrategy, MultiWorkerMirrored    :func:`for_strategy`        input pipeline id
ParameterServerStrategy (``model.fit``)  :func:`dataset_creator`     (none, see there)
Horovod                                  :func:`for_horovod`         rank
=======================================  ==========================  ==================

The order of the steps matters:

1. **shard** first, so each worker keeps a disjoint part of the data and the
   parts together hold every example exactly once (example ``i`` goes to
   shard ``i % num_shards``, as ``Dataset.shard`` does);
2. **shuffle** the shard with a buffer as large as the shard (a true
   uniform shuffle), reshuffled every epoch from a fixed seed;
3. **repeat** (when asked), so a repeated pipeline never yields a short batch;
4. **batch** with the *per-replica* batch size; the global batch is
   ``per-replica batch x replicas`` (:func:`global_batch_size`);
5. **map** each batch to float32 in [0, 1] (one vectorised op per batch);
6. **prefetch** so the next batch is prepared while the model trains.

Images of shape (H, W) get a channel axis, (H, W, 1), so the models of
:mod:`ddlkit.models` take MNIST as it comes from :func:`ddlkit.data.load`.
Labels become a flat int64 vector (CIFAR-10's come as (N, 1)).

There is no ``cache()`` step: the arrays are already in memory, so caching
would only copy them a second time.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ddlkit.backend import active_flavour, keras, tf
from ddlkit.data import device_iterators
from ddlkit.errors import ConfigError

# tf.data's autotuning model (options.autotune.enabled). Off: in TensorFlow 2.21 freeing a
# tf.data iterator joins the autotuning thread, so the end of a model.fit can wait seconds
# for it (docs/design.md, "Engineering notes"), and on the kit's in-memory pipelines
# autotuning brought no measurable speed. AUTOTUNE in map and prefetch still work: map runs
# one call per core, prefetch sizes its buffer on its own. Read once, as the default of
# PipelineConfig.autotune (dataset_fn passes True: see there); pipelines that decode or
# augment, where autotuned parallelism pays, would want it on.
AUTOTUNE_MODEL = False


def _check_positive_int(name: str, value: Any, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name}={value!r} is not a positive integer. Fix: pass {hint}.")


def global_batch_size(per_replica: int, num_replicas: int) -> int:
    """The batch one synchronous step consumes across all replicas (pure).

    >>> global_batch_size(64, 4)
    256
    """
    _check_positive_int("per_replica", per_replica, "the batch size of one replica, e.g. 64")
    _check_positive_int(
        "num_replicas", num_replicas, "strategy.num_replicas_in_sync (or hvd.size()), at least 1"
    )
    return int(per_replica) * int(num_replicas)


def steps_per_epoch(num_examples: int, global_batch: int) -> int:
    """Full global batches in one pass over ``num_examples`` (pure).

    Repeated pipelines (Horovod, ParameterServerStrategy) need this for
    ``model.fit(steps_per_epoch=...)``: every worker then runs the same
    number of steps, which synchronous training requires.
    """
    _check_positive_int("num_examples", num_examples, "the number of training examples")
    _check_positive_int("global_batch", global_batch, "global_batch_size(per_replica, replicas)")
    if num_examples < global_batch:
        raise ConfigError(
            f"num_examples={num_examples} is smaller than global_batch={global_batch}, so an "
            f"epoch would have no full step. Fix: use a per-replica batch of at most "
            f"{num_examples} // replicas, or more data."
        )
    return int(num_examples) // int(global_batch)


@dataclass(frozen=True)
class PipelineConfig:
    """How one worker's pipeline is built; checks itself when created.

    ``batch_size`` is the per-replica batch (the batch one replica sees in one
    step). ``seed=None`` draws a fresh shuffle order in every process.
    """

    batch_size: int
    shuffle: bool = True
    seed: int | None = 0
    repeat: bool = False
    num_shards: int = 1
    shard_index: int = 0
    drop_remainder: bool = False
    normalize: bool = True
    autotune: bool = AUTOTUNE_MODEL  # tf.data's autotuning model, see AUTOTUNE_MODEL

    def __post_init__(self) -> None:
        _check_positive_int("batch_size", self.batch_size, "the per-replica batch size, e.g. 64")
        _check_positive_int(
            "num_shards", self.num_shards, "the number of workers reading the data (1 for one)"
        )
        if (
            isinstance(self.shard_index, bool)
            or not isinstance(self.shard_index, int | np.integer)
            or not 0 <= self.shard_index < self.num_shards
        ):
            raise ConfigError(
                f"shard_index={self.shard_index!r} is outside 0..{self.num_shards - 1} for "
                f"num_shards={self.num_shards}. Fix: pass this worker's index (the input "
                f"pipeline id, task index or Horovod rank), from 0 to num_shards - 1."
            )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer)
        ):
            raise ConfigError(
                f"seed={self.seed!r} is not an integer. Fix: pass an int, or seed=None for a "
                f"different shuffle order in every run."
            )

    def shard_size(self, num_examples: int) -> int:
        """How many of ``num_examples`` this shard holds (pure)."""
        return len(range(self.shard_index, num_examples, self.num_shards))

    def check_data(self, num_examples: int) -> None:
        """Refuse data this config would turn into an empty pipeline."""
        if num_examples < self.num_shards:
            raise ConfigError(
                f"{num_examples} examples cannot be split into num_shards={self.num_shards} "
                f"non-empty shards. Fix: use at most {num_examples} workers, or more data."
            )
        size = self.shard_size(num_examples)
        if self.drop_remainder and size < self.batch_size:
            raise ConfigError(
                f"shard {self.shard_index} holds {size} examples, fewer than "
                f"batch_size={self.batch_size}, and drop_remainder=True drops them all. Fix: use "
                f"batch_size <= {size}, or drop_remainder=False."
            )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{f.name}</th>"
            f"<td style='text-align:left'>{html.escape(repr(getattr(self, f.name)))}</td></tr>"
            for f in fields(self)
        )
        return f"<table><caption>PipelineConfig</caption>{rows}</table>"


def _as_arrays(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate the arrays; add the channel axis and flatten the labels (no copies)."""
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim not in (3, 4):
        raise ConfigError(
            f"x has shape {x.shape}; expected images (N, H, W) or (N, H, W, C). Fix: pass the "
            f"arrays from ddlkit.data.load(name), e.g. x_train of shape (60000, 28, 28)."
        )
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.ndim != 1 or len(y) != len(x):
        raise ConfigError(
            f"y has shape {y.shape} but x has shape {x.shape}; expected one integer label per "
            f"image, shape ({len(x)},) or ({len(x)}, 1). Fix: pass the matching y_train/y_test."
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(
            f"y has dtype {y.dtype}; expected integer class labels. Fix: pass the labels as "
            f"returned by ddlkit.data.load (not one-hot)."
        )
    if x.ndim == 3:
        x = x[..., np.newaxis]  # (N, H, W) -> (N, H, W, 1): a view, not a copy
    return x, y


def _build(x: np.ndarray, y: np.ndarray, config: PipelineConfig):
    """Build the ``tf.data.Dataset`` for validated arrays and config."""
    tf_ = tf()
    config.check_data(len(x))
    if config.normalize and x.dtype != np.uint8:
        raise ConfigError(
            f"normalize=True scales uint8 pixels 0..255 to [0, 1], but x has dtype {x.dtype}. "
            f"Fix: pass the uint8 arrays from ddlkit.data.load, or normalize=False if x is "
            f"already scaled."
        )
    # 1. Shard before anything else, so workers never hold the same example.
    # Slicing the arrays is what Dataset.shard(n, i) does (example j to shard
    # j % n) without building the whole data set in every worker first.
    xs = x[config.shard_index :: config.num_shards]
    ys = y[config.shard_index :: config.num_shards]
    ds = tf_.data.Dataset.from_tensor_slices((xs, ys.astype(np.int64)))
    # 2. A buffer as large as the shard is a true uniform shuffle; with
    # reshuffle_each_iteration each epoch gets a new order, and a fixed seed
    # makes that sequence of orders the same in every run.
    if config.shuffle:
        ds = ds.shuffle(len(xs), seed=config.seed, reshuffle_each_iteration=True)
    # 3. Repeat before batching: batches then run across epoch boundaries and
    # are always full, which fixed-step training (Horovod, PS) needs.
    if config.repeat:
        ds = ds.repeat()
    ds = ds.batch(config.batch_size, drop_remainder=config.drop_remainder)
    if config.normalize:
        ds = ds.map(
            lambda images, labels: (tf_.cast(images, tf_.float32) / 255.0, labels),
            num_parallel_calls=tf_.data.AUTOTUNE,
        )
    ds = ds.prefetch(tf_.data.AUTOTUNE)
    # TF shards a data set on its own when it is handed to
    # strategy.experimental_distribute_dataset or to model.fit under a
    # multi-worker strategy (policy AUTO: by file, else by element). A data
    # set we sharded ourselves would then be sharded a second time, and each
    # worker would silently train on 1/n of its 1/n. So: OFF when we sharded;
    # DATA (by element, stated instead of guessed) when we did not, so TF
    # still splits an unsharded data set correctly. Data sets made inside
    # distribute_datasets_from_function are never auto-sharded either way.
    options = tf_.data.Options()
    policy = tf_.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (
        policy.OFF if config.num_shards > 1 else policy.DATA
    )
    options.autotune.enabled = config.autotune
    return ds.with_options(options)


def _per_input_pipeline(x: np.ndarray, y: np.ndarray, global_batch: int, **options: Any):
    """A ``fn(input_context)`` giving input pipeline ``input_pipeline_id`` its shard,
    batched by its replicas' share of ``global_batch`` (TensorFlow calls it per worker,
    or per replica with :func:`input_options`)."""

    def fn(input_context):
        return _build(
            x,
            y,
            PipelineConfig(
                batch_size=input_context.get_per_replica_batch_size(global_batch),
                num_shards=input_context.num_input_pipelines,
                shard_index=input_context.input_pipeline_id,
                **options,
            ),
        )

    return fn


def make_dataset(
    x: Any,
    y: Any,
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int | None = 0,
    repeat: bool = False,
    num_shards: int = 1,
    shard_index: int = 0,
    drop_remainder: bool = False,
    normalize: bool = True,
):
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches for one worker.

    Images are float32 in [0, 1] with a channel axis, (B, H, W, C); with
    ``normalize=False`` they keep their dtype and values. Labels are int64,
    shape (B,). ``batch_size`` is the per-replica batch.
    """
    config = PipelineConfig(
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        repeat=repeat,
        num_shards=num_shards,
        shard_index=shard_index,
        drop_remainder=drop_remainder,
        normalize=normalize,
    )
    x, y = _as_arrays(x, y)
    return _build(x, y, config)


def _is_parameter_server(strategy: Any) -> bool:
    return isinstance(strategy, tf().distribute.experimental.ParameterServerStrategy)


def for_strategy(
    strategy: Any,
    x: Any,
    y: Any,
    *,
    per_replica_batch: int,
    shuffle: bool = True,
    seed: int | None = 0,
    repeat: bool = False,
    drop_remainder: bool = False,
    normalize: bool = True,
):
    """A distributed data set for a synchronous strategy (Mirrored, MultiWorkerMirrored).

    Each input pipeline (one per worker) reads its own shard and yields
    batches of ``per_replica_batch``; one step consumes
    ``global_batch_size(per_replica_batch, strategy.num_replicas_in_sync)``
    examples. Iterate the result in a custom loop, or pass it to ``model.fit``
    with ``repeat=True`` and ``steps_per_epoch=steps_per_epoch(len(x), global
    batch)``: tf-keras needs the step count for a distributed data set, and
    keeps one iterator across epochs, so the data must not run out.

    On a MirroredStrategy of CPU devices each *replica* gets its own input pipeline
    (:func:`input_options`: ``InputOptions(experimental_replication_mode=PER_REPLICA)``),
    so the function is called once per replica and each replica reads its own shard.
    TensorFlow keeps such options for every later input of the strategy
    (``MirroredExtended._input_workers_with_options`` assigns the strategy's input
    workers): a later ``distribute_datasets_from_function(fn)`` without options would call
    ``fn`` once per replica too. :func:`for_strategy` puts the strategy's input workers
    back after making its data set (which keeps its own), so the strategy is as it was.
    """
    if _is_parameter_server(strategy):
        raise ConfigError(
            "for_strategy() got a ParameterServerStrategy, whose workers read data through a "
            "dataset function and run a fixed number of steps. Fix: pass "
            "dataset_creator(x, y, global_batch=...) to model.fit together with steps_per_epoch."
        )
    global_batch = global_batch_size(per_replica_batch, strategy.num_replicas_in_sync)
    x, y = _as_arrays(x, y)
    # Check the arrays and options now, in the caller, rather than inside
    # TensorFlow's call of dataset_fn where the error would be wrapped.
    PipelineConfig(batch_size=per_replica_batch, shuffle=shuffle, seed=seed, normalize=normalize)

    per_worker = _per_input_pipeline(
        x,
        y,
        global_batch,
        shuffle=shuffle,
        seed=seed,
        repeat=repeat,
        drop_remainder=drop_remainder,
        normalize=normalize,
    )
    options = input_options(strategy)
    if options is None and device_iterators.applies(_device_types(strategy)):
        device_iterators.without_autotune()  # TensorFlow's per-device data sets: see there
    return _distribute_leaving_strategy_as_it_was(strategy, per_worker, options)


# The attribute of TensorFlow's MirroredExtended that PER_REPLICA input options overwrite.
_INPUT_WORKERS = "_input_workers_devices"


def _distribute_leaving_strategy_as_it_was(strategy: Any, fn: Callable, options: Any):
    """``strategy.distribute_datasets_from_function(fn, options=options)``, with the
    strategy's input workers put back afterwards (see :func:`for_strategy`)."""
    extended = strategy.extended
    before = getattr(extended, _INPUT_WORKERS, None)
    try:
        return strategy.distribute_datasets_from_function(fn, options=options)
    finally:
        if before is not None and getattr(extended, _INPUT_WORKERS, None) is not before:
            setattr(extended, _INPUT_WORKERS, before)


def per_replica_input(device_types: tuple[str, ...], *, offered: bool) -> bool:
    """Whether a strategy's replicas get an input pipeline each, read where it runs (pure).

    ``offered``: the strategy takes ``InputReplicationMode.PER_REPLICA`` (TensorFlow's
    MirroredStrategy does; MultiWorkerMirroredStrategy does not, and keeps the default).
    TensorFlow's default for a worker's replicas, one pipeline whose batches a
    ``MultiDeviceIterator`` copies to each device, is what GPUs need; on CPU devices it
    only adds a thread hop per batch, and its per-device data sets keep tf.data's
    autotuning on: every ``model.fit`` under MirroredStrategy then paused 4-15 s before
    returning on this 2-core machine. Where the strategy does not offer it (MWMS),
    :func:`for_strategy` turns that autotuning off instead (:mod:`ddlkit.data.device_iterators`).

    >>> per_replica_input(("CPU", "CPU"), offered=True)
    True
    >>> per_replica_input(("GPU", "GPU"), offered=True), per_replica_input(("CPU",), offered=False)
    (False, False)
    """
    return offered and all(t == "CPU" for t in device_types)


def _device_types(strategy: Any) -> tuple[str, ...]:
    """``("CPU", "CPU")``: the type of each of this worker's replica devices."""
    return tuple(
        tf().DeviceSpec.from_string(d).device_type for d in strategy.extended.worker_devices
    )


def input_options(strategy: Any):
    """The ``tf.distribute.InputOptions`` :func:`for_strategy` uses: a pipeline per replica
    (:func:`per_replica_input`), else TensorFlow's default (``None``)."""
    tf_ = tf()
    offered = isinstance(strategy, tf_.distribute.MirroredStrategy)
    if not per_replica_input(_device_types(strategy), offered=offered):
        return None
    return tf_.distribute.InputOptions(
        experimental_replication_mode=tf_.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=True,  # each replica's pipeline on its device
        experimental_fetch_to_device=False,  # so no copy from the host is left to make
    )


def for_horovod(
    x: Any,
    y: Any,
    *,
    per_replica_batch: int,
    rank: int,
    size: int,
    shuffle: bool = True,
    seed: int | None = 0,
    repeat: bool = True,
    drop_remainder: bool = False,
    normalize: bool = True,
):
    """The data set of one Horovod rank: shard ``rank`` of ``size``.

    Pass ``rank=hvd.rank(), size=hvd.size()``. It repeats by default: ranks
    whose shards differ by one example could otherwise run different numbers
    of steps, and a rank waiting in an allreduce for a finished rank hangs.
    Train with ``steps_per_epoch=steps_per_epoch(len(x), per_replica_batch * size)``.
    """
    _check_positive_int("size", size, "hvd.size(), the number of Horovod processes")
    return make_dataset(
        x,
        y,
        batch_size=per_replica_batch,
        shuffle=shuffle,
        seed=seed,
        repeat=repeat,
        num_shards=size,
        shard_index=rank,
        drop_remainder=drop_remainder,
        normalize=normalize,
    )


def dataset_fn(
    x: Any,
    y: Any,
    *,
    global_batch: int,
    shuffle: bool = True,
    seed: int | None = None,
    normalize: bool = True,
) -> Callable[[Any], Any]:
    """A ``dataset_fn(input_context)`` for ParameterServerStrategy (always repeats).

    Its workers run steps the coordinator schedules, so the data never ends
    (``steps_per_epoch`` ends the epoch). TensorFlow traces this function once
    on the coordinator and runs the same graph on every worker, with
    ``input_context`` saying one pipeline (id 0): there is nothing to shard
    by. Each worker therefore reads all the data, and ``seed=None`` (the
    default) lets each worker's shuffle draw its own order; a fixed seed
    would feed every worker the same examples in the same order.
    """
    _check_positive_int("global_batch", global_batch, "the batch of one training step, e.g. 64")
    x, y = _as_arrays(x, y)
    PipelineConfig(batch_size=global_batch, shuffle=shuffle, seed=seed, normalize=normalize)

    # Autotuning stays on here: a PS worker's iterator lives as long as the worker, so no
    # fit waits for it at its end, and parameter_server-x1 ran faster with it than without
    # (ddlkit bench --quick, two benchmarks of each on a 2-core CPU).
    return _per_input_pipeline(
        x,
        y,
        global_batch,
        shuffle=shuffle,
        seed=seed,
        repeat=True,
        normalize=normalize,
        autotune=True,
    )


def dataset_creator(
    x: Any,
    y: Any,
    *,
    global_batch: int,
    shuffle: bool = True,
    seed: int | None = None,
    normalize: bool = True,
):
    """:func:`dataset_fn` wrapped for ``model.fit`` under ParameterServerStrategy (tf-keras).

    Use as ``model.fit(dataset_creator(x, y, global_batch=64), epochs=...,
    steps_per_epoch=steps_per_epoch(len(x), 64))``.
    """
    if active_flavour() != "tf-keras":
        raise ConfigError(
            "dataset_creator() needs tf-keras' DatasetCreator, and Keras 3 does not support "
            "ParameterServerStrategy. Fix: unset DDLKIT_KERAS (or set DDLKIT_KERAS=2) before "
            "importing ddlkit, so the kit runs on tf-keras."
        )
    creator = keras().utils.experimental.DatasetCreator
    return creator(
        dataset_fn(x, y, global_batch=global_batch, shuffle=shuffle, seed=seed, normalize=normalize)
    )
