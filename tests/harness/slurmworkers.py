"""Run inside a Slurm allocation (tests/test_slurm.py starts it with ``salloc``): live workers
as srun tasks; prints one JSON line of what happened, for the test to check.

    python tests/harness/slurmworkers.py           # cells, a kill, restart, close
    python tests/harness/slurmworkers.py kernel    # a "kernel" killed outright (SIGKILL)

Everything the test asserts is in that JSON line, so a failure shows what was seen.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ddlkit as dk

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.live import run_pids  # noqa: E402

SHOW = (
    "import os\n"
    "print('task', os.environ['SLURM_PROCID'], os.environ['SLURM_STEP_ID'], "
    "os.environ['DDLKIT_WORKER'], os.environ['TF_CONFIG'])"
)
ALLREDUCE = (
    "import tensorflow as tf\n"
    "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
    "one = tf.constant(1.0 + strategy.cluster_resolver.task_id)\n"
    "print('sum', strategy.reduce('SUM', strategy.run(lambda: one), axis=None).numpy())"
)


def cell(workers, code: str) -> list[str]:
    """Run ``code`` on every worker; the labelled lines it printed."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            workers.run_cell(code)
    except BaseException:
        sys.stderr.write(out.getvalue())  # each worker's traceback, for the test to show
        raise
    return out.getvalue().splitlines()


def gone_within(run_dir: Path, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while run_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return run_pids(run_dir)


def main() -> None:
    out: dict = {"job": os.environ.get("SLURM_JOB_ID")}
    t0 = time.monotonic()
    workers = dk.workers(2, strategy="multi_worker", where=dk.where.Slurm())
    try:
        out["ready_s"] = round(time.monotonic() - t0, 1)
        out["names"] = list(workers.names)
        out["address"] = workers.where.collector_host
        out["processes"] = list(workers.run.job.spec.names)
        out["shown"] = cell(workers, SHOW)
        out["sum"] = [line for line in cell(workers, ALLREDUCE) if " sum " in line]
        workers.kill("worker-1")
        try:
            workers.run_cell("print(1)")
            out["after_kill"] = "no error"
        except dk.interactive.WorkerDiedError as err:
            out["after_kill"] = str(err)
        workers.restart()
        out["restarted"] = cell(workers, "import os\nprint('fresh', os.environ['SLURM_STEP_ID'])")
    finally:
        run_dir = workers.run_dir
        t = time.monotonic()
        workers.close()
        out["close_s"] = round(time.monotonic() - t, 2)
    out["left"] = gone_within(run_dir, 2)
    out["kernel_killed_left"] = killed_kernel()
    print("SLURMWORKERS " + json.dumps(out), flush=True)


def kernel() -> None:
    """The "kernel" of killed_kernel: start the workers, say where, wait to be killed."""
    workers = dk.workers(2, strategy="multi_worker", where=dk.where.Slurm())
    print(workers.run_dir, flush=True)
    time.sleep(600)


def killed_kernel() -> list[int]:
    """A process that made live workers, killed outright: what of them is left 5 s later."""
    child = subprocess.Popen(
        [sys.executable, __file__, "kernel"], stdout=subprocess.PIPE, text=True
    )
    run_dir = Path(child.stdout.readline().strip())
    assert run_pids(run_dir), "the kernel's workers did not start"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    return gone_within(run_dir, 5)


if __name__ == "__main__":
    kernel() if sys.argv[1:] == ["kernel"] else main()
