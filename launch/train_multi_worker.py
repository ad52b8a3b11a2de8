"""Train a CNN with MultiWorkerMirroredStrategy: one process per worker.

Lines there or different because training is distributed end with ``# [dist]``
(the single-process script is launch/train_single.py); lines that only make it
faster end with ``# [speed]``. Importing ``_common`` sets TensorFlow's CPU
allocator (``TF_CPU_ALLOCATOR_USE_BFC``, a ``# [speed]`` setting: see there).

Launch:
    ddlkit launch --strategy multi_worker -n 2 launch/train_multi_worker.py -- --epochs 1

By hand, one shell per worker (TF_CONFIG differs only in the task index):
    export TF_USE_LEGACY_KERAS=1
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                "task": {"type": "worker", "index": 0}}' python launch/train_multi_worker.py
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                "task": {"type": "worker", "index": 1}}' python launch/train_multi_worker.py
"""

from __future__ import annotations

import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import tensorflow as tf
from _common import (  # [speed] _common also sets TF_CPU_ALLOCATOR_USE_BFC (see there)
    add_eval_flags,
    held_out_evals,
    parse_args,
    report,
    test_accuracy,
)

from ddlkit import data, metrics, models
from ddlkit.data import pipeline
from ddlkit.lessons import faults
from ddlkit.local_logs import local_step_logs  # [dist] [speed]


def _flags(parser) -> None:
    parser.add_argument(  # [dist]
        "--step-logs",
        default="local",
        choices=("local", "synced"),
        help="per-step logs: this worker's metrics (local), or all-reduced every step (synced, "
        "tf-keras' default); epoch logs are synchronised either way",
    )  # [dist]
    add_eval_flags(parser)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags, model_flag=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # [dist] reads TF_CONFIG
    replicas = strategy.num_replicas_in_sync  # [dist]
    resolver = strategy.cluster_resolver  # [dist] who is who, from TF_CONFIG
    cluster = resolver.cluster_spec().as_dict()  # [dist] every task's address
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", [])) or 1  # [dist]
    chief = faults.is_chief(resolver.task_type, resolver.task_id, cluster)  # [dist] TF's rule
    global_batch = args.batch_size * replicas  # [dist] per-replica batch x replicas
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.for_strategy(  # [dist] each worker reads its own shard
        strategy, x_train, y_train, per_replica_batch=args.batch_size, repeat=True
    )
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    with strategy.scope():  # [dist] variables are mirrored on every replica
        model = models.build(args.model, args.dataset, seed=args.seed)  # --model
        if args.step_logs == "local":  # [dist] [speed] tf-keras' fit all-reduces the metrics
            model = local_step_logs(model)  # [dist] [speed] every step: ddlkit/local_logs.py
        models.compile_classifier(  # steps_per_execution: see _common.STEPS_PER_EXECUTION
            model,
            args.lr * replicas,  # [dist] linear in the batch: SGD's rule, a heuristic for Adam
            steps_per_execution=args.steps_per_execution,
        )
    reporter = metrics.KerasReporter(batch_size=global_batch // workers)
    callbacks = [reporter]
    if chief:  # [dist] the chief evaluates (the chief task, else worker 0)
        callbacks += held_out_evals(reporter, args, x_test, y_test, global_batch)
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    accuracy, tested = test_accuracy(model, args, x_test, y_test)  # --test-examples
    examples = args.epochs * steps * global_batch
    weights = tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in model.weights])
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": examples / seconds,  # all workers together
            "replicas": replicas,
            "dataset": args.dataset,
            "model": args.model,  # --model: cnn or small_resnet
            "epochs": args.epochs,
            "steps": args.epochs * steps,
            "global_batch": global_batch,
            "weights_checksum": float(weights.numpy()),  # equal on every worker
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
