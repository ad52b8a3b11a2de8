"""Launcher benchmarks (issue 3): the kit's start-up time, and its overhead.

1. Time from the launch call to the first training step received by the collector,
   for 1 and 2 MultiWorkerMirroredStrategy workers.
2. Overhead: ``ddlkit.bench.overhead.measure_overhead``, the same measurement as
   ``ddlkit bench`` (the 2-worker MNIST script by hand with TF_CONFIG vs through
   ddlkit with live metrics, same cores and threads, alternating pairs, steady-state
   examples/s from step records; median ratio kit / by hand, goal >= 0.97). It replaced
   this script's earlier rate from worker 0's RESULT line, which included waiting for
   the other worker to start and so swung with start order.
3. Warm start (``--warm``, ``ddlkit.launch.warm``): the same 2-worker job, short, started
   warm and cold (``DDLKIT_WARM_START=0``) in alternating pairs; per start, the seconds to
   the first step and the CPU-seconds of every process the job ran (``getrusage`` of this
   process's children, with what the template reported of the workers it reaped, taken when
   the job has ended). The first warm start also starts the template (``first_warm``); the
   later ones fork from it. Prints each pair, the first warm start and the medians.

    .venv/bin/python benchmarks/bench_launch.py            # full
    .venv/bin/python benchmarks/bench_launch.py --quick    # a few minutes
    .venv/bin/python benchmarks/bench_launch.py --warm     # only 3: about two minutes
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
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
from ddlkit.launch.warm import WARM_VAR  # noqa: E402
from ddlkit.launch.warm_pool import forked_cpu_seconds  # noqa: E402


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


def children_cpu() -> float:
    """CPU seconds of ended children: reaped here, or forked and reaped by a template."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + forked_cpu_seconds()


def warm_against_cold(pairs: int, workdir: Path) -> dict:
    """Alternating warm and cold starts of a 2-worker job: seconds to first step, CPU-s."""
    rows = []
    for i in range(pairs):
        row = {}
        for mode in ("warm", "cold") if i % 2 == 0 else ("cold", "warm"):
            os.environ[WARM_VAR] = "1" if mode == "warm" else "0"
            before = children_cpu()
            seconds = first_step_seconds(2, workdir)
            row[mode] = {
                "first_step_s": round(seconds, 2),
                "cpu_s": round(children_cpu() - before, 2),
            }
        rows.append(row)
    os.environ.pop(WARM_VAR, None)
    med = {
        mode: {k: statistics.median(r[mode][k] for r in rows) for k in ("first_step_s", "cpu_s")}
        for mode in ("warm", "cold")
    }
    # The first warm start started the template (pair 0 runs warm first); later ones reuse it.
    return {"pairs": rows, "median": med, "first_warm": rows[0]["warm"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--warm", action="store_true", help="only warm start against cold")
    opts = parser.parse_args()
    pairs, steps = (2, 100) if opts.quick else (4, 250)
    if opts.warm:
        with tempfile.TemporaryDirectory(prefix="ddlkit-bench-") as tmp:
            out = {"benchmark": "warm_start", **warm_against_cold(pairs + 2, Path(tmp))}
        print(json.dumps({**out, "cores": len(os.sched_getaffinity(0)), "load": os.getloadavg()}))
        return 0
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
