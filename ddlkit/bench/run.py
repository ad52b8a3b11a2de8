"""Run a strategy benchmark: every case through ``dk.launch.start``, then JSON and a plot.

    result = run_bench(plan_cases(quick=True, cores=2, horovod_available=True))
    result.path          # runs/<bench-id>/bench.json (rewritten after every case)

The one place that starts processes for a benchmark. Fairness on a small machine: a
case with N workers gets the first N x k cores (k = cores per worker, the same in every
case) and the launcher pins each worker to its own of them with matching thread counts;
processes the launcher does not pin (the mirrored and single-device process, PS chief
and ps tasks) inherit that core set. horovodrun starts its ranks itself, so it gets
one core list per local rank in ``DDLKIT_RANK_CPUS`` and each rank pins itself in
``ddlkit.horovod.init()`` (:mod:`ddlkit.horovod.pinning`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit import settings
from ddlkit.bench.config import BenchCase
from ddlkit.bench.overhead import Overhead, measure_overhead
from ddlkit.bench.stats import RunMeasure, Scaling, Spread, measure, scaling, summarize
from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.horovod import pinning
from ddlkit.launch import devices, plan, spec
from ddlkit.launch.runs import new_run_id

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_DIR = ROOT / "launch"
SCHEMA_VERSION = 1


@dataclass
class CaseResult:
    """What a case measured: every repeat, or why it was skipped or failed."""

    case: BenchCase
    runs: list[RunMeasure] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.error and not self.case.skip

    def spread(self, attr: str) -> Spread | None:
        return summarize([getattr(r, attr) for r in self.runs]) if self.runs else None

    def to_dict(self, scale: Scaling | None, single: float | None = None) -> dict:
        c = self.case
        out = {
            "name": c.name,
            "strategy": c.strategy,
            "workers": c.workers,
            "steps": c.steps,
            "batch": c.batch,
            "repeats": c.repeats,
            "model": c.model,
            "skipped": c.skip or None,
            "error": self.error or None,
            "runs": [vars(r) for r in self.runs],
        }
        for attr in ("examples_per_sec", "step_time", "test_accuracy"):
            s = self.spread(attr)
            out[attr] = s.to_dict() if s else None
        out["speedup"] = scale.speedup if scale else None
        out["efficiency"] = scale.efficiency if scale else None
        # against one device without a strategy: what distribution buys overall
        rate = out["examples_per_sec"]
        out["vs_single"] = rate["median"] / single if rate and single else None
        return out


@dataclass
class BenchResult:
    bench_id: str
    bench_dir: Path
    cases: list[CaseResult]
    cores: tuple[int, ...]
    cores_per_worker: int
    quick: bool = False
    overhead: Overhead | None = None
    overhead_error: str = ""
    started: float = field(default_factory=time.time)
    wall_seconds: float = 0.0

    @property
    def path(self) -> Path:
        return self.bench_dir / "bench.json"

    @property
    def plot_path(self) -> Path:
        return self.bench_dir / "bench.png"

    def scaling(self) -> dict[tuple[str, int], Scaling]:
        rates = {
            (r.case.strategy, r.case.workers): r.spread("examples_per_sec").median
            for r in self.cases
            if r.ok
        }
        return scaling(rates)

    def to_dict(self) -> dict:
        scale = self.scaling()
        base = [r for r in self.cases if r.case.strategy == "single" and r.ok]
        single = base[0].spread("examples_per_sec").median if base else None
        return {
            "schema": SCHEMA_VERSION,
            "benchmark": "strategies",
            "bench_id": self.bench_id,
            "created": self.started,
            "quick": self.quick,
            "wall_seconds": self.wall_seconds,
            "machine": {"cores": list(self.cores), "cores_per_worker": self.cores_per_worker},
            "cases": [
                r.to_dict(scale.get((r.case.strategy, r.case.workers)), single) for r in self.cases
            ],
            "overhead": self.overhead.to_dict() if self.overhead else None,
            "overhead_error": self.overhead_error or None,
        }

    def write(self) -> Path:
        """bench.json, atomically (a reader never sees half a file)."""
        self.bench_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        os.replace(tmp, self.path)
        return self.path

    def _repr_html_(self) -> str:
        from ddlkit.bench.report import html_report

        return html_report(self.to_dict())


def cores_per_worker(cases: Sequence[BenchCase], cores: int) -> int:
    """Cores each worker gets, the same in every case: the largest case fills the machine."""
    most = max((c.workers for c in cases if not c.skip), default=1)
    return max(1, cores // most)


def case_cores(workers: int, per_worker: int, cores: tuple[int, ...]) -> tuple[int, ...]:
    """The cores a case may use: its workers' share, all of them when it does not fit (pure)."""
    need = workers * per_worker
    return cores[:need] if need <= len(cores) else cores


@contextlib.contextmanager
def _limited(cpus: tuple[int, ...], env: dict[str, str]) -> Iterator[None]:
    """Start processes on `cpus` with `env` added: children inherit both.

    Affinity is per thread on Linux, so afterwards every thread of this process
    (including the ones start() made, e.g. the metrics collector) gets all cores back.
    """
    original = os.sched_getaffinity(0)
    saved = {k: os.environ.get(k) for k in env}
    os.sched_setaffinity(0, cpus)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(tid), original)


def run_case_once(
    case: BenchCase,
    *,
    cpus: tuple[int, ...],
    threads: int,
    runs_dir: Path,
    launch_dir: Path = LAUNCH_DIR,
    timeout: float = 900,
) -> RunMeasure:
    """One run of `case` on `cpus`: start it, wait, measure it from its step records."""
    from ddlkit.launch.run import start

    env = {}
    if case.strategy == "horovod":  # horovodrun starts the ranks: each pins itself in init()
        env = {**spec.thread_env(threads), **pinning.rank_cpus_env(cpus, case.workers)}
    t0 = time.perf_counter()
    with _limited(cpus, env):
        run = start(
            case.script(launch_dir),
            strategy=case.launch_strategy,
            workers=case.workers,
            args=case.args(),
            runs_dir=runs_dir,
            label=case.name,
        )
    try:
        run.wait(timeout=timeout)
    except JobTimeoutError:
        run.stop()
        raise DdlkitError(
            f"{case.name}: run {run.run_id} did not finish in {timeout:.0f} s and was stopped. "
            f"Fix: fewer --steps, or read its logs in {run.run_dir / 'logs'}."
        ) from None
    finally:
        if not run.job.done:
            run.stop()
    wall = time.perf_counter() - t0
    reports = run.results()
    if not reports:
        raise DdlkitError(f"{case.name}: run {run.run_id} finished without a worker result")
    report = reports[sorted(reports)[0]]  # chief, main, rank-0 or worker-0
    return measure(run.records(), report, run_id=run.run_id, steps=case.steps, wall_seconds=wall)


def run_bench(
    cases: Sequence[BenchCase],
    *,
    runs_dir: str | Path | None = None,
    launch_dir: Path = LAUNCH_DIR,
    quick: bool = False,
    overhead_pairs: int = 0,
    timeout: float = 900,
    progress: Callable[[str], None] | None = print,
) -> BenchResult:
    """Run every case (repeats interleaved: round r runs each case once), write the results.

    A failing run is recorded as that case's error and the benchmark goes on;
    skipped cases are recorded with their reason. ``overhead_pairs`` > 0 then measures
    the kit's overhead (:mod:`ddlkit.bench.overhead`) with as many steps as the cases.
    """
    if not cases:
        raise DdlkitError("no benchmark cases to run. Fix: choose at least one strategy.")
    if any(c.strategy == "horovod" and not c.skip for c in cases):
        if plan.find_horovodrun(sys.executable) is None:
            raise DdlkitError("horovodrun is missing: plan the Horovod cases as skipped")
    say = progress or (lambda _msg: None)
    cores = devices.local_cores()
    per_worker = cores_per_worker(cases, len(cores))
    bench_id = new_run_id("bench")
    bench_dir = Path(runs_dir or settings.runs_dir()) / bench_id
    result = BenchResult(bench_id, bench_dir, [CaseResult(c) for c in cases], cores, per_worker)
    result.quick = quick
    t0 = time.perf_counter()
    result.write()
    for c in result.cases:
        if c.case.skip:
            say(f"{c.case.name}: skipped: {c.case.skip}")
    rounds = max(c.repeats for c in cases)
    for r in range(rounds):
        for c in result.cases:
            if c.case.skip or c.error or r >= c.case.repeats:
                continue
            cpus = case_cores(c.case.workers, per_worker, cores)
            try:
                m = run_case_once(
                    c.case,
                    cpus=cpus,
                    threads=per_worker,
                    runs_dir=bench_dir / "runs",
                    launch_dir=launch_dir,
                    timeout=timeout,
                )
            except DdlkitError as exc:
                c.error = str(exc)
                say(f"{c.case.name}: FAILED: {exc}")
            else:
                c.runs.append(m)
                say(
                    f"{c.case.name} [{r + 1}/{c.case.repeats}] on cores {list(cpus)}: "
                    f"{m.examples_per_sec:.0f} examples/s, {m.step_time * 1000:.1f} ms/step "
                    f"({m.wall_seconds:.0f} s)"
                )
            result.wall_seconds = time.perf_counter() - t0
            result.write()
    if overhead_pairs > 0:
        steps = max(c.steps for c in cases)
        say(f"kit overhead: {overhead_pairs} pair(s) of by-hand and kit runs, {steps} steps")
        try:
            result.overhead = measure_overhead(
                launch_dir / "train_multi_worker.py",
                pairs=overhead_pairs,
                steps=steps,
                cores=cores,
                workdir=bench_dir / "overhead",
                timeout=timeout,
            )
        except DdlkitError as exc:
            result.overhead_error = str(exc)
            say(f"kit overhead: FAILED: {exc}")
        else:
            o = result.overhead
            say(f"kit overhead: ratio {o.ratio:.3f} (kit {o.kit}, by hand {o.by_hand})")
    result.wall_seconds = time.perf_counter() - t0
    result.write()
    from ddlkit.bench.report import save_plot

    save_plot(result.to_dict(), result.plot_path)
    return result
