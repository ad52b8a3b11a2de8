"""Train a CNN with Horovod in a custom loop (DistributedGradientTape), Keras 3 or tf-keras.

Horovod 0.28.1's tape and broadcast fail on Keras 3 variables ("'Variable' object has no
attribute 'ref'", horovod/horovod#4290); ddlkit.horovod's wrappers hand Horovod the
tf.Variables inside them, so the same loop runs on both Keras versions. Notebook 05 writes
the tf-keras loop with Horovod's own calls (``workers/hvd_ctl.py``). Lines that exist
only for distribution carry a ``[dist]`` comment, options that only change its speed
``[speed]``.
On a host with GPUs ``dkh.init()`` pins each rank to ``gpus[hvd.local_rank()]``.

Launch (DDLKIT_KERAS=3 for Keras 3; the default is tf-keras):
    DDLKIT_KERAS=3 ddlkit launch --strategy horovod -n 2 launch/train_horovod_tape.py -- --epochs 1
    DDLKIT_KERAS=3 horovodrun -np 2 -H localhost:2 --gloo python launch/train_horovod_tape.py

``--seed-per-rank`` starts every rank from different weights, to show that the
broadcast makes them equal.
"""

from __future__ import annotations

import time

import ddlkit  # noqa: F401  (chooses the Keras before TensorFlow loads)

# isort: split
import tensorflow as tf
from _common import parse_args, report, test_accuracy

import ddlkit.horovod as dkh  # [dist]
from ddlkit import backend, metrics, models
from ddlkit import data as dk_data
from ddlkit.data import pipeline


def _flags(parser) -> None:
    parser.add_argument("--fp16", action="store_true", help="fp16 gradient compression")
    parser.add_argument("--seed-per-rank", action="store_true", help="different initial weights")


def checksum(variables) -> float:
    return float(sum(tf.reduce_sum(tf.cast(v, tf.float64)).numpy() for v in variables))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags)
    hvd = dkh.init()  # [dist] hvd.init(), own GPU (gpus[local_rank]) if any, rank-N metrics
    rank, ranks = hvd.rank(), hvd.size()  # [dist]
    keras = backend.keras()
    (x_train, y_train), (x_test, y_test) = dk_data.load(args.dataset)
    train = pipeline.for_horovod(  # [dist] each rank reads its own shard
        x_train, y_train, per_replica_batch=args.batch_size, rank=rank, size=ranks
    )
    global_batch = args.batch_size * ranks  # [dist]
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    seed = args.seed + rank if args.seed_per_rank else args.seed  # [dist] (a demonstration)
    model = models.for_dataset(args.dataset, seed=seed)
    optimizer = keras.optimizers.Adam(args.lr * ranks)  # [dist] lr scales with batch
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none  # [dist] [speed]
    model(next(iter(train))[0][:1])  # [dist] build the weights, so that there is a start to
    optimizer.build(model.trainable_variables)  # [dist] broadcast (the optimizer's too)
    initial = checksum(model.trainable_variables)
    dkh.broadcast_variables(model.variables + list(optimizer.variables), root_rank=0)  # [dist]

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        tape = dkh.DistributedGradientTape(tape, compression=compression)  # [dist] allreduce
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        correct = tf.equal(tf.argmax(logits, axis=1), tf.cast(y, tf.int64))
        return loss, tf.reduce_mean(tf.cast(correct, tf.float32))

    reporter = metrics.Reporter()
    reporter.event("train_begin", epochs=args.epochs, steps=steps, batch_size=args.batch_size)
    batches = iter(train)
    step = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses, accuracies = [], []
        for _ in range(steps):
            x, y = next(batches)
            loss, accuracy = train_step(x, y)
            losses.append(float(loss))
            accuracies.append(float(accuracy))
            step += 1
            reporter.step(
                step=step,
                epoch=epoch,
                loss=losses[-1],
                accuracy=accuracies[-1],
                batch_size=args.batch_size,
            )
        mean = [sum(losses) / len(losses), sum(accuracies) / len(accuracies)]
        mean = tf.constant(mean, tf.float64)
        mean = hvd.allreduce(mean, op=hvd.Average, name="epoch_metrics")  # [dist] over ranks
        mean = [float(v) for v in mean.numpy()]
        reporter.epoch(epoch=epoch, step=step, loss=mean[0], accuracy=mean[1])
    seconds = time.perf_counter() - start
    reporter.event("train_end", steps=step)
    reporter.close()
    accuracy, tested = test_accuracy(model, args, x_test, y_test)  # --test-examples
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": args.epochs * steps * global_batch / seconds,
            "replicas": ranks,
            "dataset": args.dataset,
            "epochs": args.epochs,
            "steps": args.epochs * steps,
            "global_batch": global_batch,
            "rank": rank,
            "loss": mean[0],
            "train_accuracy": mean[1],
            "keras": backend.active_flavour(),
            "initial_checksum": initial,
            "weights_checksum": checksum(model.trainable_variables),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
