"""Launcher benchmarks (issue 3): the kit's overhead and its start-up time.

1. Overhead: the same 2-worker MultiWorkerMirroredStrategy MNIST script,
   launched through ddlkit with live metrics on, and launched by hand
   (subprocess + TF_CONFIG, nothing else), alternating, in one run. Throughput
   is what the script itself measures (examples trained / fit wall time), so
   both sides are timed the same way. Reports the median ratio kit / by hand.
   Goal: >= 0.97.
2. Time from the launch call to the first training step received by the
   collector, for 1 and 2 workers.

    .venv/bin/python benchmarks/bench_launch.py            # full
    .venv/bin/python benchmarks/bench_launch.py --quick    # a few minutes
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "launch" / "train_multi_worker.py"
sys.path.insert(0, str(ROOT))

from ddlkit.backend import keras_env  # noqa: E402
from ddlkit.cluster import ClusterSpec  # noqa: E402
from ddlkit.launch import run as run_mod  # noqa: E402


def result_line(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"no RESULT line in worker output:\n{text[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def by_hand(args: list[str], workdir: Path) -> float:
    """Two workers the way TensorFlow's tutorial starts them: TF_CONFIG and python."""
    cluster = ClusterSpec.local(workers=2)
    procs = []
    for i, task in enumerate(cluster.tasks):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDLKIT_")}
        env.update(keras_env("tf-keras"))
        env["TF_CONFIG"] = cluster.tf_config_json(task)
        env["DDLKIT_RUNS"] = str(workdir)  # the script's own local metrics file goes here
        log = open(workdir / f"hand-{i}.log", "w+")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(SCRIPT), *args],
                    env=env,
                    cwd=workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    for p, _ in procs:
        if p.wait(timeout=900) != 0:
            raise RuntimeError("a by-hand worker failed")
    log = procs[0][1]
    log.seek(0)
    return result_line(log.read())["examples_per_sec"]


def through_kit(args: list[str], workdir: Path, pin: bool = True) -> float:
    run = run_mod.start(SCRIPT, workers=2, args=args, runs_dir=workdir, pin_cores=pin)
    run.wait(timeout=900)
    return run.results()["worker-0"]["examples_per_sec"]


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
    pairs = 2 if opts.quick else 3
    steps = "100" if opts.quick else "250"
    args = ["--steps-per-epoch", steps, "--epochs", "1"]
    with tempfile.TemporaryDirectory(prefix="ddlkit-bench-") as tmp:
        work = Path(tmp)
        hand, kit, kit_unpinned = [], [], []
        for _ in range(pairs):
            hand.append(by_hand(args, work))
            kit.append(through_kit(args, work))
            kit_unpinned.append(through_kit(args, work, pin=False))
        ratios = [k / h for k, h in zip(kit, hand, strict=True)]
        # Same process layout as by hand (no pinning, default threads): the cost of
        # the launcher and live metrics alone.
        ratios_unpinned = [k / h for k, h in zip(kit_unpinned, hand, strict=True)]
        start = {n: first_step_seconds(n, work) for n in (1, 2)}
    print(
        json.dumps(
            {
                "benchmark": "launch",
                "steps": int(steps),
                "by_hand_examples_per_sec": hand,
                "kit_examples_per_sec": kit,
                "overhead_ratio_median": statistics.median(ratios),
                "overhead_ratios": ratios,
                "kit_unpinned_examples_per_sec": kit_unpinned,
                "overhead_ratio_unpinned_median": statistics.median(ratios_unpinned),
                "seconds_to_first_step": start,
                "cores": len(os.sched_getaffinity(0)),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
