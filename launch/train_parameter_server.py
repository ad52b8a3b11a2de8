"""Train a CNN with ParameterServerStrategy: a coordinator, parameter servers and workers.

One script for every role. The ps and worker tasks only start a TensorFlow server from
their TF_CONFIG and wait in ``join()``: they run whatever the coordinator sends them. The
chief is the coordinator: it builds the model with its variables on the ps tasks (those of
``--min-shard-bytes`` or more sharded across them, the others whole, in turn), and a
``ClusterCoordinator`` ``schedule()``s training steps, up to ``--steps-per-execution`` of
them per scheduled function (the same number in each: ``ddlkit.lessons.ps.call_size``), which run on
whichever worker is free, and ``join()``s every ``--report-every`` steps and at each
evaluation.

Workers update the shared variables without waiting for each other (asynchronous
training, like MXNet's ``dist_async`` or Downpour SGD). Each step measures its gradient
*staleness*: how many updates by other workers landed between reading the weights and
applying its gradients. The chief evaluates the weights on a fixed held-out subset every
``--eval-every`` steps and reports it as an ``eval`` event, with the training time so far
(evaluation time excluded), for a time-to-accuracy curve.

Lines that exist only for distribution carry a ``[dist]`` comment.

Launch (servers never exit by themselves: the launcher ends ps and workers after the chief):
    ddlkit launch --strategy parameter_server -n 2 --ps 2 launch/train_parameter_server.py \\
        -- --epochs 1

By hand, one shell per task (chief, ps-0, ps-1, worker-0, worker-1), each with
TF_USE_LEGACY_KERAS=1 and the same cluster, its own task:
    TF_CONFIG='{"cluster": {"chief": ["localhost:2220"], "ps": ["localhost:2221",
                "localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]},
                "task": {"type": "ps", "index": 0}}' python launch/train_parameter_server.py
"""

from __future__ import annotations

import argparse
import re
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import numpy as np
import tensorflow as tf
from _common import final_test_set, parse_args, report

from ddlkit import data, metrics, models
from ddlkit.data import pipeline
from ddlkit.errors import ConfigError
from ddlkit.lessons import ps

# Steps per scheduled function. Each scheduled function is a round trip chief -> worker, and
# a join waits for the queue to drain: TensorFlow's PS tutorial calls packing steps into one
# function "usually necessary ... to achieve optimal performance". Every step still reads the
# weights from the ps tasks and sends its gradients back.
STEPS_PER_CALL = 10


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report-every", type=int, default=20, help="steps per join/report")
    parser.add_argument(
        "--steps-per-execution",
        type=int,
        default=STEPS_PER_CALL,
        help="most training steps per scheduled function (one round trip chief-worker); "
        "fewer when that many do not divide --report-every and --eval-every",
    )
    parser.add_argument("--eval-every", type=int, default=100, help="steps between evals (0: none)")
    parser.add_argument("--eval-examples", type=int, default=2000, help="held-out test images")
    parser.add_argument(
        "--min-shard-bytes", type=int, default=256 << 10, help="smallest variable shard"
    )


def serve(resolver) -> int:  # [dist] ps and worker tasks: a server that runs what it is sent
    server = tf.distribute.Server(  # [dist]
        resolver.cluster_spec(),  # [dist]
        job_name=resolver.task_type,  # [dist]
        task_index=resolver.task_id,  # [dist]
        protocol=resolver.rpc_layer or "grpc",  # [dist]
        start=True,  # [dist]
    )  # [dist]
    print(f"{resolver.task_type}-{resolver.task_id}: server started, waiting", flush=True)
    server.join()  # [dist] never returns: the launcher ends this process
    return 0


def logical_variables(model) -> list[tuple[str, list]]:
    """The model's variables as (name, shards): a variable split across ps tasks is listed
    by TensorFlow as ``name/part_0``, ``name/part_1``, ... (split along axis 0)."""
    grouped: dict[str, list] = {}
    for v in model.variables:
        name = re.sub(r"(/part_\d+)?:\d+$", "", v.name)  # [dist] shards of one variable
        grouped.setdefault(name, []).append(v)
    return list(grouped.items())


def placement(model) -> list[dict]:
    """Where each model variable lives: one entry per variable, one shard per ps task used."""
    return [
        {
            "name": name,
            "shape": list(map(int, parts[0].shape))
            if len(parts) == 1
            else [sum(int(p.shape[0]) for p in parts), *map(int, parts[0].shape[1:])],
            "shards": [{"device": p.device, "shape": list(map(int, p.shape))} for p in parts],
        }
        for name, parts in logical_variables(model)
    ]


def weights(model) -> list[np.ndarray]:
    """The current weights, fetched from the ps tasks, shards joined again."""
    return [
        parts[0].numpy() if len(parts) == 1 else np.concatenate([p.numpy() for p in parts])
        for _, parts in logical_variables(model)
    ]


def make_strategy(resolver, min_shard_bytes: int):  # [dist]
    """ParameterServerStrategy whose variables of ``min_shard_bytes`` or more are split
    across the ps tasks (MinSizePartitioner: ceil(bytes / min_shard_bytes) shards along the
    first axis, at most one per ps, so a shard may be smaller than ``min_shard_bytes``)."""
    num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))  # [dist]
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(  # [dist]
        min_shard_bytes=min_shard_bytes,
        max_shards=num_ps,  # [dist]
    )  # [dist]
    return tf.distribute.ParameterServerStrategy(  # [dist]
        resolver,
        variable_partitioner=partitioner,  # [dist]
    )  # [dist]


def make_train_step(strategy, model, optimizer):
    """A function that runs ``n`` steps on one worker and returns, per step, (staleness,
    loss, batch accuracy). ``n`` > 1 (``--steps-per-execution``) saves the chief's round
    trip to a worker per step; the weights still come from the ps tasks every step.

    Staleness: the optimizer's update counter (on a ps) is read before the weights and
    again once the gradients exist; the difference is how many updates by other workers
    landed in between, i.e. how many versions old the weights behind these gradients are.
    """
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True,
        reduction=tf.keras.losses.Reduction.NONE,  # [dist] averaged below
    )

    def step_fn(images, labels):
        before = optimizer.iterations.read_value()  # [dist] updates so far
        with tf.control_dependencies([before]):  # [dist] read the weights after the counter
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits))  # [dist] this batch
            grads = tape.gradient(loss, model.trainable_variables)
        with tf.control_dependencies(grads):  # [dist] read the counter once gradients exist
            stale = optimizer.iterations.read_value() - before  # [dist] others' updates
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        hits = tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32)
        return stale, loss, tf.reduce_mean(hits)

    @tf.function
    def train_steps(iterator, n: int):  # n steps in one scheduled function (a Python int)
        # A Python loop: traced n times into one graph (unrolled), as TensorFlow's PS tutorial
        # packs steps, not a tf.range loop (a While op, whose body, with its reads from and
        # updates to the ps, runs as a function of its own every iteration).
        steps = []
        for _ in range(n):
            images, labels = next(iterator)
            steps.append(strategy.run(step_fn, args=(images, labels)))  # [dist] on a free worker
        dtypes = (tf.int64, tf.float32, tf.float32)
        # per step: staleness, loss, batch accuracy
        return tuple(tf.stack([tf.cast(s[k], d) for s in steps]) for k, d in enumerate(dtypes))

    return train_steps


class Evaluator:
    """Held-out loss and accuracy of the shared weights, on a local copy in the chief."""

    def __init__(self, dataset: str, seed: int) -> None:
        self.local = models.for_dataset(dataset, seed=seed)
        models.compile_classifier(self.local)

    def __call__(self, model, x, y) -> tuple[float, float]:
        self.local.set_weights(weights(model))  # fetched from the ps tasks
        data_ = pipeline.make_dataset(x, y, batch_size=500, shuffle=False)
        loss, accuracy = self.local.evaluate(data_, verbose=0)
        return float(loss), float(accuracy)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=_flags)
    per_call = args.steps_per_execution
    if per_call < 1:
        raise ConfigError(f"--steps-per-execution {per_call}: need >= 1. Fix: e.g. 10.")
    if args.report_every < 1 or args.eval_every < 0 or args.eval_examples < 1:
        raise ConfigError(
            f"--report-every {args.report_every}, --eval-every {args.eval_every}, "
            f"--eval-examples {args.eval_examples}: need >= 1, >= 0 and >= 1. Fix: e.g. "
            f"--report-every 20 --eval-every 100 --eval-examples 2000."
        )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()  # [dist]
    if resolver.task_type in ("ps", "worker"):  # [dist]
        return serve(resolver)  # [dist]
    cluster = resolver.cluster_spec().as_dict()  # [dist]
    strategy = make_strategy(resolver, args.min_shard_bytes)  # [dist]
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # [dist]

    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    per_epoch = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), args.batch_size)
    total_steps = args.epochs * per_epoch
    with strategy.scope():  # [dist] variables are created on the ps tasks
        model = models.for_dataset(args.dataset, seed=args.seed)
        # Any tf-keras optimizer trains under PS (notebook 03's script uses the new Adam); TF's
        # PS tutorial recommends legacy ones for speed (fewer "hotspot" variables every ps
        # reads each step).
        optimizer = models.make_optimizer("adam", args.lr, legacy=True)  # [speed]
        optimizer.iterations  # noqa: B018  [dist] the update counter: created now, on a ps
    where = placement(model)
    for v in where:
        shards = ", ".join(f"{s['device']} {s['shape']}" for s in v["shards"])
        print(f"variable {v['name']} {v['shape']}: {shards}", flush=True)
    train_step = make_train_step(strategy, model, optimizer)
    # The whole training set as one dataset (each worker shuffles its own copy in its own
    # order), sent to the workers as a dataset graph. A function that captures the arrays
    # instead (distribute_datasets_from_function) took several times longer to start.
    train = pipeline.dataset_fn(x_train, y_train, global_batch=args.batch_size)(
        tf.distribute.InputContext()  # one pipeline, one replica: the whole batch
    )
    iterator = iter(coordinator.create_per_worker_dataset(train))  # [dist] a copy on each worker
    evaluate = Evaluator(args.dataset, args.seed)
    x_eval, y_eval = x_test[: args.eval_examples], y_test[: args.eval_examples]
    workers = len(cluster["worker"])
    size = ps.call_size(per_call, args.report_every, args.eval_every, workers)  # one trace
    reporter = metrics.Reporter()
    reporter.event(
        "train_begin",
        epochs=args.epochs,
        steps=per_epoch,
        batch_size=args.batch_size,
        every=args.report_every,
        initial_step=0,
        workers=workers,
        ps=len(cluster["ps"]),
    )
    all_stale: list[int] = []
    interval_losses: list[float] = []
    evals: list[dict] = []
    done, train_seconds = 0, 0.0
    next_eval = 0 if args.eval_every else total_steps + 1
    while True:
        if done == next_eval or (args.eval_every and done == total_steps):
            loss, accuracy = evaluate(model, x_eval, y_eval)
            row = {"step": done, "examples": done * args.batch_size}
            row |= {"train_seconds": train_seconds, "loss": loss, "accuracy": accuracy}
            evals.append(row)
            reporter.event("eval", **row)
            print(f"step {done}: held-out acc {accuracy:.4f}, {train_seconds:.1f} s", flush=True)
            next_eval = done + args.eval_every
        if done == total_steps:
            break
        k = min(args.report_every, total_steps - done, next_eval - done)
        start = time.perf_counter()
        chunks = ps.split_steps(k, size)  # [dist] functions of `size` steps, any free worker
        remote = [coordinator.schedule(train_step, args=(iterator, n)) for n in chunks]  # [dist]
        coordinator.join()  # [dist] wait for every scheduled step (a lost worker's are rerun)
        elapsed = time.perf_counter() - start
        train_seconds += elapsed
        fetched = [
            step for r in remote for step in zip(*r.fetch(), strict=True)
        ]  # [dist] RemoteValues
        stale = [int(s) for s, _, _ in fetched]
        all_stale += stale
        interval_losses.append(float(np.mean([float(loss) for _, loss, _ in fetched])))
        done += k
        summary = ps.summarize(stale)
        reporter.step(
            step=done,
            epoch=(done - 1) // per_epoch,
            loss=interval_losses[-1],
            accuracy=float(np.mean([float(c) for _, _, c in fetched])),
            batch_size=args.batch_size,
            step_time=elapsed / k,
            steps=k,
            metrics={"staleness_mean": summary.mean, "staleness_max": summary.max},
        )
    reporter.event("train_end", steps=done)
    x_final, y_final = final_test_set(args, x_test, y_test)  # --test-examples
    _, test_accuracy = evaluate(model, x_final, y_final)
    report(
        {
            "test_accuracy": test_accuracy,
            "test_examples": len(x_final),
            "train_seconds": train_seconds,
            "examples_per_sec": done * args.batch_size / train_seconds,
            "steps": done,
            "dataset": args.dataset,
            "epochs": args.epochs,
            "global_batch": args.batch_size,  # one worker's batch per step
            "replicas": len(cluster["worker"]),
            "ps": len(cluster["ps"]),
            "first_loss": interval_losses[0],
            "last_loss": interval_losses[-1],
            "staleness": ps.summarize(all_stale).as_dict(),
            "staleness_counts": ps.counts(all_stale),
            "evals": evals,
            "placement": where,
        }
    )
    reporter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
