"""Train a CNN with Horovod and tf-keras: one process per rank, started by horovodrun.

Lines that exist only for distribution carry a ``[dist]`` comment, and options that only
change its speed ``[speed]``; the rest trains as launch/train_single.py does, plus a few
numbers in the report that the tests check (final loss and learning rate, a checksum of
the weights). Notebook 05 writes the same recipe out with plain Horovod calls
(``workers/hvd_worker.py``); this script uses the kit's data and model helpers. On a
host with GPUs each rank sees only its own, ``gpus[hvd.local_rank()]`` with memory growth:
``dkh.init()`` pins it (ddlkit.horovod.gpus), as Horovod's recipe does by hand.

Launch:
    ddlkit launch --strategy horovod -n 2 launch/train_horovod.py -- --epochs 1
    horovodrun -np 2 -H localhost:2 --gloo python launch/train_horovod.py --epochs 1

Flags of its own: ``--fp16`` compresses gradients to float16 for the allreduce;
``--groups 0`` all-reduces each gradient as soon as the backward pass has it (Horovod's
default) instead of all of them in one grouped all-reduce after it (``--groups 1``, ours);
``--backward-passes K`` adds up K local batches' gradients and all-reduces (and updates)
once per K batches;
``--warmup-epochs N`` ramps the learning rate up from ``lr`` to ``lr x ranks`` over
N epochs (Goyal et al.; ``dkh.LearningRateWarmupCallback``, which also runs on Keras 3);
``--no-average`` leaves epoch metrics per rank.
"""

from __future__ import annotations

import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import horovod.tensorflow.keras as hvd_keras  # [dist]
import tensorflow as tf
from _common import add_eval_flags, held_out_evals, parse_args, report, test_accuracy

import ddlkit.horovod as dkh  # [dist]
from ddlkit import data, metrics, models
from ddlkit.data import pipeline
from ddlkit.errors import ConfigError


def _flags(parser) -> None:
    parser.add_argument("--fp16", action="store_true", help="fp16 gradient compression")
    parser.add_argument(
        "--backward-passes", type=int, default=1, help="local batches per allreduce and update"
    )
    parser.add_argument(
        "--groups", type=int, default=1, help="grouped allreduces per step; 0: one per gradient"
    )
    parser.add_argument("--warmup-epochs", type=float, default=0.0, help="lr warm-up epochs")
    parser.add_argument("--no-average", action="store_true", help="keep per-rank epoch metrics")
    add_eval_flags(parser)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags, model_flag=True)
    if args.backward_passes < 1:
        raise ConfigError(f"--backward-passes {args.backward_passes}: need >= 1. Fix: e.g. 2.")
    if args.groups < 0:
        raise ConfigError(f"--groups {args.groups}: need >= 0. Fix: 1 (one all-reduce a step).")
    hvd = dkh.init()  # [dist] hvd.init(), own GPU (gpus[local_rank]) if any, rank-N metrics
    ranks = hvd.size()  # [dist]
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.for_horovod(  # [dist] each rank reads its own shard
        x_train, y_train, per_replica_batch=args.batch_size, rank=hvd.rank(), size=ranks
    )
    global_batch = args.batch_size * ranks  # [dist] per-rank batch x ranks
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    model = models.build(args.model, args.dataset, seed=args.seed)  # --model
    optimizer = models.make_optimizer("adam", args.lr * ranks)  # [dist] lr scales with batch
    compression = hvd_keras.Compression.fp16 if args.fp16 else hvd_keras.Compression.none  # [dist]
    optimizer = hvd_keras.DistributedOptimizer(  # [dist]
        optimizer,
        compression=compression,  # [dist] [speed] --fp16: float16 on the wire
        backward_passes_per_step=args.backward_passes,  # [dist] [speed] batches per update
        # groups=1: every gradient in one all-reduce once the backward pass is done.
        # Horovod's default (None) sends each as soon as it is ready, to overlap the backward
        # pass; with one core per rank that overlap only time-slices the core, and each
        # early all-reduce waits for a core busy with compute. Notebook 08, section 10,
        # measures both; with spare cores or GPUs, measure --groups 0.
        groups=args.groups or None,  # [dist] [speed]
    )  # [dist]
    # --steps-per-execution: steps per call into TensorFlow, see _common.STEPS_PER_EXECUTION
    models.compile_classifier(
        model, optimizer=optimizer, steps_per_execution=args.steps_per_execution
    )
    callbacks = [
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),  # [dist] rank 0's weights
    ]
    if args.warmup_epochs > 0:  # [dist] lr from lr to lr x ranks over the first epochs
        warmup = dkh.LearningRateWarmupCallback(  # [dist]
            args.lr * ranks, warmup_epochs=args.warmup_epochs, steps_per_epoch=steps, size=ranks
        )  # [dist]
        callbacks.append(warmup)  # [dist]
    if not args.no_average:  # [dist]
        callbacks.append(dkh.MetricAverageCallback())  # [dist] epoch metrics: mean over ranks
    reporter = metrics.KerasReporter(batch_size=args.batch_size)
    callbacks.append(reporter)
    if hvd.rank() == 0:  # [dist] rank 0 evaluates
        callbacks += held_out_evals(reporter, args, x_test, y_test, global_batch)
    start = time.perf_counter()
    history = model.fit(
        train, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks
    )
    seconds = time.perf_counter() - start
    accuracy, tested = test_accuracy(model, args, x_test, y_test)  # --test-examples
    examples = args.epochs * steps * global_batch
    weights = tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in model.weights])
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": examples / seconds,  # all ranks together
            "replicas": ranks,
            "dataset": args.dataset,
            "model": args.model,  # --model: cnn or small_resnet
            "epochs": args.epochs,
            "steps": args.epochs * steps,
            "global_batch": global_batch,
            "rank": hvd.rank(),
            "loss": float(history.history["loss"][-1]),
            "final_lr": float(model.optimizer.learning_rate.numpy()),
            "train_accuracy": float(history.history["accuracy"][-1]),
            "weights_checksum": float(weights.numpy()),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
