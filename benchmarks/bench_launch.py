"""Launcher benchmarks (issue 3): the kit's start-up time, and its overhead.

1. Time from the launch call to the first training step received by the collector,
   for 1 and 2 MultiWorkerMirroredStrategy workers.
2. Overhead: ``ddlkit.bench.overhead.measure_overhead``, the same measurement as
   ``ddlkit bench`` (the 2-worker MNIST script by hand with TF_CONFIG vs through
   ddlkit with live metrics, same cores and threads, alternating pairs, steady-state
   examples/s from step records; median ratio kit / by hand, goal >= 0.97). It replaced
   this script's earlier rate from worker 0's RESULT line, which included waiting for
   the other worker to start and so swung with start order.

    .venv/bin/python benchmarks/bench_launch.py            # full
    .venv/bin/python benchmarks/bench_launch.py --quick    # a few minutes
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "launch" / "train_multi_worker.py"
sys.path.insert(0, str(ROOT))

from ddlkit.bench.overhead import measure_overhead  # noqa: E402
from ddlkit.launch import devices  # noqa: E402
from ddlkit.launch import run as run_mod  # noqa: E402


def first_step_seconds(workers: int, workdir: Path) -> float:
    t0 = time.time()
    run = run_mod.start(SCRIPT, workers=workers, args=["--steps-per-epoch", "5"], runs_dir=workdir)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            steps = [r for r in run.records() if r.kind == "step"]
            if steps:
                return min(r.wall_time for r in steps) - t0
            time.sleep(0.05)
        raise RuntimeError("no step within 600 s")
    finally:
        run.wait(timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    pairs, steps = (2, 100) if opts.quick else (4, 250)
    with tempfile.TemporaryDirectory(prefix="ddlkit-bench-") as tmp:
        work = Path(tmp)
        start = {n: first_step_seconds(n, work) for n in (1, 2)}
        overhead = measure_overhead(
            SCRIPT, pairs=pairs, steps=steps, cores=devices.local_cores(), workdir=work / "o"
        )
    print(
        json.dumps(
            {
                "benchmark": "launch",
                "seconds_to_first_step": start,
                "overhead": overhead.to_dict(),
                "cores": len(os.sched_getaffinity(0)),
                "load": os.getloadavg(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
