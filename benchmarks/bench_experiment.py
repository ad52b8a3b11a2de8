"""What ``dk.experiment`` adds to a run of the user's model: the kit vs the same training by hand.

    .venv/bin/python benchmarks/bench_experiment.py                  # 3 pairs, 200 steps
    .venv/bin/python benchmarks/bench_experiment.py --pairs 1 --steps 60

The experiment's worker (``launch/train_user.py``) trains a user's file that the kit does
not ship (``tests/experiment/models/text_encoder.py``: two inputs, an embedding, attention)
under MultiWorkerMirroredStrategy with 2 workers, alternately by hand (one ``python`` per
worker with its ``TF_CONFIG``, as TensorFlow's tutorial starts them) and through the
launcher with live metrics, each on the cores the launcher would give it. This is the
benchmark's own overhead method (:func:`ddlkit.bench.overhead.measure_overhead`): the
steady-state rate of the step records, the median of the pairs' kit / by-hand ratios.
The issue's goal: within 5% (ratio >= 0.95). Prints one JSON line with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from ddlkit.bench.overhead import measure_overhead
from ddlkit.launch import devices

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "experiment" / "models" / "text_encoder.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args(argv)
    before = os.getloadavg()
    worker = ["--file", str(args.model.resolve()), "--strategy", "multi_worker"]
    worker += ["--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    with tempfile.TemporaryDirectory(prefix="ddlkit-bench-experiment-") as tmp:
        overhead = measure_overhead(
            ROOT / "launch" / "train_user.py",
            pairs=args.pairs,
            steps=args.steps,
            cores=devices.local_cores(),
            workdir=Path(tmp),
            args=worker,
        )
    out = overhead.to_dict() | {
        "model": args.model.name,
        "load_before": [round(x, 2) for x in before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
