"""The bench's reference: a bare tf-keras loop, what a learner writes without any kit.

The MNIST CNN (conv 32, pool, conv 64, pool, dense 128), batch 64, Adam, plain
``tf.data`` and ``model.fit`` with ``steps_per_execution=1`` (Keras' default). ddlkit
appears only to load MNIST offline, to measure (KerasReporter's step records, as every
bench case is measured) and to report. ``ddlkit bench`` runs it as case reference-x1,
pinned like single-x1, and compares single-x1 with it: what the kit's script costs or
gains over the bare loop.

Launch:
    python launch/bench_reference.py --steps-per-epoch 200
    ddlkit launch --strategy mirrored -n 1 launch/bench_reference.py -- --steps-per-epoch 200
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf-keras, as the kit's scripts use
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "false"  # TF's default, which _common changes

# isort: split
from _common import final_test_set, parse_args, report

from ddlkit import data, metrics  # loading MNIST offline, measuring, reporting

# isort: split
import tensorflow as tf


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    if args.dataset != "mnist":
        raise SystemExit(f"--dataset {args.dataset}: the reference is the MNIST CNN only.")
    (x_train, y_train), (x_test, y_test) = data.load("mnist")
    train = (
        tf.data.Dataset.from_tensor_slices((x_train[..., None], y_train.astype("int64")))
        .shuffle(len(x_train), seed=args.seed)
        .repeat()
        .batch(args.batch_size)
        .map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    tf.keras.utils.set_random_seed(args.seed)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(args.lr),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    steps = args.steps_per_epoch or len(x_train) // args.batch_size
    reporter = metrics.KerasReporter(batch_size=args.batch_size)  # measurement only
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=[reporter])
    seconds = time.perf_counter() - start
    x_final, y_final = final_test_set(args, x_test, y_test)  # --test-examples: the first n
    test = tf.data.Dataset.from_tensor_slices((x_final[..., None] / 255.0, y_final))
    test = test.map(lambda x, y: (tf.cast(x, tf.float32), y)).batch(256)
    accuracy = float(model.evaluate(test, verbose=0)[1])
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": len(x_final),
            "train_seconds": seconds,
            "examples_per_sec": args.epochs * steps * args.batch_size / seconds,
            "replicas": 1,
            "dataset": args.dataset,
            "epochs": args.epochs,
            "steps": args.epochs * steps,
            "global_batch": args.batch_size,
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
