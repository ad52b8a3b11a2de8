"""Run an experiment on the user's model: probe it, run every case, write the results.

    exp = run_experiment(UserModel.of("my_model.py"), ("multi_worker", "horovod"), (1, 2),
                         steps=50)
    exp.table()          # every case: examples/s, step, vs single, vs the ceiling
    exp.costs            # what the model costs a step (ddlkit.experiments.costs)
    exp.predict("DGX-A100")   # 1 to 1,024 workers of a cluster, from the model's costs

The one place that starts processes for an experiment. First the probe
(:mod:`ddlkit.experiments.probe`, one process): a file that cannot train, or a model that
would not fit in the memory each worker gets, is one error and no worker starts. Then the
cases run through the benchmark's runner (:func:`ddlkit.bench.run.run_bench`: the same
fair cores, repeats interleaved, the same statistics and ``bench.json``), each case
``launch/train_user.py`` with the user's file; then ``experiment.json`` beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ddlkit import settings
from ddlkit.errors import ConfigError
from ddlkit.experiments.results import Experiment
from ddlkit.experiments.spec import STRATEGIES, ModelCosts, UserModel, plan
from ddlkit.experiments.user_file import UserFileError

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_DIR = ROOT / "launch"
PROBE_TIMEOUT = 600.0  # seconds: importing TensorFlow, building, one step, the profiler


def check_file(
    user: UserModel, batch: int, *, timeout: float = PROBE_TIMEOUT
) -> tuple[ModelCosts, dict]:
    """The model's costs and the probe's findings, or the one error a bad file gets."""
    with tempfile.TemporaryDirectory(prefix="ddlkit-probe-") as tmp:
        out = Path(tmp) / "probe.json"
        argv = [sys.executable, "-m", "ddlkit.experiments.probe", *user.args(),
                "--batch-size", str(batch), "--out", str(out)]  # fmt: skip
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, cwd=user.path.parent,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise UserFileError(
                f"{user.path.name}: checking it (build, one batch, one step) took over "
                f"{timeout:.0f} s. Fix: a smaller model or batch to experiment with"
            ) from None
        if not out.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise UserFileError(
                f"{user.path.name}: the check stopped before it could say why (exit "
                f"{done.returncode}). Fix: read its last lines:\n{tail}"
            )
        found = json.loads(out.read_text())
    if not found["ok"]:
        raise UserFileError(found["error"])
    return ModelCosts.from_json(found["costs"]), found


# The TensorFlow processes a case runs beside its workers (the launcher's layout): one process
# holds every replica of single and mirrored; the parameter server adds a ps task and the chief.
ONE_PROCESS = frozenset({"single", "mirrored"})
BESIDE_WORKERS = {"parameter_server": 2}


def processes(strategy: str, workers: int) -> int:
    """The TensorFlow processes a case runs at once (pure)."""
    return 1 if strategy in ONE_PROCESS else workers + BESIDE_WORKERS.get(strategy, 0)


def available_memory() -> int:
    """Bytes a new process can have here: the kernel's MemAvailable, or the cgroup's room."""
    room = []
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                room.append(int(line.split()[1]) * 1024)
    limit, used = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")
    if limit.exists() and used.exists() and limit.read_text().strip() != "max":
        room.append(int(limit.read_text()) - int(used.read_text()))
    return min(room) if room else 0


def check_memory(costs: ModelCosts, cases, available: int) -> None:
    """One error if the largest case's processes, each as large as the probe was, would not
    fit in the memory this machine has free (pure given ``available``)."""
    if not available or not costs.peak_rss:
        return
    worst = max((c for c in cases if not c.skip), key=lambda c: processes(c.strategy, c.workers))
    n = processes(worst.strategy, worst.workers)
    need = n * costs.peak_rss
    if need > available:
        raise ConfigError(
            f"{costs.name}: one worker took {costs.peak_rss / 1e9:.2f} GB at batch "
            f"{costs.batch} (measured), so {worst.name}'s {n} processes need about "
            f"{need / 1e9:.1f} GB, and {available / 1e9:.1f} GB are free. Fix: a smaller "
            f"batch or model, fewer workers, or more memory"
        )


def run_experiment(
    user: UserModel,
    strategies: tuple[str, ...] | list[str] = STRATEGIES,
    workers: tuple[int, ...] | list[int] | None = None,
    *,
    steps: int = 50,
    batch: int = 64,
    repeats: int = 1,
    eval_every: int = 0,
    target: float = 0.9,
    where=None,
    on_start=None,
    runs_dir: str | Path | None = None,
    timeout: float = 900,
    progress=print,
) -> Experiment:
    """Probe the user's file, run every case, write bench.json and experiment.json."""
    from ddlkit.bench.run import run_bench
    from ddlkit.launch import devices
    from ddlkit.strategies.horovod import find_horovodrun

    cores = len(devices.local_cores())
    horovod = find_horovodrun(sys.executable) is not None
    cases = plan(user, strategies, workers, steps=steps, cores=cores, horovod_available=horovod,
                 batch=batch, repeats=repeats, eval_every=eval_every)  # fmt: skip
    say = progress or (lambda _msg: None)
    say(f"checking {user.path.name}: import, build, one batch, one step, costs")
    costs, found = check_file(user, batch)
    if eval_every and not found["eval"]:
        raise ConfigError(
            f"eval_every={eval_every} but {user.path.name} has no held-out set. Fix: define "
            f"eval_dataset(batch_size) in it, or eval_every=0"
        )
    check_memory(costs, cases, available_memory())
    result = run_bench(
        cases,
        runs_dir=runs_dir or settings.runs_dir(),
        launch_dir=LAUNCH_DIR,
        timeout=timeout,
        target=target,
        command=f"experiment {user.path.name}",
        progress=progress,
        where=where,
        on_start=on_start,
    )
    exp = Experiment.load(result.path.parent, costs=costs)
    exp.write()
    return exp
