"""GPipe pipeline on 2 stages: measured bubble and throughput against micro-batches M.

The model is :func:`ddlkit.parallel.mlp` (four hidden layers of equal width; the
first has the 784 pixels as inputs) cut in the middle, so the two stages do nearly
equal work; one fixed mini-batch of random
images (throughput does not depend on pixel values). For each M the pipeline
runs ``warmup`` untimed steps (tracing), then ``steps`` timed ones; the table
shows medians. The reference row trains the same model unsplit on one device
with one ``tf.function`` step (forward, backward, Adam): what the pipeline has
to beat. ``cores`` is this process's CPU time over the wall time of the timed
steps: how many cores the step kept busy (at most 2 here). Above 1 with one
thread per stage means the stages computed at the same time; well below the
setting's maximum means other programs had the cores, and the times are theirs
as much as ours.

Thread settings are fixed once TensorFlow starts, so each setting runs in its
own child process:

- ``auto``: each op may use ``cores // stages`` threads (1 on 2 cores), so the
  two logical devices behave like two separate devices of one core each;
- ``default``: TensorFlow's defaults, one op may use every core.

::

    .venv/bin/python benchmarks/bench_pipeline.py            # a few minutes on 2 cores
    .venv/bin/python benchmarks/bench_pipeline.py --quick    # about a minute: checks it runs
    .venv/bin/python benchmarks/bench_pipeline.py --threads auto --micro-batches 1 2 4 8 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import ddlkit  # noqa: F401  (chooses Keras before TensorFlow is imported)
from ddlkit._tables import text_table
from ddlkit.errors import ConfigError
from ddlkit.parallel.schedule import micro_batch_size

THREADS = {"auto": "auto", "default": None}


def measure(args: argparse.Namespace) -> list[dict]:
    """Run every micro-batch count (and the reference) with one thread setting."""
    from ddlkit import parallel

    config = parallel.configure(2, threads_per_stage=THREADS[args.threads])
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((args.batch, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, args.batch)
    model = parallel.mlp(width=args.width, depth=4, seed=0)
    split = parallel.split(model, config.devices, at=["dense3"])
    rows = [reference(tf, model, x, y, args) | {"threads": args.threads}]
    sweep = parallel.sweep(
        split, x, y, args.micro_batches, steps=args.steps, warmup=args.warmup, progress=False
    )
    for p in sweep.points:
        rows.append(
            {
                "threads": args.threads,
                "run": f"pipeline M={p.micro_batches}",
                "micro_batch": args.batch // p.micro_batches,
                "step_ms": p.step_seconds * 1000,
                "examples_per_sec": p.examples_per_sec,
                "bubble": p.bubble,
                "theory": p.theory,
                "cores_busy": p.cores_used,
            }
        )
    return rows


def reference(tf, model, x, y, args: argparse.Namespace) -> dict:
    """The unsplit model on one device, one compiled training step."""
    from ddlkit.backend import keras

    optimizer = keras().optimizers.Adam(1e-3)
    x, y = tf.constant(x), tf.constant(y, tf.int64)

    @tf.function
    def step(x, y):
        with tf.device("/device:CPU:0"), tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(args.warmup):
        step(x, y).numpy()
    seconds = []
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        start = time.perf_counter()
        step(x, y).numpy()
        seconds.append(time.perf_counter() - start)
    cores_busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
    median = statistics.median(seconds)
    return {
        "run": "one device, unsplit",
        "micro_batch": args.batch,
        "step_ms": median * 1000,
        "examples_per_sec": args.batch / median,
        "bubble": None,
        "theory": None,
        "cores_busy": cores_busy,
    }


def table(rows: list[dict]) -> str:
    head = ("threads", "run", "micro-batch", "step ms", "examples/s", "bubble", "theory", "cores")
    body = [
        (
            r["threads"],
            r["run"],
            r["micro_batch"],
            f"{r['step_ms']:.1f}",
            f"{r['examples_per_sec']:,.0f}",
            "" if r["bubble"] is None else f"{r['bubble']:.1%}",
            "" if r["theory"] is None else f"{r['theory']:.1%}",
            f"{r['cores_busy']:.2f}",
        )
        for r in rows
    ]
    return text_table(head, body, rule=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, few steps")
    parser.add_argument("--threads", choices=["both", *THREADS], default="both")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch", type=int, default=256, help="mini-batch size (default 256)")
    parser.add_argument("--width", type=int, help="hidden width (default 1024, quick 256)")
    parser.add_argument("--steps", type=int, help="timed steps per M (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per M (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON lines, not a table")
    args = parser.parse_args(argv)
    args.width = args.width or (256 if args.quick else 1024)
    args.steps = args.steps or (3 if args.quick else 10)
    try:
        for m in args.micro_batches:
            micro_batch_size(args.batch, m)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.threads == "both":  # one child per setting: threads are fixed per process
        rows = []
        for setting in THREADS:
            child = [sys.executable, __file__, *_forward(args), "--threads", setting, "--json"]
            out = subprocess.run(child, capture_output=True, text=True, check=False)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return out.returncode
            rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    else:
        rows = measure(args)
    if args.json:
        for row in rows:
            print(json.dumps(row), flush=True)
    else:
        print(
            f"2 stages, mlp width {args.width}, mini-batch {args.batch}, median of "
            f"{args.steps} steps after {args.warmup} warm-up steps"
        )
        print(table(rows))
    return 0


def _forward(args: argparse.Namespace) -> list[str]:
    out = ["--batch", str(args.batch), "--width", str(args.width), "--steps", str(args.steps)]
    out += ["--warmup", str(args.warmup), "--micro-batches", *map(str, args.micro_batches)]
    return out


if __name__ == "__main__":
    sys.exit(main())
