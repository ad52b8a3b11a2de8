"""Latency from a worker's record to the notebook's collector, and records lost.

Starts a Collector in this process and N worker processes that each send
step records through :class:`ddlkit.metrics.Reporter` at a steady rate (like
a training loop). Each record carries the worker's ``time.time()``; the
collector stamps its arrival with the same machine clock. Prints JSON with
p50/p95/p99/max latency and the records lost (expected minus received, and
the collector's seq gaps), and checks every worker's JSONL file too.

Goal (issue 3): p95 <= 500 ms, lost = 0. Exit status 1 when a goal is missed.

    python benchmarks/bench_collector_latency.py --quick     # ~10 s
    python benchmarks/bench_collector_latency.py --records 3000 --rate 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from ddlkit.metrics import Collector, load_run

WORKER = """
import sys, time
from ddlkit.metrics import Reporter

records, rate = int(sys.argv[1]), float(sys.argv[2])
reporter = Reporter()
start = time.perf_counter()
for i in range(records):
    delay = start + i / rate - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    reporter.step(step=i + 1, epoch=0, loss=1.0 / (i + 1), accuracy=0.5, batch_size=64)
stats = reporter.close(timeout=10.0)
print(stats.sent, stats.dropped)
"""

P95_GOAL_MS = 500.0


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def run(workers: int, records: int, rate: float, run_dir: str) -> dict:
    with Collector(run_dir) as collector:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(records), str(rate)],
                env={**os.environ, **collector.env(), "DDLKIT_WORKER": f"worker-{rank}"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(workers)
        ]
        timeout = records / rate + 60
        outputs = [proc.communicate(timeout=timeout) for proc in procs]
        failed = [
            err[-2000:] for proc, (_, err) in zip(procs, outputs, strict=True) if proc.returncode
        ]
        if failed:
            raise SystemExit(f"a worker failed:\n{failed[0]}")
        expected = workers * records
        collector.wait_for(expected - 1, timeout=5.0)
        arrivals = collector.arrivals()
        stats = collector.stats()
    on_disk = load_run(run_dir)
    latencies = sorted((arrived - record.wall_time) * 1000 for record, arrived in arrivals)
    received = len(arrivals)
    result = {
        "workers": workers,
        "records_per_worker": records,
        "rate_per_worker_hz": rate,
        "expected": expected,
        "received": received,
        "lost": expected - received,
        "seq_gaps": stats.gaps,
        "malformed": stats.malformed,
        "in_jsonl_files": len(on_disk),
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 3),
            "p95": round(percentile(latencies, 95), 3),
            "p99": round(percentile(latencies, 99), 3),
            "max": round(latencies[-1], 3),
        }
        if latencies
        else None,
        "goal": {"p95_ms": P95_GOAL_MS, "lost": 0},
    }
    result["goals_met"] = bool(
        latencies and result["latency_ms"]["p95"] <= P95_GOAL_MS and result["lost"] == 0
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--records", type=int, default=3000, help="step records per worker")
    parser.add_argument("--rate", type=float, default=100.0, help="records per second per worker")
    parser.add_argument("--quick", action="store_true", help="500 records at 50/s (~10 s)")
    parser.add_argument("--run-dir", help="where workers write JSONL (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.rate = 500, 50.0
    if args.workers < 1 or args.records < 1 or args.rate <= 0:
        parser.error("--workers and --records must be >= 1 and --rate > 0")
    started = time.monotonic()
    if args.run_dir:
        result = run(args.workers, args.records, args.rate, args.run_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="ddlkit-bench-") as run_dir:
            result = run(args.workers, args.records, args.rate, run_dir)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    return 0 if result["goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
