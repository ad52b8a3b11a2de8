"""The kit's own overhead: a job launched through ddlkit with live metrics vs by hand.

The same 2-worker MultiWorkerMirroredStrategy script runs both ways, alternating, in
one benchmark: by hand as TensorFlow's tutorial starts it (one ``python`` per worker
with its ``TF_CONFIG``), through :func:`ddlkit.launch.start` with the metrics
collector on. Both sides get the same cores and thread counts, so the ratio measures
the launcher and live metrics alone. Throughput is the steady-state rate of the step
records (after the warm-up, all workers added up: :func:`ddlkit.bench.stats.measure`'s
rule), from the collector through the kit and from the script's local metrics files by
hand. Not the rate in the script's ``RESULT`` line: a worker's fit time includes
waiting for the other to start, so worker 0's rate swings with which one started last
(measured: 692 vs 1301 examples/s for the same job).
Pairs alternate which side runs first (hand-kit, kit-hand, ...), so a machine whose load
drifts during the benchmark does not favour one side; the ratio is the median of the
pairs' ratios, with their range as the spread.
Ratio kit / by hand: 1.0 is no overhead; the issue's goal is at least 0.97.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlkit.backend import keras_env
from ddlkit.bench.schema import OverheadRecord
from ddlkit.bench.stats import steady, warmup_steps
from ddlkit.cluster import ClusterSpec
from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.launch import spec
from ddlkit.results import throughput

WORKERS = 2


@dataclass(frozen=True)
class HandWorker:
    """One process started by hand: its command, whole environment, cores, log, and the
    directory of its local metrics file (``DDLKIT_RUNS``)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cpus: tuple[int, ...]
    log: Path
    runs: Path | None = None


def by_hand_workers(
    script: Path,
    args: Sequence[str],
    cluster: ClusterSpec,
    cpus: Sequence[tuple[int, ...]],
    threads: int,
    workdir: Path,
    base_env: dict[str, str],
) -> list[HandWorker]:
    """The processes of a by-hand run (pure): TF_CONFIG, Keras choice, threads, nothing else.

    ddlkit's own variables are left out of `base_env`, so the script runs as it would
    without the kit (its local metrics file goes to `workdir`, no collector).
    """
    clean = {k: v for k, v in base_env.items() if not k.startswith("DDLKIT_")}
    workers = []
    for i, task in enumerate(t for t in cluster.tasks if t.role == "worker"):
        env = {**clean, **keras_env("tf-keras"), **spec.thread_env(threads)}
        env["TF_CONFIG"] = cluster.tf_config_json(task)
        runs = workdir / f"hand-{i}"
        env["DDLKIT_RUNS"] = str(runs)
        argv = (sys.executable, str(script), *args)
        workers.append(HandWorker(argv, env, tuple(cpus[i]), workdir / f"hand-{i}.log", runs))
    return workers


def result_line(text: str) -> dict:
    """The last ``RESULT {...}`` line a worker script printed (launch/_common.py report)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise DdlkitError(f"no RESULT line in the worker's output; its end:\n{text[-1500:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def hand_records(workers: Sequence[HandWorker]) -> list:
    """The step records of a finished by-hand run, from each worker's local metrics file
    (every file names its worker ``local``: renamed ``hand-N`` here)."""
    from ddlkit.metrics.store import read_jsonl

    out = []
    for i, w in enumerate(workers):
        files = sorted(w.runs.glob("*/metrics/*.jsonl")) if w.runs else []
        if len(files) != 1:
            raise DdlkitError(
                f"by-hand worker {i} left {len(files)} metrics files in {w.runs}, expected 1"
            )
        records, _gaps = read_jsonl(files[0])
        out += [dataclasses.replace(r, worker=f"hand-{i}") for r in records]
    return out


def run_by_hand(workers: Sequence[HandWorker], timeout: float, steps: int) -> float:
    """Start every worker, wait for all; the steady-state examples/s of all of them.
    Nothing is left running: on failure or timeout every worker is killed."""
    procs = []
    try:
        for w in workers:
            w.log.parent.mkdir(parents=True, exist_ok=True)
            with open(w.log, "w") as log:
                procs.append(
                    subprocess.Popen(
                        w.argv,
                        env=w.env,
                        cwd=w.log.parent,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=lambda cpus=w.cpus: os.sched_setaffinity(0, cpus),
                    )
                )
        for p, w in zip(procs, workers, strict=True):
            if p.wait(timeout=timeout) != 0:
                raise DdlkitError(
                    f"by-hand worker {w.argv[1]} exited with {p.returncode}; log: {w.log}"
                )
    except subprocess.TimeoutExpired:
        raise DdlkitError(f"by-hand run did not finish in {timeout:.0f} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    result_line(workers[0].log.read_text())  # it finished and reported
    return steady_rate(hand_records(workers), steps)


def steady_rate(records: Sequence, steps: int) -> float:
    """Examples/s of all workers after the warm-up steps, as the benchmark measures runs."""
    kept = steady(records, warmup_steps(steps))
    if not kept:
        raise DdlkitError(f"no step records after the first {warmup_steps(steps)} steps")
    return throughput(kept, skip=0)


def run_through_kit(
    script: Path, args: Sequence[str], runs_dir: Path, timeout: float, steps: int
) -> float:
    from ddlkit.launch.run import start

    run = start(script, strategy="multi_worker", workers=WORKERS, args=args, runs_dir=runs_dir)
    try:
        run.wait(timeout=timeout)
    except JobTimeoutError:
        raise DdlkitError(f"kit run {run.run_id} did not finish in {timeout:.0f} s") from None
    finally:
        if not run.job.done:
            run.stop()
    return steady_rate(run.records(), steps)


@dataclass(frozen=True)
class Overhead:
    """Kit vs by-hand examples/s, pair by pair, and the median ratio."""

    by_hand: tuple[float, ...]
    kit: tuple[float, ...]
    order: tuple[str, ...] = ()  # per pair: "hand-first" or "kit-first"
    steps: int = 0

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(k / h for k, h in zip(self.kit, self.by_hand, strict=True))

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def to_record(self) -> OverheadRecord:
        """As bench.json holds it (:class:`ddlkit.bench.schema.OverheadRecord`)."""
        ratios = self.ratios
        return OverheadRecord(
            ratio_median=self.ratio,
            ratios=ratios,
            by_hand=self.by_hand,
            kit=self.kit,
            ratio_min=min(ratios),
            ratio_max=max(ratios),
            order=self.order,
            workers=WORKERS,
            steps=self.steps,
        )

    def to_dict(self) -> dict:
        return self.to_record().to_json()


def measure_overhead(
    script: Path,
    *,
    pairs: int,
    steps: int,
    cores: tuple[int, ...],
    workdir: Path,
    timeout: float = 900,
    args: Sequence[str] | None = None,
) -> Overhead:
    """`pairs` alternating by-hand and kit runs of `script` with 2 workers, `steps` steps.

    Each worker gets the cores the launcher would give it (ddlkit.launch.devices.assign).
    ``args``: the script's arguments for `steps` steps (default: the kit's MNIST scripts'
    ``--epochs 1 --steps-per-epoch <steps>``).
    """
    from ddlkit.launch import devices

    if pairs < 1:
        raise DdlkitError(f"overhead pairs={pairs}: need at least 1")
    script = Path(script).resolve()  # by-hand workers run in their own directories
    if not script.is_file():
        raise DdlkitError(f"script {script} not found. Fix: pass launch/train_multi_worker.py.")
    shares = devices.assign(WORKERS, cores)
    cpus = [s.cpus or cores for s in shares]
    threads = shares[0].threads or 1
    if args is None:
        args = ["--epochs", "1", "--steps-per-epoch", str(steps)]
    hand, kit, order = [], [], []
    for i in range(pairs):
        cluster = ClusterSpec.local(workers=WORKERS)  # fresh free ports each time
        hand_dir = workdir / f"by-hand-{i}"
        workers = by_hand_workers(script, args, cluster, cpus, threads, hand_dir, dict(os.environ))
        order.append(pair_order(i))
        if order[-1] == "hand-first":
            hand.append(run_by_hand(workers, timeout, steps))
            kit.append(run_through_kit(script, args, workdir / "runs", timeout, steps))
        else:
            kit.append(run_through_kit(script, args, workdir / "runs", timeout, steps))
            hand.append(run_by_hand(workers, timeout, steps))
    return Overhead(tuple(hand), tuple(kit), tuple(order), steps)


def pair_order(i: int) -> str:
    """Which side of pair `i` runs first: alternating, by hand first (pure)."""
    return "hand-first" if i % 2 == 0 else "kit-first"
