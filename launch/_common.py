"""Arguments and evaluation shared by the kit's worker scripts (kept tiny on purpose).

Nothing here imports TensorFlow at module level: the scripts import this module
before ``ddlkit`` chooses the Keras in use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

MODELS = ("cnn", "small_resnet")  # ddlkit.models.ARCHS (this module loads before ddlkit)


def parse_args(
    argv: list[str] | None,
    description: str,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    *,
    model_flag: bool = False,
) -> argparse.Namespace:
    """The shared flags; ``extra(parser)`` adds a script's own. ``model_flag``: the script
    builds ``models.build(args.model, ...)``, so it takes ``--model {cnn,small_resnet}``
    (the others keep ``args.model == "cnn"`` and reject the flag rather than ignore it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dataset", default="mnist", choices=("mnist", "fashion_mnist", "cifar10"))
    if model_flag:
        about = "cnn: the data set's tutorial CNN; small_resnet: more compute per parameter"
        parser.add_argument("--model", default="cnn", choices=MODELS, help=about)
    else:
        parser.set_defaults(model="cnn")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--lr", type=float, default=1e-3, help="for one replica")
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="0: one pass over the data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--test-examples",
        type=int,
        default=None,
        help=f"test images for the final accuracy, from the first (default: all of them; "
        f"{FAST_TEST_EXAMPLES} under DDLKIT_FAST=1)",
    )
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.test_examples is None:
        from ddlkit.settings import fast_mode

        args.test_examples = FAST_TEST_EXAMPLES if fast_mode() else 0
    if args.test_examples < 0:
        parser.error(f"--test-examples {args.test_examples}: need >= 0 (0: every test image)")
    return args


# The final accuracy on the test set: all 10,000 images by default. Under DDLKIT_FAST=1 (CI,
# the notebooks' fast mode: runs of a few steps) the first 1,000: evaluating all of them
# took 2.4 of a 3-step MNIST run's 7.7 s of CPU on this machine (0.5 s for 1,000).
FAST_TEST_EXAMPLES = 1000


# A speed setting, not needed for correctness ("[speed]" in the lessons' scripts): TensorFlow's
# BFC allocator for CPU tensors (read by TensorFlow's C++ ProcessState::GetCPUAllocator when it
# makes its CPU device, so setting it here, before any op runs, is early enough). In some process
# starts on the kit's 2-core machine, under MirroredStrategy, MultiWorkerMirroredStrategy or
# OneDeviceStrategy, the default CPU allocator gave memory back and took it again every step:
# thousands of minor page faults per step of the MNIST CNN (fresh pages the kernel must zero)
# and clearly more CPU time per step than the same loop without a strategy (glibc's MALLOC_*
# settings and steps_per_execution changed neither). The BFC allocator keeps its memory and ran
# at the no-strategy cost; other starts ran at that speed with either allocator. Notebook 08,
# section 11 measures it on the learner's machine.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # [speed]

# Steps Keras runs per call into TensorFlow (compile(steps_per_execution=...)). 1 stays the
# default: with the allocator above the extra CPU time is gone, and on a 2-core CPU 16 steps per
# call ran no faster than 1 (ddlkit bench): Python's per-step dispatch is not what limits this
# model. Raise it for small models or fast accelerators;
# the dashboard then gets one record per execution (KerasReporter counts every step).
STEPS_PER_EXECUTION = 1


def add_eval_flags(parser: argparse.ArgumentParser, every: int = 0) -> None:
    """The flags of the ``model.fit`` scripts: ``--eval-every`` (steps between held-out
    evaluations, 0: none), ``--eval-examples`` and ``--steps-per-execution``."""
    parser.add_argument(
        "--steps-per-execution",
        type=int,
        default=STEPS_PER_EXECUTION,
        help="steps per call into TensorFlow (Keras compile); the dashboard gets one "
        "record per execution",
    )
    parser.add_argument(
        "--eval-every", type=int, default=every, help="steps between held-out evals (0: none)"
    )
    parser.add_argument("--eval-examples", type=int, default=2000, help="held-out test images")


class _EvalEvents:
    """Evaluate a local copy every ``every`` steps; report ``eval`` events via ``source``.

    Each event has ``step``, ``examples``, ``loss``, ``accuracy`` and ``train_seconds``:
    training time since the start, evaluations left out. Combined with Keras' Callback
    class in :func:`held_out_evals` (TensorFlow loads only when it is used).
    """

    def __init__(
        self, source, dataset: str, x, y, every: int, global_batch: int, seed: int, arch: str
    ):
        import tensorflow as tf

        from ddlkit import models
        from ddlkit.data import pipeline

        super().__init__()
        self.source, self.every, self.global_batch = source, every, global_batch
        self.data = pipeline.make_dataset(x, y, batch_size=500, shuffle=False)
        # Built here, outside fit's strategy scope: variables made inside it on worker-0
        # alone would be broadcast to workers that never make them (a collective hang).
        self.local = models.build(arch, dataset, seed=seed)
        self.logits = tf.function(lambda images: self.local(images, training=False))
        self.step = self.epoch_steps = 0
        self.eval_seconds = 0.0
        self.train_seconds = 0.0  # from the first to the last step, evaluation excluded

    def evaluate(self) -> None:
        import tensorflow as tf

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
        # One call per execution of compile(steps_per_execution=k) steps; `batch` is the
        # epoch's index of its last step. Evaluate once when the execution crosses a
        # multiple of `every` (evaluations land on execution boundaries).
        from ddlkit.metrics.keras_callback import steps_done

        before = self.step
        self.step += steps_done(batch, self.epoch_steps)
        self.epoch_steps += self.step - before
        if self.step // self.every > before // self.every:
            self.evaluate()

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch_steps = 0

    def on_train_end(self, logs=None) -> None:
        self.train_seconds = time.perf_counter() - self.began - self.eval_seconds
        if self.step % self.every:
            self.evaluate()


def held_out_evals(source, args: argparse.Namespace, x_test, y_test, global_batch: int) -> list:
    """The callbacks for ``--eval-every``: ``[]`` when it is 0, else one that evaluates the
    first ``--eval-examples`` test images and reports ``eval`` events through `source`
    (the script's KerasReporter; put it after the reporter in ``callbacks``)."""
    if args.eval_every < 0 or args.eval_examples < 1:
        raise SystemExit(
            f"--eval-every {args.eval_every} --eval-examples {args.eval_examples}: need >= 0 "
            f"and >= 1. Fix: e.g. --eval-every 20 --eval-examples 2000."
        )
    if not args.eval_every:
        return []
    import tensorflow as tf

    cls = type("EvalEvents", (_EvalEvents, tf.keras.callbacks.Callback), {})
    x, y = x_test[: args.eval_examples], y_test[: args.eval_examples]
    every, seed = args.eval_every, args.seed
    return [cls(source, args.dataset, x, y, every, global_batch, seed, args.model)]


def final_test_set(args: argparse.Namespace, x_test, y_test):
    """The images the final test accuracy is measured on: the first ``--test-examples``,
    or all of them for 0."""
    n = args.test_examples or len(x_test)
    return x_test[:n], y_test[:n]


def test_accuracy(model, args: argparse.Namespace, x_test, y_test) -> tuple[float, int]:
    """A copy of `model`'s weights evaluated on one device, the same answer on every worker:
    (accuracy, images evaluated). The copy is ``models.build(args.model, args.dataset)``;
    the images, :func:`final_test_set`'s."""
    from ddlkit import models
    from ddlkit.data import pipeline

    x_test, y_test = final_test_set(args, x_test, y_test)
    local = models.build(args.model, args.dataset, seed=args.seed)
    local.set_weights(model.get_weights())
    models.compile_classifier(local)
    test = pipeline.make_dataset(x_test, y_test, batch_size=256, shuffle=False)
    return float(local.evaluate(test, verbose=0)[1]), len(x_test)


def report(result: dict) -> None:
    """Print the worker's result as one JSON line and, under ddlkit, save it in the run.

    It must hold every key of ``ddlkit.results.REPORT_KEYS`` (``dk.results.from_run``
    builds the run's Result from them); scripts add their own keys freely.
    """
    from ddlkit.results import REPORT_KEYS

    missing = [k for k in REPORT_KEYS if k not in result]
    if missing:
        raise ValueError(f"report() lacks {', '.join(missing)}: every script reports REPORT_KEYS")
    line = json.dumps(result, sort_keys=True)
    print(f"RESULT {line}", flush=True)
    from ddlkit import contract

    run_dir, worker = os.environ.get(contract.RUN_DIR_VAR), os.environ.get(contract.WORKER_VAR)
    if run_dir and worker:
        contract.write_result(run_dir, worker, line)
    sys.stdout.flush()
