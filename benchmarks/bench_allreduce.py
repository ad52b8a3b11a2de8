"""Horovod on this machine: allreduce time by tensor size, and Horovod against MWMS.

1. Allreduce: 2 local ranks (``horovod.run``, over MPI where Horovod has it, else Gloo)
   time ``repeats`` float32 allreduces of each size; prints the median, min and max per
   size, and the latency and bandwidth of ``t = a + n / B`` fitted to them.
2. MultiWorkerMirroredStrategy's all-reduce (``--mwms``): 2 workers launched by ddlkit,
   each on its own core, time the same sizes (launch/time_mwms_allreduce.py: a
   ``tf.function`` call that all-reduces, as a fit step does, against the same call
   without it); prints the slower worker's numbers per size and the same fit. Its
   latency is what a small model's step pays once per step.
3. Training (``--train``): the same MNIST CNN, per-worker batch and steps, launched
   by ddlkit as Horovod (launch/train_horovod.py) and as MultiWorkerMirroredStrategy
   (launch/train_multi_worker.py), one after the other; prints each one's
   steady-state examples/s (all workers together, ``ddlkit.results.throughput``)
   and test accuracy.

Prints one JSON line per measurement.

    .venv/bin/python benchmarks/bench_allreduce.py            # about a minute
    .venv/bin/python benchmarks/bench_allreduce.py --mwms     # plus MWMS's: a minute more
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
from ddlkit.horovod.timing import AllreduceTiming

ROOT = Path(__file__).resolve().parent.parent
MWMS_TIMER = ROOT / "launch" / "time_mwms_allreduce.py"
SIZES = [4 * 2**k for k in range(8, 25, 2)]  # 1 KiB to 64 MiB, float32
REPEATS = 20
SCRIPTS = {
    "horovod": ROOT / "launch" / "train_horovod.py",
    "multi_worker": ROOT / "launch" / "train_multi_worker.py",
}


def print_timing(timing: AllreduceTiming, strategy: str, **per_size: list[float]) -> None:
    """One JSON line per size (plus `per_size`'s values for it), then the fit's."""
    for i, p in enumerate(timing.points):
        line = {"bench": "allreduce", "strategy": strategy, "ranks": timing.ranks}
        line |= {"bytes": p.nbytes, "median_s": p.seconds}
        line |= {"min_s": p.min_seconds, "max_s": p.max_seconds}
        print(json.dumps(line | {k: v[i] for k, v in per_size.items()}))
    latency, bandwidth = timing.fit()
    fit = {"bench": "allreduce_fit", "strategy": strategy, "ranks": timing.ranks}
    fit |= {"transport": timing.transport, "latency_s": latency}
    fit |= {"bandwidth_bytes_per_s": bandwidth if math.isfinite(bandwidth) else None}
    print(json.dumps(fit))


def allreduce(
    sizes: list[int], repeats: int, ranks: int, transport: str = "auto"
) -> AllreduceTiming:
    timing = dkh.allreduce_timing(sizes, np=ranks, repeats=repeats, transport=transport)
    print_timing(timing, "horovod")
    return timing


def mwms_allreduce(sizes: list[int], repeats: int, workers: int, runs_dir=None) -> AllreduceTiming:
    args = ["--sizes", *map(str, sizes), "--repeats", str(repeats)]
    run = launch.start(
        MWMS_TIMER,
        strategy="multi_worker",
        workers=workers,
        args=args,
        label="bench-mwms",
        runs_dir=runs_dir,
    )
    result = run.wait(timeout=900)
    if not result.ok:
        logs = "\n".join(run.tail(worker, 20) for worker in run.job.spec.names)
        raise SystemExit(f"{MWMS_TIMER.name} failed ({result.state}):\n{logs}")
    reports = list(run.results().values())
    # The slower worker decides, as in Horovod's timing: a step waits for both.
    sizes_done = [p[0] for p in reports[0]["points"]]
    points = [
        [nbytes, *(max(r["points"][i][k] for r in reports) for k in (1, 2, 3))]
        for i, nbytes in enumerate(sizes_done)
    ]
    calls = [max(r["calls"][i][1] for r in reports) for i in range(len(points))]
    timing = AllreduceTiming.from_dict(
        {
            "ranks": workers,
            "dtype": "float32",
            "repeats": repeats,
            "transport": "grpc",
            "points": points,
        }
    )
    print_timing(timing, "multi_worker", call_without_s=calls)
    return timing


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
    parser.add_argument("--mwms", action="store_true", help="also MWMS's all-reduce by size")
    parser.add_argument("--train", action="store_true", help="also Horovod against MWMS")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="training steps per epoch")
    args = parser.parse_args(argv)
    dkh.require()
    if args.quick:
        allreduce([1024, 65536], repeats=3, ranks=args.ranks)
        if args.mwms:
            mwms_allreduce([1024, 65536], repeats=3, workers=args.ranks)
        if args.train:
            train(steps=10, epochs=1, batch=64, workers=args.ranks)
        return 0
    allreduce(SIZES, repeats=REPEATS, ranks=args.ranks)
    if args.mwms:
        mwms_allreduce(SIZES, repeats=REPEATS, workers=args.ranks)
    if args.train:
        train(steps=args.steps, epochs=1, batch=64, workers=args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
