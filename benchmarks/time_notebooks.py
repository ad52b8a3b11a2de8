"""How long each lesson takes at its default sizes: ``notebooks/data/notebook-times.json``.

    .venv/bin/python benchmarks/time_notebooks.py                 # every lesson, quiet machine
    .venv/bin/python benchmarks/time_notebooks.py 05_horovod 08_performance   # some of them

A learner runs a notebook at the sizes its ``parameters`` cell holds, not CI's fast mode, and
its first cell says how long that takes ("About 4 minutes on 2 cores"). This runs each lesson
so (``DDLKIT_FAST=0``), top to bottom, under nbval as CI runs them, one at a time, notebook
00 first (its baseline is what the others compare with), and records the wall seconds of each
with the machine it ran on: the CPU, whether TensorFlow's oneDNN was on, the cores and the
1-minute load before and after. It waits for a quiet machine as ``record_course_data.py``
does, and a notebook that fails is recorded as failed (its time means nothing), never as a
time. ``dk.recorded`` reads the file (``runtime.<notebook>.minutes``), and
``tests/notebooks/test_claims.py`` checks every notebook's first cell against it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from record_course_data import wait_until_quiet

from ddlkit import cpu, recorded

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def lessons(names: list[str]) -> list[Path]:
    """The lessons to time, notebook 00 first; ``names`` are stems (all when empty)."""
    every = sorted(NOTEBOOKS.glob("*.ipynb"))
    if names:
        unknown = sorted(set(names) - {p.stem for p in every})
        if unknown:
            raise SystemExit(f"no lesson {', '.join(unknown)}. Fix: use stems of notebooks/*.ipynb")
        every = [p for p in every if p.stem in names or p.stem.startswith("00_")]
    return every


def time_one(notebook: Path, log: Path) -> dict:
    """Run one notebook at its default sizes; its wall seconds, exit code and loads."""
    env = {**os.environ, "DDLKIT_FAST": "0", "DDLKIT_PLOTS": "static"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=0",
            "--nbval-cell-timeout=7200", str(notebook)]  # fmt: skip
    before = os.getloadavg()
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    seconds = time.monotonic() - start
    return {"seconds": round(seconds, 1), "ok": code == 0, "exit_code": code,
            "load_before": [round(x, 2) for x in before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="stems to time (default: every lesson)")
    parser.add_argument("--out", type=Path, default=recorded.DATA / recorded.TIMES)
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--wait", type=float, default=600.0)
    args = parser.parse_args(argv)
    chosen = lessons(args.notebooks)
    machine = cpu.read()
    data = json.loads(args.out.read_text()) if args.out.exists() else {"notebooks": {}}
    data["machine"] = {
        "cpu": machine.cpu.model,
        "onednn": machine.onednn,
        "cores": len(os.sched_getaffinity(0)),
    }
    logs = ROOT / "runs" / "notebook-times"
    logs.mkdir(parents=True, exist_ok=True)
    for notebook in chosen:
        wait_until_quiet(args.max_load, args.wait)
        result = time_one(notebook, logs / f"{notebook.stem}.log")
        result["recorded"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        data["notebooks"][notebook.stem] = result
        state = (
            f"{result['seconds']:.0f} s" if result["ok"] else f"FAILED ({logs / notebook.stem}.log)"
        )
        print(f"{notebook.stem}: {state}", flush=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(args.out)
    failed = [n for n, r in data["notebooks"].items() if not r["ok"]]
    if failed:
        print(f"failed, no time recorded for them: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
