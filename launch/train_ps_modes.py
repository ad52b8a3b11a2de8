"""Synchronous and Downpour parameter-server training on TensorFlow's own PS machinery.

The same cluster as launch/train_parameter_server.py (a chief, ps tasks holding the
variables, workers running what the chief schedules), two other update rules:

- ``--mode sync`` (MXNet's ``dist_sync``; TensorFlow 2 has no synchronous PS of its own):
  every round each worker pushes its gradient into accumulator variables on the ps tasks;
  when every worker has pushed, one update (their mean) is applied; only then does the next
  round start, so every worker reads the new weights. Gradients are never stale. A second
  push from a worker that already pushed this round is refused, as ``dist_sync`` waits for
  every worker (TensorFlow 1's ``SyncReplicasOptimizer`` took any ``replicas_to_aggregate``
  pushes instead); notebook 03a's ``workers/ps_rules.py`` is the same round without the refusal.
- ``--mode downpour`` (Dean et al. 2012): each worker keeps a local copy of the weights,
  takes plain SGD steps on it (``--local-lr``), pushes the gradients it accrued every
  ``--n-push`` steps (the ps applies them with the optimizer at once, no waiting) and
  pulls fresh weights every ``--n-fetch`` steps. Its evaluations land on the first period
  boundary at or after each multiple of ``--eval-every``.

Asynchronous training (MXNet's ``dist_async``) is launch/train_parameter_server.py.
Steps count batches of ``--batch-size`` (one worker's step), as there. The chief
evaluates every ``--eval-every`` steps (``eval`` events, training time without
evaluation) and reports staleness (updates by other workers between the weights a
gradient was computed on and its push) and how often each worker pushed and fetched.
Variables are whole (no partitioner), placed on the ps tasks in turn.

Lines that exist only for distribution carry a ``[dist]`` comment. The result's
``global_batch`` is the examples behind one update of the shared weights: one batch per
worker (sync), ``--n-push`` batches (downpour).

Launch:
    ddlkit launch --strategy parameter_server -n 2 --ps 1 launch/train_ps_modes.py \\
        -- --mode sync --steps-per-epoch 200

By hand: as launch/train_parameter_server.py (TF_CONFIG per task; kill the servers after).
"""

from __future__ import annotations

import argparse
import math
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import numpy as np
import tensorflow as tf
from _common import final_test_set, parse_args, report
from train_parameter_server import Evaluator, serve

from ddlkit import data, metrics, models
from ddlkit.data import pipeline
from ddlkit.errors import ConfigError
from ddlkit.lessons import ps

MAX_PERIOD = 32  # Downpour steps unrolled into one scheduled function
# Seconds a synchronous round waits for every worker's push before it gives up on one. A
# bound in time, not in tries: a refused push returns in milliseconds, and 50 tries ran out
# (suite run, both cores busy) while the other worker was still preparing its first push.
ROUND_TIMEOUT = 120.0


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("sync", "downpour"), default="sync")
    parser.add_argument("--n-push", type=int, default=4, help="downpour: steps between pushes")
    parser.add_argument("--n-fetch", type=int, default=8, help="downpour: steps between pulls")
    parser.add_argument("--local-lr", type=float, default=0.05, help="downpour: local SGD rate")
    parser.add_argument("--report-every", type=int, default=20, help="steps per join/report")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between evals (0: none)")
    parser.add_argument("--eval-examples", type=int, default=2000, help="held-out test images")


def check_args(args: argparse.Namespace) -> None:
    if min(args.n_push, args.n_fetch, args.report_every, args.eval_examples) < 1:
        raise ConfigError(
            f"--n-push {args.n_push}, --n-fetch {args.n_fetch}, --report-every "
            f"{args.report_every}, --eval-examples {args.eval_examples}: each must be >= 1. "
            f"Fix: e.g. --n-push 4 --n-fetch 8 --report-every 20 --eval-examples 2000."
        )
    if args.mode == "downpour" and math.lcm(args.n_push, args.n_fetch) > MAX_PERIOD:
        raise ConfigError(
            f"--n-push {args.n_push} and --n-fetch {args.n_fetch} repeat every "
            f"{math.lcm(args.n_push, args.n_fetch)} steps, more than the {MAX_PERIOD} one "
            f"scheduled function unrolls. Fix: choose values whose least common multiple is "
            f"<= {MAX_PERIOD}, e.g. --n-push 4 --n-fetch 8."
        )


def worker_one_hot(workers: int):  # [dist]
    """[0, 1, 0, ...]: which worker runs this function (called on a worker)."""
    index = tf.distribute.coordinator.experimental_get_current_worker_index()  # [dist]
    return tf.one_hot(index, workers, dtype=tf.int64), index


def counter(strategy, shape=()):  # [dist] an int64 counter on a ps task
    with strategy.scope():  # [dist]
        return tf.Variable(tf.zeros(shape, tf.int64), trainable=False)


def batch_loss(labels, logits):
    """The mean loss of one worker's batch: per-example losses, averaged as in a custom loop."""
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.nn.compute_average_loss(per_example)  # [dist] one replica: this batch's mean


class SyncPS:
    """A synchronous parameter server: one update per round, built from one push per worker.

    ``push`` (scheduled on workers) adds the worker's gradient to ``accumulators`` that
    live beside the weights on the ps tasks and marks the worker in ``pushed``; a worker
    that already pushed this round refuses (the chief schedules again until every worker
    has pushed). ``apply`` then applies the mean, clears the accumulators and counts the
    round in ``applies``. The chief joins between the two, so no worker reads weights
    while a round is open: gradients are never stale (measured, not assumed).
    """

    def __init__(self, strategy, coordinator, model, optimizer, workers: int) -> None:
        self.strategy, self.coordinator = strategy, coordinator
        self.model, self.optimizer, self.workers = model, optimizer, workers
        self.accumulators = []
        for v in model.trainable_variables:
            with strategy.scope(), strategy.extended.colocate_vars_with(v):  # [dist] v's ps
                self.accumulators.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False))
        self.pushed = counter(strategy, [workers])  # [dist] this round: who pushed
        self.pushes = counter(strategy, [workers])  # [dist] all rounds: pushes by worker
        self.applies = counter(strategy)  # [dist] updates applied (= rounds)
        self.refused = 0  # pushes scheduled on a worker that had pushed this round already
        self.push_fn = tf.function(self._push)
        self.apply_fn = tf.function(lambda: strategy.run(self._apply))  # [dist]

    def _push(self, iterator):
        images, labels = next(iterator)
        return self.strategy.run(self._push_step, args=(images, labels))  # [dist] on a worker

    def _push_step(self, images, labels):
        me, index = worker_one_hot(self.workers)  # [dist]
        variables = self.model.trainable_variables

        def push():
            before = self.applies.read_value()
            with tf.control_dependencies([before]):  # read the weights after the counter
                with tf.GradientTape() as tape:
                    loss = batch_loss(labels, self.model(images, training=True))
                grads = tape.gradient(loss, variables)
            with tf.control_dependencies(grads):
                stale = self.applies.read_value() - before  # updates since the read
            for accumulator, grad in zip(self.accumulators, grads, strict=True):
                accumulator.assign_add(grad)  # [dist] push: add into the ps's accumulator
            self.pushed.assign_add(me)  # [dist]
            self.pushes.assign_add(me)  # [dist]
            return tf.constant(1, tf.int64), stale, loss

        def refuse():  # this worker already pushed this round
            return (
                tf.constant(0, tf.int64),
                tf.constant(0, tf.int64),
                tf.constant(np.nan, tf.float32),
            )

        return tf.cond(tf.equal(self.pushed[index], 0), push, refuse)  # [dist]

    def _apply(self):
        mean = [a.read_value() / self.workers for a in self.accumulators]  # [dist] all pushes
        self.optimizer.apply_gradients(zip(mean, self.model.trainable_variables, strict=True))
        for accumulator in self.accumulators:
            accumulator.assign(tf.zeros_like(accumulator))  # [dist] empty for the next round
        self.pushed.assign(tf.zeros_like(self.pushed))  # [dist]
        self.applies.assign_add(1)  # [dist]

    def push_all(self, iterator) -> list[tuple[int, float]]:
        """Schedule pushes until every worker has pushed once: (staleness, loss) of each."""
        got: list[tuple[int, float]] = []
        deadline = time.monotonic() + ROUND_TIMEOUT
        while True:
            remote = [
                self.coordinator.schedule(self.push_fn, args=(iterator,))  # [dist] any worker
                for _ in range(self.workers - len(got))
            ]
            self.coordinator.join()  # [dist] every scheduled push has run
            for accepted, stale, loss in (r.fetch() for r in remote):
                if accepted:
                    got.append((int(stale), float(loss)))
                else:
                    self.refused += 1
            if len(got) == self.workers:
                return got
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"only {len(got)} of {self.workers} workers pushed in {ROUND_TIMEOUT:.0f} "
                    f"s: a worker is gone, and a synchronous round waits for every worker (as "
                    f"MXNet's dist_sync does). Fix: restart the job with the workers it has."
                )
            time.sleep(0.01)  # refused: leave the core to a worker still busy elsewhere

    def apply(self) -> None:
        self.coordinator.schedule(self.apply_fn)  # [dist] one update on the ps tasks
        self.coordinator.join()  # [dist] before anyone reads the weights again

    def run(self, iterator, budget: int) -> tuple[int, list[int], list[float]]:
        """Rounds until ``budget`` steps (batches) are done: (steps, staleness, losses)."""
        done, stale, losses = 0, [], []
        while done < budget:
            pushes = self.push_all(iterator)
            self.apply()
            stale += [s for s, _ in pushes]
            losses += [loss for _, loss in pushes]
            done += len(pushes)
        return done, stale, losses


def forward(model, params, images):
    """``model(images)`` on the tensors ``params`` (``model.trainable_variables`` order)
    instead of the model's variables: a Downpour worker's local copy. Conv2D, Dense and
    weightless layers (the kit's CNNs) only."""
    params, h = iter(params), images
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.Conv2D):
            h = tf.nn.conv2d(h, next(params), layer.strides, layer.padding.upper())
            h = layer.activation(h + next(params))
        elif isinstance(layer, tf.keras.layers.Dense):
            h = layer.activation(tf.matmul(h, next(params)) + next(params))
        elif not layer.weights:
            h = layer(h)
        else:
            raise ConfigError(
                f"layer {layer.name!r} ({type(layer).__name__}) has weights that forward() "
                f"cannot apply. Fix: use a model of Conv2D, Dense and weightless layers."
            )
    return h


class Downpour:
    """Downpour SGD: local steps on a local copy, pushes every n_push, pulls every n_fetch.

    One scheduled function is one period of lcm(n_push, n_fetch) steps on one worker: it
    pulls at its start (step 0 is a multiple of n_fetch) and pushes at its end, so the
    local copy (tensors in that function) is never needed across two functions. Each push
    is applied by the optimizer on the ps tasks at once (no waiting for other workers).
    """

    def __init__(self, strategy, coordinator, model, optimizer, workers, n_push, n_fetch, lr):
        self.strategy, self.coordinator = strategy, coordinator
        self.model, self.optimizer, self.workers = model, optimizer, workers
        self.n_push, self.n_fetch, self.local_lr = n_push, n_fetch, lr
        self.period = math.lcm(n_push, n_fetch)
        self.pushes = counter(strategy, [workers])  # [dist] by worker
        self.fetches = counter(strategy, [workers])  # [dist] by worker
        self.steps = counter(strategy, [workers])  # [dist] local steps by worker
        self.period_fn = tf.function(self._period)

    def _period(self, iterator):
        batches = [next(iterator) for _ in range(self.period)]
        return self.strategy.run(self._period_step, args=(batches,))  # [dist] on a worker

    def _period_step(self, batches):
        me, _ = worker_one_hot(self.workers)  # [dist]
        variables = self.model.trainable_variables
        stale, losses, accrued = [], [], None
        for t, (images, labels) in enumerate(batches):
            if t % self.n_fetch == 0:  # pull: the local copy becomes the ps's weights
                fetched_at = self.optimizer.iterations.read_value()  # [dist] updates so far
                with tf.control_dependencies([fetched_at]):
                    local = [tf.identity(v.read_value()) for v in variables]  # [dist] pull
                self.fetches.assign_add(me)  # [dist]
                own = 0  # this worker's pushes since the pull
            with tf.GradientTape() as tape:
                tape.watch(local)
                loss = batch_loss(labels, forward(self.model, local, images))
            grads = tape.gradient(loss, local)
            losses.append(loss)
            accrued = (
                grads if accrued is None else [a + g for a, g in zip(accrued, grads, strict=True)]
            )
            local = [w - self.local_lr * g for w, g in zip(local, grads, strict=True)]
            self.steps.assign_add(me)  # [dist]
            if (t + 1) % self.n_push == 0:  # push what accrued since the last push
                with tf.control_dependencies(accrued):  # [dist] others' updates since the pull
                    stale.append(self.optimizer.iterations.read_value() - fetched_at - own)
                self.optimizer.apply_gradients(zip(accrued, variables, strict=True))  # [dist]
                self.pushes.assign_add(me)  # [dist]
                own, accrued = own + 1, None
        return tf.stack(stale), tf.reduce_mean(tf.stack(losses))

    def run(self, iterator, budget: int) -> tuple[int, list[int], list[float]]:
        """Whole periods (on any free worker) for ``budget`` steps, at least one:
        (steps, staleness, losses)."""
        count = max(1, budget // self.period)
        remote = [
            self.coordinator.schedule(self.period_fn, args=(iterator,))  # [dist]
            for _ in range(count)
        ]
        self.coordinator.join()  # [dist]
        fetched = [r.fetch() for r in remote]
        stale = [int(s) for values, _ in fetched for s in values]
        return count * self.period, stale, [float(loss) for _, loss in fetched]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags)
    check_args(args)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()  # [dist]
    if resolver.task_type in ("ps", "worker"):  # [dist]
        return serve(resolver)  # [dist]
    workers = resolver.cluster_spec().num_tasks("worker")  # [dist]
    strategy = tf.distribute.ParameterServerStrategy(resolver)  # [dist] whole variables
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # [dist]
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    per_epoch = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), args.batch_size)
    total = args.epochs * per_epoch
    # An update built from k batches takes k times the rate: notebook 01's linear rule for
    # SGD; for Adam, which divides by the gradients' own scale, a choice (the same in both
    # modes), not a rule.
    per_update = workers if args.mode == "sync" else args.n_push  # batches behind one update
    lr = args.lr * per_update
    with strategy.scope():  # [dist] weights and optimizer slots on the ps tasks
        model = models.for_dataset(args.dataset, seed=args.seed)
        # legacy: TF's PS tutorial recommends it for speed, as in
        # launch/train_parameter_server.py; the new optimizers train under PS as well.
        optimizer = models.make_optimizer("adam", lr, legacy=True)  # [speed]
        optimizer.iterations  # noqa: B018  [dist] the update counter: created now, on a ps
    if args.mode == "sync":
        runner = SyncPS(strategy, coordinator, model, optimizer, workers)
    else:
        runner = Downpour(
            strategy, coordinator, model, optimizer, workers, args.n_push, args.n_fetch,
            args.local_lr,
        )  # fmt: skip
    # The whole training set as one dataset (each worker shuffles its own copy in its own
    # order), sent to the workers as a dataset graph. A function that captures the arrays
    # instead (distribute_datasets_from_function) took several times longer to start.
    train = pipeline.dataset_fn(x_train, y_train, global_batch=args.batch_size)(
        tf.distribute.InputContext()  # one pipeline, one replica: the whole batch
    )
    iterator = iter(coordinator.create_per_worker_dataset(train))  # [dist] a copy on each worker
    evaluate = Evaluator(args.dataset, args.seed)
    x_eval, y_eval = x_test[: args.eval_examples], y_test[: args.eval_examples]
    reporter = metrics.Reporter()
    reporter.event(
        "train_begin", epochs=args.epochs, steps=per_epoch, batch_size=args.batch_size,
        every=args.report_every, initial_step=0, workers=workers, mode=args.mode,
    )  # fmt: skip
    all_stale: list[int] = []
    losses: list[float] = []
    evals: list[dict] = []
    done, train_seconds = 0, 0.0
    next_eval = 0 if args.eval_every > 0 else math.inf
    while True:
        if done >= next_eval or (args.eval_every > 0 and done >= total):
            loss, accuracy = evaluate(model, x_eval, y_eval)
            row = {"step": done, "examples": done * args.batch_size}
            row |= {"train_seconds": train_seconds, "loss": loss, "accuracy": accuracy}
            evals.append(row)
            reporter.event("eval", **row)
            print(f"step {done}: held-out acc {accuracy:.4f}, {train_seconds:.1f} s", flush=True)
            next_eval = (done // args.eval_every + 1) * args.eval_every  # next multiple
        if done >= total:
            break
        start = time.perf_counter()
        budget = min(args.report_every, total - done, next_eval - done)
        steps, stale, step_losses = runner.run(iterator, budget)
        elapsed = time.perf_counter() - start
        train_seconds += elapsed
        done += steps
        all_stale += stale
        losses.append(float(np.mean(step_losses)))
        summary = ps.summarize(stale) if stale else None
        reporter.step(
            step=done, epoch=(done - 1) // per_epoch, loss=losses[-1], accuracy=None,
            batch_size=args.batch_size, step_time=elapsed / steps, steps=steps,
            metrics={"staleness_mean": summary.mean, "staleness_max": summary.max}
            if summary else {},
        )  # fmt: skip
    reporter.event("train_end", steps=done)
    x_final, y_final = final_test_set(args, x_test, y_test)  # --test-examples
    _, test_accuracy = evaluate(model, x_final, y_final)
    counts = {"updates": int(optimizer.iterations.numpy())}  # [dist] read from its ps
    if args.mode == "sync":
        counts |= {"applies": int(runner.applies.numpy())}
        counts |= {"pushes_by_worker": runner.pushes.numpy().tolist()}
        counts |= {"refused_pushes": runner.refused}
    else:
        counts |= {"pushes_by_worker": runner.pushes.numpy().tolist()}
        counts |= {"fetches_by_worker": runner.fetches.numpy().tolist()}
        counts |= {"steps_by_worker": runner.steps.numpy().tolist()}
    print(f"{args.mode}: {counts}", flush=True)
    report(
        {
            "mode": args.mode,
            "test_accuracy": test_accuracy,
            "test_examples": len(x_final),
            "train_seconds": train_seconds,
            "examples_per_sec": done * args.batch_size / train_seconds,
            "steps": done,
            "dataset": args.dataset,
            "epochs": args.epochs,
            "global_batch": args.batch_size * per_update,  # examples behind one update
            "replicas": workers,
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "staleness": ps.summarize(all_stale).as_dict(),
            "staleness_counts": ps.counts(all_stale),
            "evals": evals,
            "counts": counts,
            "n_push": args.n_push if args.mode == "downpour" else None,
            "n_fetch": args.n_fetch if args.mode == "downpour" else None,
        }
    )
    reporter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
