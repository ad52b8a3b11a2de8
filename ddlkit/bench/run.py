"""Run a strategy benchmark: every case through ``dk.launch.start``, then JSON and a plot.

    result = run_bench(plan_cases(quick=True, cores=2, horovod_available=True))
    result.path          # runs/<bench-id>/bench.json (rewritten after every case)

The one place that starts processes for a benchmark. Fairness on a small machine: a
case with N workers gets the first N x k cores (k = cores per worker, the same in every
case) and the launcher pins each worker to its own of them with matching thread counts;
processes the launcher does not pin (the mirrored and single-device process, PS chief
and ps tasks) inherit that core set. horovodrun starts its ranks itself, so it gets
one core list per local rank in ``DDLKIT_RANK_CPUS`` and each rank pins itself in
``ddlkit.horovod.init()`` (:mod:`ddlkit.horovod.pinning`). What the machine's other
processes took from those cores during each run is measured (:mod:`ddlkit.bench.cpu`),
not assumed away.

bench.json (``SCHEMA_VERSION`` 2; every number is a plain float, None when absent)::

    schema: 2, benchmark: "strategies", bench_id: str, created: float (unix time),
    created_utc: str (ISO 8601), quick: bool, wall_seconds: float,
    command: str (how the benchmark was started), target_accuracy: float,
    machine: {cores: [int], cores_per_worker: int, cpu_model: str, python: str,
              tensorflow: str | None, horovod: str | None,
              load_start: [1, 5, 15 min load averages], load_end: [...]},
    cases: [ {
        name: "multi_worker-x2", strategy: str (single, independent, mirrored,
        multi_worker, parameter_server, horovod; independent-xN: N single-device
        processes that never communicate, the machine's scaling ceiling), workers: int,
        steps: int,
        batch: int (per replica), repeats: int, model: str (data set of the CNN),
        eval_every: int (0: no held-out evals), eval_examples: int,
        skipped: str | None (why the case did not run), error: str | None,
        runs: [ {run_id, examples_per_sec, step_time (s), test_accuracy, wall_seconds,
                 seconds_to_target | None, best_eval_accuracy | None, evals: int,
                 foreign_cpu | None (0..1 share of the case's cores used by other
                 processes), comm_ms_per_step | None} ],
        examples_per_sec, step_time, test_accuracy, foreign_cpu:
            {median, min, max, n} | None   (over the runs),
        seconds_to_target: {median, min, max, n} | None  (over the runs that reached it),
        target_reached: "k/n" runs, target_note: str | None (e.g. "not reached in 60
            steps (best 0.93)"),
        speedup: float | None (throughput / the same strategy's x1; independent: single-x1),
        efficiency: float | None (speedup / workers),
        vs_single: float | None (throughput / single-x1's),
        comm: {share: float | None (0..1 of a step), ms_per_step: float | None,
               how: str (measured how, estimated how, or why not measured)},
        profile_run: a run as in runs | None (Horovod x2+: the extra run with the timeline
            on that comm is measured in; not part of the medians),
    } ],
    overhead: {by_hand: [examples/s], kit: [...], ratios: [...], ratio_median: float,
               ratio_min: float, ratio_max: float, order: ["hand-first" | "kit-first"],
               workers: int, steps: int} | None,
    overhead_error: str | None
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ddlkit import settings
from ddlkit.bench.config import BenchCase
from ddlkit.bench.cpu import CpuWatch
from ddlkit.bench.overhead import Overhead, measure_overhead
from ddlkit.bench.stats import (
    RunMeasure,
    Scaling,
    Spread,
    communication,
    measure,
    scaling,
    summarize,
    warmup_steps,
)
from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.horovod import pinning
from ddlkit.launch import devices, plan, spec
from ddlkit.launch.runs import new_run_id

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_DIR = ROOT / "launch"
SCHEMA_VERSION = 2


@dataclass
class CaseResult:
    """What a case measured: every repeat, or why it was skipped or failed."""

    case: BenchCase
    runs: list[RunMeasure] = field(default_factory=list)
    error: str = ""
    profile: RunMeasure | None = None  # Horovod: one extra run with the timeline on

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.error and not self.case.skip

    def spread(self, attr: str) -> Spread | None:
        return summarize([getattr(r, attr) for r in self.runs]) if self.runs else None

    def to_dict(
        self, scale: Scaling | None, single: float | None = None, single_step: float | None = None
    ) -> dict:
        c = self.case
        out = {
            "name": c.name,
            "strategy": c.strategy,
            "workers": c.workers,
            "steps": c.steps,
            "batch": c.batch,
            "repeats": c.repeats,
            "model": c.model,
            "eval_every": c.eval_every,
            "eval_examples": c.eval_examples,
            "skipped": c.skip or None,
            "error": self.error or None,
            "runs": [vars(r) for r in self.runs],
        }
        for attr in ("examples_per_sec", "step_time", "test_accuracy"):
            s = self.spread(attr)
            out[attr] = s.to_dict() if s else None
        foreign = [r.foreign_cpu for r in self.runs if r.foreign_cpu is not None]
        out["foreign_cpu"] = summarize(foreign).to_dict() if foreign else None
        out.update(self._target())
        step = out["step_time"] and out["step_time"]["median"]
        p = self.profile
        out["comm"] = communication(
            c.strategy,
            step,
            p and p.comm_ms_per_step,
            single_step,
            workers=c.workers,
            profiled_step_time=p and p.step_time,
        ).to_dict()
        out["profile_run"] = vars(p) if p else None
        out["speedup"] = scale.speedup if scale else None
        out["efficiency"] = scale.efficiency if scale else None
        # against one device without a strategy: what distribution buys overall
        rate = out["examples_per_sec"]
        out["vs_single"] = rate["median"] / single if rate and single else None
        return out

    def _target(self) -> dict:
        reached = [r.seconds_to_target for r in self.runs if r.seconds_to_target is not None]
        note = None
        if not self.case.eval_every:
            note = "not measured: no held-out evaluations (eval_every 0)"
        elif self.runs and len(reached) < len(self.runs):
            best = max((r.best_eval_accuracy or 0.0) for r in self.runs)
            note = (
                f"not reached in {self.case.steps} steps by {len(self.runs) - len(reached)} "
                f"of {len(self.runs)} runs (best held-out accuracy {best:.3f})"
            )
        return {
            "seconds_to_target": summarize(reached).to_dict() if reached else None,
            "target_reached": f"{len(reached)}/{len(self.runs)}",
            "target_note": note,
        }


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
    target: float = 0.95
    command: str = ""
    machine: dict = field(default_factory=dict)

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
        single_step = base[0].spread("step_time").median if base else None
        machine = {"cores": list(self.cores), "cores_per_worker": self.cores_per_worker}
        return {
            "schema": SCHEMA_VERSION,
            "benchmark": "strategies",
            "bench_id": self.bench_id,
            "created": self.started,
            "created_utc": datetime.fromtimestamp(self.started, UTC).isoformat(),
            "quick": self.quick,
            "wall_seconds": self.wall_seconds,
            "command": self.command,
            "target_accuracy": self.target,
            "machine": {**machine, **self.machine},
            "cases": [
                r.to_dict(scale.get((r.case.strategy, r.case.workers)), single, single_step)
                for r in self.cases
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


def machine_info() -> dict:
    """What ran the benchmark: CPU model, versions, load averages now (for bench.json)."""
    import platform
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    model = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((ln.split(":", 1)[1].strip() for ln in lines if "model name" in ln), "")
    return {
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "tensorflow": version("tensorflow-cpu") or version("tensorflow"),
        "horovod": version("horovod"),
        "load_start": list(os.getloadavg()),
    }


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
    target: float | None = None,
    timeline: Path | None = None,
) -> RunMeasure:
    """One run of `case` on `cpus`: start it, wait, measure it from its step records.

    Horovod cases write rank 0's timeline to `timeline` (if given): their communication
    (only in a run of its own: the timeline slows the steps).
    """
    from ddlkit.launch.run import start

    env = {}
    if case.strategy == "horovod":  # horovodrun starts the ranks: each pins itself in init()
        env = {**spec.thread_env(threads), **pinning.rank_cpus_env(cpus, case.workers)}
        if timeline is not None:
            timeline.parent.mkdir(parents=True, exist_ok=True)
            env["HOROVOD_TIMELINE"] = str(timeline)
    watch = CpuWatch.start(cpus)
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
    foreign = watch.foreign_share()
    comm = None
    if timeline is not None and case.strategy == "horovod":
        from ddlkit.horovod.timeline import load_timeline

        spans = load_timeline(timeline)
        ms, counted = spans.per_step("ALLREDUCE", skip=warmup_steps(case.steps))
        if counted:
            comm = ms
    reports = run.results()
    if not reports:
        raise DdlkitError(f"{case.name}: run {run.run_id} finished without a worker result")
    report = reports[sorted(reports)[0]]  # chief, main, rank-0 or worker-0
    return measure(
        run.records(),
        report,
        run_id=run.run_id,
        steps=case.steps,
        wall_seconds=wall,
        target=target,
        foreign_cpu=foreign,
        comm_ms_per_step=comm,
    )


def run_bench(
    cases: Sequence[BenchCase],
    *,
    runs_dir: str | Path | None = None,
    launch_dir: Path = LAUNCH_DIR,
    quick: bool = False,
    overhead_pairs: int = 0,
    timeout: float = 900,
    target: float = 0.95,
    command: str = "",
    progress: Callable[[str], None] | None = print,
) -> BenchResult:
    """Run every case (repeats interleaved: round r runs each case once), write the results.

    A failing run is recorded as that case's error and the benchmark goes on;
    skipped cases are recorded with their reason. ``overhead_pairs`` > 0 then measures
    the kit's overhead (:mod:`ddlkit.bench.overhead`) with as many steps as the cases.
    ``target``: the held-out accuracy whose time is measured (cases with eval_every > 0).
    """
    if not 0 < target <= 1:
        raise DdlkitError(f"target accuracy {target}: must be in (0, 1]. Fix: e.g. 0.95.")
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
    result.target, result.command = target, command
    result.machine = machine_info()
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
                    target=target,
                )
            except DdlkitError as exc:
                c.error = str(exc)
                say(f"{c.case.name}: FAILED: {exc}")
            else:
                c.runs.append(m)
                to_target = m.seconds_to_target
                say(
                    f"{c.case.name} [{r + 1}/{c.case.repeats}] on cores {list(cpus)}: "
                    f"{m.examples_per_sec:.0f} examples/s, {m.step_time * 1000:.1f} ms/step, "
                    f"{target:.2f} acc in "
                    f"{'-' if to_target is None else f'{to_target:.1f} s'}, others used "
                    f"{'?' if m.foreign_cpu is None else f'{m.foreign_cpu:.0%}'} of the cores "
                    f"({m.wall_seconds:.0f} s)"
                )
            result.wall_seconds = time.perf_counter() - t0
            result.write()
    for c in result.cases:  # Horovod's communication, from a timeline in a run of its own
        if c.case.strategy != "horovod" or c.case.workers < 2 or not c.ok:
            continue
        cpus = case_cores(c.case.workers, per_worker, cores)
        try:
            c.profile = run_case_once(
                c.case,
                cpus=cpus,
                threads=per_worker,
                runs_dir=bench_dir / "runs",
                launch_dir=launch_dir,
                timeout=timeout,
                target=target,
                timeline=bench_dir / "timelines" / f"{c.case.name}.json",
            )
        except DdlkitError as exc:
            say(f"{c.case.name}: timeline run FAILED: {exc}")
        else:
            say(
                f"{c.case.name} with Horovod's timeline: allreduce "
                f"{c.profile.comm_ms_per_step:.1f} ms of a {c.profile.step_time * 1000:.1f} ms step"
            )
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
    result.machine["load_end"] = list(os.getloadavg())
    result.write()
    from ddlkit.bench.report import save_plot

    save_plot(result.to_dict(), result.plot_path)
    return result
