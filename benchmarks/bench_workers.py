"""Live workers' speed goals (dk.workers), measured in one run on this machine.

    python benchmarks/bench_workers.py [--rounds 3] [--fit-steps 200] [--no-fit]

- ready: seconds from ``dk.workers(2, strategy="multi_worker")`` to both engines connected;
- %%px overhead: median round trip of a cell that does nothing on both workers, minus the
  same code's median time in a plain Python process (timeit), in ms;
- fit: MNIST CNN examples/s of a ``fit`` on the live workers (the kit's KerasReporter, steady
  state after the first epoch) against the same cells written out with ``workers.script``
  and launched with ``dk.launch.start`` (same records), as a ratio;
- close: seconds of ``workers.close()``.

Prints the machine's load average before and after: timing on a busy 2-core box is noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ddlkit as dk

CELL = "s = sum(range(1000))"
FIT = """
import tensorflow as tf
import ddlkit as dk
strategy = tf.distribute.MultiWorkerMirroredStrategy()
(x_train, y_train), _ = dk.data.load("mnist")
x = (x_train[:{n}].reshape(-1, 28, 28, 1) / 255.0).astype("float32")
y = y_train[:{n}]
with strategy.scope():
    model = dk.models.mnist_cnn(seed=0)
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=16)
model.fit(x, y, batch_size=128, epochs=2, verbose=0,
          callbacks=[dk.metrics.KerasReporter(batch_size=128)])
"""


def steady_rate(records) -> float:
    """Examples/s over the second epoch's step records of worker 0 (global batch 128)."""
    steps = [r for r in records if r.kind == "step" and r.epoch == 1]
    if len(steps) < 2:
        return float("nan")
    span = steps[-1].wall_time - steps[0].wall_time
    return (steps[-1].step - steps[0].step) * 128 / span


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cells", type=int, default=30, help="cells timed per round")
    p.add_argument("--fit-steps", type=int, default=200, help="global steps per epoch")
    p.add_argument("--no-fit", action="store_true")
    args = p.parse_args()
    print("load before:", os.getloadavg())
    plain = subprocess.run(
        [sys.executable, "-m", "timeit", "-n", "1000", "-r", "5", CELL],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    print("plain process:", plain)
    ready, overhead, close = [], [], []
    for _ in range(args.rounds):
        w = dk.workers(2, strategy="multi_worker")
        ready.append(w.ready_seconds)
        w.run_cell(CELL)  # warm
        times = []
        for _ in range(args.cells):
            t = time.perf_counter()
            w.run_cell(CELL)
            times.append(time.perf_counter() - t)
        overhead.append(statistics.median(times) * 1000)
        t = time.perf_counter()
        w.close()
        close.append(time.perf_counter() - t)
    print(f"ready s: {[round(x, 2) for x in ready]}")
    print(f"%%px round trip ms (median per round): {[round(x, 1) for x in overhead]}")
    print(f"close s: {[round(x, 2) for x in close]}")
    if not args.no_fit:
        n = args.fit_steps * 128
        w = dk.workers(2, strategy="multi_worker")
        w.run_cell(FIT.format(n=n))
        live = steady_rate(w.records("worker-0"))
        with tempfile.TemporaryDirectory() as tmp:
            path = w.script(Path(tmp) / "fit.py")
            w.close()
            run = dk.launch.start(path, strategy="multi_worker", workers=2)
            run.wait(timeout=1800)
            launched = steady_rate(run.records("worker-0"))
        print(f"fit examples/s: live {live:.0f}, launched {launched:.0f}, "
              f"ratio {live / launched:.3f}")  # fmt: skip
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    main()
