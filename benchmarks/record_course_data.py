"""Record every measurement the course quotes, in one sitting: ``notebooks/data/``.

    .venv/bin/python benchmarks/record_course_data.py          # about 12 minutes, quiet machine
    .venv/bin/python benchmarks/record_course_data.py --quick --out /tmp/rec   # checks it runs

It first waits (up to ``--wait`` seconds) for the machine to be quiet: a 1-minute load
average at most ``--max-load``; it refuses to record otherwise (a recording on a busy machine
is not one the course may quote). Then, one after the other:

1. ``bench-full.json``: ``ddlkit bench --resnet`` (every strategy on the MNIST CNN, and
   Horovod and MultiWorkerMirrored on the small ResNet);
2. ``allreduce-horovod.json``: Horovod's all-reduce by tensor size over 2 ranks, each pinned
   to its own core (MPI where this Horovod has it), as the horovod strategy runs them;
3. ``allreduce-horovod-gloo.json``: the same over Gloo (Horovod's TCP transport), for the
   comparison notebooks 05 and 08 make;
4. ``allreduce-mwms.json``: MultiWorkerMirroredStrategy's all-reduce by size in 2 launched
   workers, each on its own core (gRPC).

Each all-reduce file holds a ``recorded`` block (UTC time, command, 1/5/15-minute load
averages before and after); bench.json records the same in its ``machine`` and ``command``.
``dk.recorded`` reads them all, and ``tests/notebooks/test_claims.py`` then names every quote
in the course that the new numbers moved.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_allreduce as ba

from ddlkit import recorded

ROOT = Path(__file__).resolve().parent.parent


def wait_until_quiet(max_load: float, wait: float) -> list[float]:
    """The load averages once the 1-minute one is at most `max_load`; exits if it never is."""
    deadline = time.monotonic() + wait
    while True:
        load = list(os.getloadavg())
        if load[0] <= max_load:
            return load
        if time.monotonic() >= deadline:
            raise SystemExit(
                f"the machine is busy (1-minute load {load[0]:.2f} > {max_load}) after "
                f"{wait:.0f} s of waiting. Fix: stop what runs (top shows it) and try again, or "
                f"pass --max-load if this machine is never quieter (the files record the load)"
            )
        time.sleep(10)


def stamp(load_start: list[float]) -> dict:
    return {
        "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "load_start": load_start,
        "load_end": list(os.getloadavg()),
    }


def write_json(path: Path, doc: dict) -> None:
    """Atomically: a half-written file never stands in the course's data."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def record_bench(out: Path, quick: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="record-bench-") as runs:
        argv = [sys.executable, "-m", "ddlkit.bench", "--resnet", "--runs-dir", runs]
        if quick:
            argv += ["--quick", "--steps", "20", "--repeats", "1", "--resnet-steps", "10"]
        subprocess.run(argv, check=True)
        found = sorted(Path(runs).glob("*/bench.json"))
        if len(found) != 1:
            raise SystemExit(f"ddlkit bench left {len(found)} bench.json files in {runs}")
        shutil.copyfile(found[0], out / recorded.BENCH)


def record_allreduce(out: Path, quick: bool) -> None:
    sizes, repeats = ([1024, 65536], 3) if quick else (ba.SIZES, ba.REPEATS)
    measures = {
        "horovod": ba.allreduce,
        "horovod_gloo": lambda s, r, n: ba.allreduce(s, r, n, transport="gloo"),
        "multi_worker": ba.mwms_allreduce,
    }
    for strategy, measure in measures.items():
        load = list(os.getloadavg())
        timing = measure(sizes, repeats, 2)
        doc = timing.to_dict() | {"recorded": stamp(load)}
        write_json(out / recorded.ALLREDUCE[strategy], doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=recorded.DATA, help="default: notebooks/data")
    p.add_argument("--quick", action="store_true", help="tiny runs: checks the recording works")
    p.add_argument("--max-load", type=float, default=0.5, help="1-minute load average to wait for")
    p.add_argument("--wait", type=float, default=600, help="seconds to wait for a quiet machine")
    args = p.parse_args(argv)
    if args.quick and args.out.resolve() == recorded.DATA.resolve():
        raise SystemExit("--quick would overwrite the course's data. Fix: pass --out DIR")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load averages before: {wait_until_quiet(args.max_load, args.wait)}", flush=True)
    record_bench(args.out, args.quick)
    record_allreduce(args.out, args.quick)
    print(recorded.show(data_dir=args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
