"""Train the user's own model under one strategy: the worker of ``dk.experiment``.

The user's file is imported unchanged in every worker (``build_model()``, ``dataset(batch_size,
input_context)``, optionally ``eval_dataset(batch_size)``: ddlkit/experiments/spec.py); this
script writes the strategy around it, one function per strategy, each the API the course
teaches. Lines there because training is distributed end with ``# [dist]``.

    ddlkit experiment my_model.py --strategies multi_worker horovod --workers 1 2

By hand, the MultiWorkerMirrored case in two shells (TF_CONFIG differs in the index):
    export TF_USE_LEGACY_KERAS=1
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                "task": {"type": "worker", "index": 0}}' \\
        python launch/train_user.py --file my_model.py --strategy multi_worker --steps 50
"""

from __future__ import annotations

import argparse
import os
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import tensorflow as tf
from _common import report  # [speed] _common also sets TF_CPU_ALLOCATOR_USE_BFC (see there)

from ddlkit import metrics
from ddlkit.contract import REPLICAS_VAR
from ddlkit.experiments import user_file
from ddlkit.lessons import faults, replicas

STRATEGIES = ("single", "independent", "mirrored", "multi_worker", "parameter_server", "horovod")
REPORT_EVERY = 10  # parameter server: steps per join, one step record each


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--file", required=True, help="the user's model file")
    p.add_argument("--model-fn", default="build_model")
    p.add_argument("--data-fn", default="dataset")
    p.add_argument("--eval-fn", default=None, help="default: eval_dataset if the file has it")
    p.add_argument("--loss", default=None, help="for an uncompiled model")
    p.add_argument("--optimizer", default=None, help="for an uncompiled model")
    p.add_argument("--strategy", choices=STRATEGIES, default="single")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--eval-every", type=int, default=0, help="steps between held-out evals")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.eval_every < 0:
        p.error("--steps and --batch-size must be >= 1, --eval-every >= 0")
    return args


class UserRun:
    """The user's file and what every strategy does with it the same way."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.module = user_file.load(args.file)  # imports only: no TensorFlow op runs yet
        self._held_out = None

    @property
    def held_out(self):
        """The file's held-out set, made when first used: after the strategy, which must
        come before any TensorFlow op (collectives and logical devices are set at start-up)."""
        if self._held_out is None:
            self._held_out = user_file.eval_data(self.module, self.args.eval_fn,
                                                 self.args.batch_size) or ()  # fmt: skip
        return self._held_out or None

    def build(self):
        return user_file.build(
            self.module, self.args.model_fn, loss=self.args.loss, optimizer=self.args.optimizer
        )

    def data(self, batch_size: int, context=None):
        ds = user_file.train_data(self.module, self.args.data_fn, batch_size, context)
        return ds.repeat()  # the same steps in every case, however long the data set

    def dataset_fn(self, per_replica_batch: int):
        def make(context):  # [dist] one input pipeline per worker (or per replica)
            return self.data(per_replica_batch, context)

        return make

    def callbacks(self, reporter, chief: bool, global_batch: int) -> list:
        """The reporter, and on the chief held-out evaluations every --eval-every steps."""
        out = [reporter]
        if chief and self.held_out is not None and self.args.eval_every:
            held_out = HeldOut(self, reporter, global_batch)
            out.append(HeldOutCallback(held_out, self.args.eval_every))
        return out

    def finish(self, model, *, seconds: float, replicas: int, global_batch: int, extra=None):
        scores = evaluate(model, self.held_out)
        report(
            {
                "dataset": self.module.__name__.removeprefix("user_model_"),
                "epochs": 1,
                "steps": self.args.steps,
                "global_batch": global_batch,
                "replicas": replicas,
                "examples_per_sec": self.args.steps * global_batch / seconds,
                "test_accuracy": scores.get("accuracy"),  # None without an accuracy metric
                "held_out": scores,
                "train_seconds": seconds,
                **(extra or {}),
            }
        )


def evaluate(model, held_out) -> dict:
    """The compiled loss and metrics on the held-out set ({} without one)."""
    if held_out is None:
        return {}
    scores = model.evaluate(held_out, verbose=0, return_dict=True)
    return {name: float(value) for name, value in scores.items()}


class HeldOut:
    """Held-out evaluations of a copy of the model, built outside the strategy's scope as
    ``launch/_common.py``'s are: ``eval`` events for the time to a target accuracy.

    The copy is scored batch by batch with its compiled loss and metrics (``compute_loss``,
    ``compute_metrics``), not ``evaluate()``: inside ``fit`` the strategy's scope is current,
    and ``evaluate()`` would distribute the held-out set over it, so the chief alone would
    start collectives its peers never join. One scoring here, before ``fit``, creates the
    metrics' variables outside that scope."""

    def __init__(self, run: UserRun, source, global_batch: int) -> None:
        self.local = run.build()
        self.held_out, self.source, self.global_batch = run.held_out, source, global_batch
        self.scores()

    def scores(self) -> dict:
        for metric in self.local.metrics:
            metric.reset_state()
        results: dict = {}
        for batch in self.held_out:
            x, y = batch[0], batch[1]
            predicted = self.local(x, training=False)
            self.local.compute_loss(x, y, predicted)
            results = self.local.compute_metrics(x, y, predicted, None)
        return {name: float(value) for name, value in results.items()}

    def __call__(self, model, step: int, train_seconds: float) -> None:
        self.local.set_weights(model.get_weights())
        scores = self.scores()
        if "accuracy" in scores:  # a time to a target accuracy needs one
            # a Reporter, or a KerasReporter whose reporter exists once training began
            reporter = getattr(self.source, "reporter", self.source)
            reporter.event("eval", step=step, examples=step * self.global_batch,
                           train_seconds=train_seconds, loss=scores.get("loss"),
                           accuracy=scores["accuracy"])  # fmt: skip


class HeldOutCallback(tf.keras.callbacks.Callback):
    """:class:`HeldOut` every ``every`` steps of ``fit``, its time left out of training's."""

    def __init__(self, held_out: HeldOut, every: int) -> None:
        super().__init__()
        self.held_out, self.every, self.step, self.spent = held_out, every, 0, 0.0

    def on_train_begin(self, logs=None) -> None:
        self.began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.step += 1
        if self.step % self.every == 0:
            start = time.perf_counter()
            self.held_out(self.model, self.step, start - self.began - self.spent)
            self.spent += time.perf_counter() - start


def keras_fit(run: UserRun, model, data, *, global_batch: int, workers: int, chief: bool) -> float:
    """``model.fit`` for the steps asked, with the kit's reporter; the seconds it took."""
    reporter = metrics.KerasReporter(batch_size=global_batch // workers)
    start = time.perf_counter()
    model.fit(
        data,
        epochs=1,
        steps_per_epoch=run.args.steps,
        verbose=0,
        callbacks=run.callbacks(reporter, chief, global_batch),
    )
    return time.perf_counter() - start


def single(run: UserRun) -> int:
    """No strategy: one process, one device (the independent ceiling runs N of these)."""
    model = run.build()
    batch = run.args.batch_size
    seconds = keras_fit(run, model, run.data(batch), global_batch=batch, workers=1, chief=True)
    run.finish(model, seconds=seconds, replicas=1, global_batch=batch)
    return 0


def mirrored(run: UserRun) -> int:
    """MirroredStrategy over this machine's devices (GPUs, else logical CPUs)."""
    plan = replicas.devices(int(os.environ.get(REPLICAS_VAR, "1")))  # [dist] before other ops
    strategy = tf.distribute.MirroredStrategy(list(plan))  # [dist]
    n = strategy.num_replicas_in_sync  # [dist]
    with strategy.scope():  # [dist] variables mirrored on every device
        model = run.build()
    data = strategy.distribute_datasets_from_function(  # [dist] each replica its batch
        run.dataset_fn(run.args.batch_size)
    )
    batch = run.args.batch_size * n  # [dist]
    seconds = keras_fit(run, model, data, global_batch=batch, workers=1, chief=True)
    run.finish(model, seconds=seconds, replicas=n, global_batch=batch)
    return 0


def multi_worker(run: UserRun) -> int:
    """MultiWorkerMirroredStrategy: one process per worker, TF_CONFIG says who is who."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # [dist] reads TF_CONFIG
    resolver = strategy.cluster_resolver  # [dist]
    cluster = resolver.cluster_spec().as_dict()  # [dist]
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", [])) or 1  # [dist]
    chief = faults.is_chief(resolver.task_type, resolver.task_id, cluster)  # [dist]
    with strategy.scope():  # [dist]
        model = run.build()
    data = strategy.distribute_datasets_from_function(  # [dist] each worker its own shard
        run.dataset_fn(run.args.batch_size)
    )
    batch = run.args.batch_size * strategy.num_replicas_in_sync  # [dist]
    seconds = keras_fit(run, model, data, global_batch=batch, workers=workers, chief=chief)
    run.finish(model, seconds=seconds, replicas=strategy.num_replicas_in_sync, global_batch=batch)
    return 0


def parameter_server(run: UserRun) -> int:
    """ParameterServerStrategy: ps and worker tasks serve; the chief schedules the steps."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()  # [dist]
    if resolver.task_type in ("ps", "worker"):  # [dist] a server that runs what it is sent
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )  # [dist]
        server.join()  # [dist] the launcher ends this process
        return 0
    strategy = tf.distribute.ParameterServerStrategy(resolver)  # [dist]
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # [dist]
    workers = len(resolver.cluster_spec().as_dict()["worker"])  # [dist]
    with strategy.scope():  # [dist] variables on the ps tasks
        model = run.build()
    batch = run.args.batch_size  # one worker's batch per step

    def per_worker():  # [dist] each worker builds its own pipeline
        return run.data(batch, tf.distribute.InputContext())

    iterator = iter(coordinator.create_per_worker_dataset(per_worker))  # [dist]

    @tf.function
    def train_steps(iterator, n: int):  # [dist] n steps on one worker, the last loss back
        logs = {"loss": tf.constant(0.0)}
        for _ in range(n):
            logs = strategy.run(model.train_step, args=(next(iterator),))
        return logs["loss"]

    reporter = metrics.Reporter()
    reporter.event("train_begin", epochs=1, steps=run.args.steps, batch_size=batch,
                   every=REPORT_EVERY, initial_step=0, workers=workers)  # fmt: skip
    held_out = HeldOut(run, reporter, batch) if run.held_out is not None else None  # [dist] a
    # local copy: the chief cannot run evaluate() on variables that live on the ps tasks
    every = run.args.eval_every
    done, seconds = 0, 0.0
    while done < run.args.steps:
        k = min(REPORT_EVERY, run.args.steps - done, (every - done % every) if every else 10**9)
        start = time.perf_counter()
        losses = [coordinator.schedule(train_steps, args=(iterator, 1)) for _ in range(k)]  # [dist]
        coordinator.join()  # [dist] every scheduled step done
        elapsed = time.perf_counter() - start
        seconds += elapsed
        done += k
        loss = float(sum(float(v.fetch()) for v in losses) / k)
        reporter.step(step=done, epoch=0, loss=loss, batch_size=batch,
                      step_time=elapsed / k, steps=k)  # fmt: skip
        if held_out is not None and every and done % every == 0:
            held_out(model, done, seconds)
    reporter.event("train_end", steps=done)
    final = held_out.local if held_out is not None else model
    if held_out is not None:
        final.set_weights(model.get_weights())
    run.finish(final, seconds=seconds, replicas=workers, global_batch=batch)
    reporter.close()
    return 0


def horovod(run: UserRun) -> int:
    """Horovod: one rank per worker, the optimizer wrapped to average the gradients."""
    import horovod.tensorflow.keras as hvd_keras

    from ddlkit import horovod as dkh

    hvd = dkh.init()  # [dist] hvd.init(), own GPU if any, rank-N metrics
    model = run.build()
    # [dist] the user's compile, again, with the optimizer that all-reduces; groups=1: every
    # gradient in one all-reduce after the backward pass (one core per rank: notebook 08).
    args = model._get_compile_args()  # tf-keras: what compile() was given
    args["optimizer"] = hvd_keras.DistributedOptimizer(model.optimizer, groups=1)  # [dist]
    model.compile(**args)
    batch = run.args.batch_size
    context = tf.distribute.InputContext(hvd.size(), hvd.rank(), hvd.size())  # [dist]
    data = run.data(batch, context)  # [dist] the user's shard for this rank
    reporter = metrics.KerasReporter(batch_size=batch)
    callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)]  # [dist]
    callbacks += run.callbacks(reporter, hvd.rank() == 0, batch * hvd.size())
    start = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=run.args.steps, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    run.finish(model, seconds=seconds, replicas=hvd.size(), global_batch=batch * hvd.size(),
               extra={"rank": hvd.rank()})  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = UserRun(args)
    by_name = {"single": single, "independent": single, "mirrored": mirrored,
               "multi_worker": multi_worker, "parameter_server": parameter_server,
               "horovod": horovod}  # fmt: skip
    return by_name[args.strategy](run)


if __name__ == "__main__":
    raise SystemExit(main())
