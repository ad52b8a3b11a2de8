"""Horovod on this machine: allreduce time by tensor size, and Horovod against MWMS.

1. Allreduce: 2 local ranks (``horovod.run``, Gloo) time ``repeats`` float32 allreduces
   of each size; prints the median, min and max per size, and the latency and
   bandwidth of ``t = a + n / B`` fitted to them.
2. Training (``--train``): the same MNIST CNN, per-worker batch and steps, launched
   by ddlkit as Horovod (launch/train_horovod.py) and as MultiWorkerMirroredStrategy
   (launch/train_multi_worker.py), one after the other; prints each one's
   steady-state examples/s (all workers together, ``ddlkit.results.throughput``)
   and test accuracy.

Prints one JSON line per measurement.

    .venv/bin/python benchmarks/bench_allreduce.py            # about a minute
    .venv/bin/python benchmarks/bench_allreduce.py --train    # plus a few minutes
    .venv/bin/python benchmarks/bench_allreduce.py --quick    # seconds: checks it runs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import ddlkit  # noqa: F401  (chooses Keras before TensorFlow is imported)
import ddlkit.horovod as dkh
from ddlkit import launch, results

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "horovod": ROOT / "launch" / "train_horovod.py",
    "multi_worker": ROOT / "launch" / "train_multi_worker.py",
}


def allreduce(sizes: list[int], repeats: int, ranks: int) -> None:
    timing = dkh.allreduce_timing(sizes, np=ranks, repeats=repeats)
    latency, bandwidth = timing.fit()
    for p in timing.points:
        print(
            json.dumps(
                {
                    "bench": "allreduce",
                    "ranks": ranks,
                    "bytes": p.nbytes,
                    "median_s": p.seconds,
                    "min_s": p.min_seconds,
                    "max_s": p.max_seconds,
                }
            )
        )
    print(
        json.dumps(
            {
                "bench": "allreduce_fit",
                "ranks": ranks,
                "latency_s": latency,
                "bandwidth_bytes_per_s": bandwidth if math.isfinite(bandwidth) else None,
            }
        )
    )


def train(steps: int, epochs: int, batch: int, workers: int) -> None:
    args = ["--steps-per-epoch", str(steps), "--epochs", str(epochs), "--batch-size", str(batch)]
    for strategy, script in SCRIPTS.items():
        run = launch.start(
            script, strategy=strategy, workers=workers, args=args, label=f"bench-{strategy}"
        )
        run.wait(timeout=1800)
        first = run.results()[min(run.results())]
        print(
            json.dumps(
                {
                    "bench": "train",
                    "strategy": strategy,
                    "workers": workers,
                    "per_worker_batch": batch,
                    "steps": steps * epochs,
                    "examples_per_sec": results.throughput(run.records()),
                    "test_accuracy": first["test_accuracy"],
                    "run": run.run_id,
                }
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repeats")
    parser.add_argument("--train", action="store_true", help="also Horovod against MWMS")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="training steps per epoch")
    args = parser.parse_args(argv)
    dkh.require()
    if args.quick:
        allreduce([1024, 65536], repeats=3, ranks=args.ranks)
        if args.train:
            train(steps=10, epochs=1, batch=64, workers=args.ranks)
        return 0
    allreduce([4 * 2**k for k in range(8, 25, 2)], repeats=20, ranks=args.ranks)
    if args.train:
        train(steps=args.steps, epochs=1, batch=64, workers=args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
