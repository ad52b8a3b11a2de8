"""Time MultiWorkerMirroredStrategy's all-reduce by tensor size, in every worker.

On CPU, MultiWorkerMirroredStrategy all-reduces with TensorFlow's collective ops: a ring
whose chunks travel between the workers' gRPC servers. Each worker times ``--repeats``
calls of a ``tf.function`` that all-reduces one float32 tensor of each size (a fit step
runs its gradient all-reduce the same way, inside its ``tf.function``), and the same call
with no all-reduce, the cost of calling a ``tf.function`` at all. It prints one JSON line
and, under ddlkit, saves it as its result. ``benchmarks/bench_allreduce.py --mwms``
starts two workers and fits ``t = a + n / B`` to the slower worker's medians.

By hand, two shells (ports free on this host):
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                "task": {"type": "worker", "index": 0}}' python launch/time_mwms_allreduce.py
    (the same with "index": 1 in the other)
Through ddlkit:
    ddlkit launch --strategy multi_worker -n 2 launch/time_mwms_allreduce.py -- --sizes 8 1048576
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)
from ddlkit import contract

# isort: split
import tensorflow as tf

DEFAULT_SIZES = [4 * 2**k for k in range(1, 23, 3)]  # 8 B .. 8 MiB
WARMUP = 10  # calls before timing: the first ones set up the ring's groups and connections


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="tensor bytes (float32)"
    )
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per size")
    args = parser.parse_args(argv)
    bad = [s for s in args.sizes if s < 4 or s % 4]
    if bad:
        parser.error(f"--sizes {bad}: each must be a multiple of 4 bytes (float32), >= 4")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: need >= 1")
    return args


def time_calls(fn, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after WARMUP untimed ones; a call ends
    when its (one-element) result has reached this Python process."""
    for _ in range(WARMUP):
        fn().numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - start)
    return times


def summary(nbytes: int, times: list[float]) -> list[float]:
    """[bytes, median s, min s, max s]: AllreduceTiming's point layout."""
    return [nbytes, statistics.median(times), min(times), max(times)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    replica = tf.distribute.get_replica_context

    points, calls = [], []
    for nbytes in sorted(args.sizes):
        with strategy.scope():
            v = tf.Variable(tf.ones([nbytes // 4]))

        @tf.function
        def reduce_once(v=v):
            # Each worker's replica adds its tensor to every other's: the gradient all-reduce.
            summed = strategy.run(lambda: replica().all_reduce("sum", v * 1.0))
            return strategy.experimental_local_results(summed)[0][0]

        @tf.function
        def no_reduce(v=v):
            product = strategy.run(lambda: v * 1.0)
            return strategy.experimental_local_results(product)[0][0]

        points.append(summary(nbytes, time_calls(reduce_once, args.repeats)))
        calls.append(summary(nbytes, time_calls(no_reduce, args.repeats)))

    report = {
        "worker": strategy.cluster_resolver.task_id,
        "workers": strategy.num_replicas_in_sync,
        "repeats": args.repeats,
        "points": points,  # one all-reduce and its call
        "calls": calls,  # the same call without it
    }
    line = json.dumps(report)
    print(f"RESULT {line}", flush=True)
    run_dir, worker = os.environ.get(contract.RUN_DIR_VAR), os.environ.get(contract.WORKER_VAR)
    if run_dir and worker:
        contract.write_result(run_dir, worker, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
