"""Run a strategy benchmark: every case through ``dk.launch.start``, then JSON and a plot.

    result = run_bench(plan_cases(quick=True, cores=2, horovod_available=True))
    result.path          # runs/<bench-id>/bench.json (rewritten after every case)

The one place that starts processes for a benchmark. Fairness on a small machine: a
case with N workers gets the first N x k cores (k = cores per worker, the same in every
case), passed as ``start(where=ThisMachine(cores=...))``: the launcher pins each worker to
its own of them with matching thread counts and confines the processes it does not pin
(the mirrored and single-device process, PS chief and ps tasks, horovodrun) to that core
set. horovodrun starts its ranks itself, so the launcher gives it one core list per local rank in
``DDLKIT_RANK_CPUS`` and each rank pins itself in ``ddlkit.horovod.init()``
(:mod:`ddlkit.horovod.pinning`). Horovod's timeline goes in ``start(env=...)``. This
process's environment and CPU affinity are left alone. What the machine's other
processes took from those cores during each run is measured (:mod:`ddlkit.bench.cpu`),
not assumed away.

bench.json is written from :class:`ddlkit.bench.schema.BenchFile` (the schema, its
fields and their meaning are documented there, next to the reader).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ddlkit import contract, settings
from ddlkit.bench.config import EVALS_OUTSIDE_STEP_TIME, BenchCase
from ddlkit.bench.cpu import CpuWatch
from ddlkit.bench.measured import BenchResult, CaseResult, machine_info
from ddlkit.bench.overhead import measure_overhead
from ddlkit.bench.schema import SCHEMA_VERSION
from ddlkit.bench.stats import (
    RunMeasure,
    measure,
    warmup_steps,
)
from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.launch import devices, plan
from ddlkit.launch.runs import new_run_id
from ddlkit.where import ThisMachine

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_DIR = ROOT / "launch"
__all__ = ["SCHEMA_VERSION", "BenchResult", "CaseResult", "run_bench", "run_case_once"]


def cores_per_worker(cases: Sequence[BenchCase], cores: int) -> int:
    """Cores each worker gets, the same in every case: the largest case fills the machine."""
    most = max((c.workers for c in cases if not c.skip), default=1)
    return max(1, cores // most)


def case_cores(workers: int, per_worker: int, cores: tuple[int, ...]) -> tuple[int, ...]:
    """The cores a case may use: its workers' share, all of them when it does not fit (pure)."""
    need = workers * per_worker
    return cores[:need] if need <= len(cores) else cores


def run_case_once(
    case: BenchCase,
    *,
    cpus: tuple[int, ...],
    runs_dir: Path,
    launch_dir: Path = LAUNCH_DIR,
    timeout: float = 900,
    target: float | None = None,
    timeline: Path | None = None,
    where=None,
    on_start: Callable | None = None,
) -> RunMeasure:
    """One run of `case` on `cpus`: start it, wait, measure it from its step records.

    Horovod cases write rank 0's timeline to `timeline` (if given): their communication
    (only in a run of its own: the timeline slows the steps). ``where``: another place than
    this machine's ``cpus`` (``dk.where.Hosts``, ``Slurm``...); ``on_start(run)`` is called
    once the run has started (a notebook shows its live dashboard there).
    """
    from ddlkit.launch.run import start

    env = {}
    if timeline is not None and case.strategy == "horovod":
        timeline.parent.mkdir(parents=True, exist_ok=True)
        env["HOROVOD_TIMELINE"] = str(timeline)
    watch = CpuWatch.start(cpus)
    t0 = time.perf_counter()
    # cores: every process of the run on `cpus`, each worker on its own slice of them
    # (horovodrun's ranks pin themselves to theirs, DDLKIT_RANK_CPUS); no global state
    run = start(
        case.script(launch_dir),
        strategy=case.launch_strategy,
        workers=case.workers,
        args=case.args(),
        runs_dir=runs_dir,
        label=case.name,
        where=where or ThisMachine(cores=cpus),
        env=env,
    )
    if on_start is not None:
        on_start(run)
    try:
        run.wait(timeout=timeout)
    except JobTimeoutError:
        run.stop()
        raise DdlkitError(
            f"{case.name}: run {run.run_id} did not finish in {timeout:.0f} s and was stopped. "
            f"Fix: fewer --steps, or read its logs in {contract.logs_dir(run.run_dir)}."
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
    from ddlkit import strategies

    report = reports[strategies.get(case.launch_strategy).speaker(list(reports))]
    return measure(
        run.records(),
        report,
        run_id=run.run_id,
        steps=case.steps,
        wall_seconds=wall,
        target=target,
        foreign_cpu=foreign,
        comm_ms_per_step=comm,
        evals_in_step_time=case.strategy not in EVALS_OUTSIDE_STEP_TIME,
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
    where=None,
    on_start: Callable | None = None,
) -> BenchResult:
    """Run every case (repeats interleaved: round r runs each case once), write the results.

    A failing run is recorded as that case's error and the benchmark goes on;
    skipped cases are recorded with their reason. ``overhead_pairs`` > 0 then measures
    the kit's overhead (:mod:`ddlkit.bench.overhead`) with as many steps as the cases.
    ``target``: the held-out accuracy whose time is measured (cases with eval_every > 0).
    ``where`` and ``on_start``: as :func:`run_case_once` takes them, for every run.
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
                    runs_dir=bench_dir / "runs",
                    launch_dir=launch_dir,
                    timeout=timeout,
                    target=target,
                    where=where,
                    on_start=on_start,
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
                runs_dir=bench_dir / "runs",
                launch_dir=launch_dir,
                timeout=timeout,
                target=target,
                timeline=bench_dir / "timelines" / f"{c.case.name}.json",
                where=where,
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
    from ddlkit.bench.plots import save_png

    save_png(result.results(), result.plot_path)
    return result
