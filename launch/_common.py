"""Arguments and evaluation shared by the kit's worker scripts (kept tiny on purpose)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable


def parse_args(
    argv: list[str] | None,
    description: str,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The shared flags; ``extra(parser)`` adds a script's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dataset", default="mnist", choices=("mnist", "fashion_mnist", "cifar10"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--lr", type=float, default=1e-3, help="for one replica")
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="0: one pass over the data")
    parser.add_argument("--seed", type=int, default=0)
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


def test_accuracy(model, dataset: str, x_test, y_test, seed: int) -> float:
    """Evaluate a copy of `model`'s weights on one device: the same answer on every worker."""
    from ddlkit import models
    from ddlkit.data import pipeline

    local = models.for_dataset(dataset, seed=seed)
    local.set_weights(model.get_weights())
    models.compile_classifier(local)
    test = pipeline.make_dataset(x_test, y_test, batch_size=256, shuffle=False)
    return float(local.evaluate(test, verbose=0)[1])


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
    run_dir, worker = os.environ.get("DDLKIT_RUN_DIR"), os.environ.get("DDLKIT_WORKER")
    if run_dir and worker:
        path = os.path.join(run_dir, "results", f"{worker}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(line)
        os.replace(tmp, path)
    sys.stdout.flush()
