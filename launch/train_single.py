"""Train a CNN on one device: the baseline every other script is compared with.

Lines marked ``[speed]`` only make it faster and are not needed for correctness;
launch/_common.py, imported first, sets TF_CPU_ALLOCATOR_USE_BFC=true, another (its comment
says why).

Launch:
    python launch/train_single.py --epochs 1
    python launch/train_single.py --steps-per-epoch 200 --eval-every 20  # held-out evals
    python launch/train_single.py --dataset cifar10 --model small_resnet --steps-per-epoch 30
    ddlkit launch --strategy mirrored -n 1 launch/train_single.py -- --epochs 1
"""

from __future__ import annotations

import time

from _common import add_eval_flags, held_out_evals, parse_args, report, test_accuracy

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)
from ddlkit import data, metrics, models
from ddlkit.data import pipeline


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=add_eval_flags, model_flag=True)
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.make_dataset(x_train, y_train, batch_size=args.batch_size, repeat=True)
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), args.batch_size)
    model = models.build(args.model, args.dataset, seed=args.seed)  # --model
    # --steps-per-execution: steps per call into TensorFlow, see _common.STEPS_PER_EXECUTION
    models.compile_classifier(
        model,
        args.lr,
        steps_per_execution=args.steps_per_execution,  # [speed]
    )
    reporter = metrics.KerasReporter(batch_size=args.batch_size)
    evals = held_out_evals(reporter, args, x_test, y_test, args.batch_size)  # --eval-every
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
    examples = args.epochs * steps * args.batch_size
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": examples / seconds,
            "replicas": 1,
            "dataset": args.dataset,
            "model": args.model,  # --model: cnn or small_resnet
            "epochs": args.epochs,
            "steps": args.epochs * steps,
            "global_batch": args.batch_size,
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
