"""Synchronous training (MultiWorkerMirroredStrategy) that reports a time-to-accuracy curve.

launch/train_multi_worker.py plus one callback: every ``--eval-every`` steps worker-0
evaluates the weights on the first ``--eval-examples`` test images and reports an ``eval``
event with the training time so far (evaluation time left out). The parameter server
script reports the same events, so ``ddlkit.staleness`` can put synchronous and
asynchronous training on one time axis.

Lines that exist only for distribution carry a ``[dist]`` comment.

Launch:
    ddlkit launch --strategy multi_worker -n 2 launch/train_sync_eval.py -- --epochs 1

By hand: as launch/train_multi_worker.py (one shell per worker, TF_CONFIG each).
"""

from __future__ import annotations

import argparse
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import tensorflow as tf
from _common import parse_args, report, test_accuracy

from ddlkit import data, metrics, models
from ddlkit.data import pipeline


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    parser.add_argument("--eval-examples", type=int, default=2000, help="held-out test images")


class EvalEvents(tf.keras.callbacks.Callback):
    """Evaluate a local copy every ``every`` steps; report ``eval`` events via ``source``."""

    def __init__(self, source, dataset: str, x, y, every: int, global_batch: int, seed: int):
        super().__init__()
        self.source, self.every, self.global_batch = source, every, global_batch
        self.data = pipeline.make_dataset(x, y, batch_size=500, shuffle=False)
        # Built here, outside fit's strategy scope: variables made inside it on worker-0
        # alone would be broadcast to workers that never make them (a collective hang).
        self.local = models.for_dataset(dataset, seed=seed)
        self.logits = tf.function(lambda images: self.local(images, training=False))
        self.step = 0
        self.eval_seconds = 0.0
        self.train_seconds = 0.0  # from the first to the last step, evaluation excluded

    def evaluate(self) -> None:
        start = time.perf_counter()
        self.local.set_weights(self.model.get_weights())
        losses, hits = [], []
        for images, labels in self.data:
            logits = self.logits(images)
            losses.append(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
            hits.append(tf.equal(tf.argmax(logits, 1), labels))
        loss = float(tf.reduce_mean(tf.concat(losses, 0)))
        accuracy = float(tf.reduce_mean(tf.cast(tf.concat(hits, 0), tf.float32)))
        self.source.reporter.event(
            "eval",
            step=self.step,
            examples=self.step * self.global_batch,
            train_seconds=start - self.began - self.eval_seconds,
            loss=loss,
            accuracy=accuracy,
        )
        self.eval_seconds += time.perf_counter() - start

    def on_train_begin(self, logs=None) -> None:
        self.began = time.perf_counter()
        self.evaluate()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.step += 1
        if self.step % self.every == 0:
            self.evaluate()

    def on_train_end(self, logs=None) -> None:
        self.train_seconds = time.perf_counter() - self.began - self.eval_seconds
        if self.step % self.every:
            self.evaluate()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # [dist] reads TF_CONFIG
    replicas = strategy.num_replicas_in_sync  # [dist]
    workers = strategy.extended._num_workers  # [dist]
    is_first = strategy.cluster_resolver.task_id in (0, None)  # [dist] worker-0 evaluates
    global_batch = args.batch_size * replicas  # [dist] per-replica batch x replicas
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.for_strategy(  # [dist] each worker reads its own shard
        strategy, x_train, y_train, per_replica_batch=args.batch_size, repeat=True
    )
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    with strategy.scope():  # [dist] variables are mirrored on every replica
        model = models.for_dataset(args.dataset, seed=args.seed)
        models.compile_classifier(model, args.lr * replicas)  # [dist] lr scales with batch
    reporter = metrics.KerasReporter(batch_size=global_batch // workers)
    callbacks = [reporter]
    if is_first and args.eval_every:  # [dist]
        x_eval, y_eval = x_test[: args.eval_examples], y_test[: args.eval_examples]
        callbacks.append(
            EvalEvents(
                reporter, args.dataset, x_eval, y_eval, args.eval_every, global_batch, args.seed
            )
        )
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    # Evaluating workers count the seconds of training steps only (as the PS chief does);
    # the others the whole fit call.
    seconds = callbacks[-1].train_seconds if len(callbacks) > 1 else time.perf_counter() - start
    accuracy = test_accuracy(model, args.dataset, x_test, y_test, args.seed)
    examples = args.epochs * steps * global_batch
    report(
        {
            "test_accuracy": accuracy,
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
