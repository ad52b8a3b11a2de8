"""Synchronous training (MultiWorkerMirroredStrategy) that reports a time-to-accuracy curve.

launch/train_multi_worker.py plus one callback (``held_out_evals`` of launch/_common.py,
which train_multi_worker.py also has, off by default): every ``--eval-every`` steps the
chief (worker 0 when the cluster has no ``chief`` task) evaluates the weights on the first
``--eval-examples`` test images and reports an ``eval`` event with the training time so far
(evaluation time left out). The parameter server scripts report the same events, so
``ddlkit.lessons.ps.compare_runs`` can put synchronous and asynchronous training on one time axis.

Lines that exist only for distribution carry a ``[dist]`` comment.

Launch:
    ddlkit launch --strategy multi_worker -n 2 launch/train_sync_eval.py -- --epochs 1

By hand: as launch/train_multi_worker.py (one shell per worker, TF_CONFIG each).
"""

from __future__ import annotations

import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import tensorflow as tf
from _common import add_eval_flags, held_out_evals, parse_args, report, test_accuracy

from ddlkit import data, metrics, models
from ddlkit.data import pipeline


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=lambda p: add_eval_flags(p, every=50))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # [dist] reads TF_CONFIG
    replicas = strategy.num_replicas_in_sync  # [dist]
    cluster = strategy.cluster_resolver.cluster_spec().as_dict()  # [dist] every task's address
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", [])) or 1  # [dist]
    # [dist] the chief evaluates: the `chief` task, else worker 0 (the strategy's own answer)
    is_first = strategy.extended.should_checkpoint
    global_batch = args.batch_size * replicas  # [dist] per-replica batch x replicas
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.for_strategy(  # [dist] each worker reads its own shard
        strategy, x_train, y_train, per_replica_batch=args.batch_size, repeat=True
    )
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    with strategy.scope():  # [dist] variables are mirrored on every replica
        model = models.for_dataset(args.dataset, seed=args.seed)
        models.compile_classifier(  # steps_per_execution: see _common.STEPS_PER_EXECUTION
            model,
            args.lr * replicas,  # [dist] lr scales with batch
            steps_per_execution=args.steps_per_execution,
        )
    reporter = metrics.KerasReporter(batch_size=global_batch // workers)
    callbacks = [reporter]
    if is_first:  # [dist] the chief evaluates
        callbacks += held_out_evals(reporter, args, x_test, y_test, global_batch)
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    # Evaluating workers count the seconds of training steps only (as the PS chief does);
    # the others the whole fit call.
    seconds = callbacks[-1].train_seconds if len(callbacks) > 1 else time.perf_counter() - start
    accuracy, tested = test_accuracy(model, args, x_test, y_test)  # --test-examples
    examples = args.epochs * steps * global_batch
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": examples / seconds,  # all workers together
            "steps": args.epochs * steps,
            "replicas": replicas,
            "dataset": args.dataset,
            "epochs": args.epochs,
            "global_batch": global_batch,
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
