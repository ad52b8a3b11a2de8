"""Train a CNN with MirroredStrategy: one process, one replica per device.

Lines that exist only for distribution carry a ``[dist]`` comment, lines that only make
it faster (not needed for correctness) ``[speed]``, and lines that exist only for the
``ddlkit launch`` command ``[ddlkit]``; everything else is launch/train_single.py. The
devices are the first N GPUs if there are N, else N logical CPU devices (which share the
same cores: no speed-up on CPU). launch/_common.py, imported first, sets
TF_CPU_ALLOCATOR_USE_BFC=true ([speed]) for this script and train_single.py alike.

Launch:
    ddlkit launch --strategy mirrored -n 2 launch/train_mirrored.py -- --epochs 1
    python launch/train_mirrored.py --replicas 2 --epochs 1

``ddlkit launch`` sets DDLKIT_REPLICAS=N; ``--replicas`` overrides it, and
without either the script uses 2 replicas.
"""

from __future__ import annotations

import os  # [ddlkit] $DDLKIT_REPLICAS
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import tensorflow as tf  # [dist]
from _common import add_eval_flags, held_out_evals, parse_args, report, test_accuracy

from ddlkit import data, metrics, models
from ddlkit.contract import REPLICAS_VAR  # [ddlkit] how `ddlkit launch -n N` passes N
from ddlkit.data import pipeline
from ddlkit.lessons import replicas  # [dist] replicas

DEFAULT_REPLICAS = 2  # [dist]


def _flags(parser) -> None:  # [dist] --replicas, by default $DDLKIT_REPLICAS (ddlkit launch -n N)
    default = os.environ.get(REPLICAS_VAR, str(DEFAULT_REPLICAS))  # [ddlkit] argparse applies int
    about = f"devices to mirror on (default: ${REPLICAS_VAR}, else {DEFAULT_REPLICAS})"  # [ddlkit]
    parser.add_argument("--replicas", type=int, default=default, help=about)  # [dist]
    add_eval_flags(parser)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags, model_flag=True)  # [dist] extra: --replicas
    plan = replicas.devices(args.replicas)  # [dist] before any other TensorFlow op
    strategy = tf.distribute.MirroredStrategy(list(plan))  # [dist]
    n = strategy.num_replicas_in_sync  # [dist]
    global_batch = args.batch_size * n  # [dist] per-replica batch x replicas
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.for_strategy(  # [dist] each replica gets its slice of the global batch
        strategy, x_train, y_train, per_replica_batch=args.batch_size, repeat=True
    )
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)  # [dist]
    with strategy.scope():  # [dist] variables are mirrored on every replica
        model = models.build(args.model, args.dataset, seed=args.seed)  # --model
        models.compile_classifier(  # steps_per_execution: see _common.STEPS_PER_EXECUTION
            model,
            args.lr * n,  # [dist] lr scales with the global batch
            steps_per_execution=args.steps_per_execution,  # [speed]
        )
    reporter = metrics.KerasReporter(batch_size=global_batch)  # [dist] global batch
    evals = held_out_evals(reporter, args, x_test, y_test, global_batch)  # [dist] global batch
    start = time.perf_counter()
    model.fit(
        train,
        epochs=args.epochs,
        steps_per_epoch=steps,
        verbose=0,
        callbacks=[reporter, *evals],
    )
    seconds = time.perf_counter() - start
    accuracy, tested = test_accuracy(model, args, x_test, y_test)  # --test-examples
    examples = args.epochs * steps * global_batch  # [dist]
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": examples / seconds,
            "replicas": n,  # [dist]
            "dataset": args.dataset,
            "model": args.model,  # --model: cnn or small_resnet
            "epochs": args.epochs,
            "steps": args.epochs * steps,
            "devices": plan.kind,  # [dist]
            "global_batch": global_batch,  # [dist]
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
