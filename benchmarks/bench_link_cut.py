"""A pulled cable: how long until a 2-host job fails, and until nothing is left on the hosts.

Makes a demo cluster (two namespaced hosts, each with its own sshd; needs root, iproute2
and openssh-server), starts a long 2-worker job across them, waits for the second
worker's first step record, takes that host's link down, and measures

- ``fail``: seconds from the cut until ``run.wait()`` raises WorkerFailedError;
- ``clean``: seconds from the cut until no process but sshd runs on either host.

Each strategy runs ``--repeats`` times; the table shows every run and the median.
The bound comes from ssh's keep-alive (``SshOptions.alive_interval x alive_count``,
2 s x 3 by default) on the launcher's side, and from the host's sshd and the worker's
watchdog (30 s without the launcher's heartbeat) on the far side.

::

    .venv/bin/python benchmarks/bench_link_cut.py                   # MWMS and Horovod, 1 run each
    .venv/bin/python benchmarks/bench_link_cut.py --strategies multi_worker --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ddlkit as dk
from ddlkit.errors import WorkerFailedError

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "multi_worker": (ROOT / "launch" / "train_multi_worker.py", "worker-1"),
    "horovod": (ROOT / "launch" / "train_horovod.py", "rank-1"),
}


def measure(demo, strategy: str, runs_dir: str, timeout: float) -> tuple[float, float]:
    script, second = SCRIPTS[strategy]
    run = dk.launch.start(
        script,
        strategy=strategy,
        workers=2,
        args=["--steps-per-epoch", "100000"],
        runs_dir=runs_dir,
        where=dk.where.Hosts.demo(demo),
    )
    try:
        deadline = time.monotonic() + timeout
        while not run.records(second):
            if run.job.done or time.monotonic() > deadline:
                raise SystemExit(f"{second} never reported a step:\n{run.tail(second)}")
            time.sleep(0.1)
        demo.cut_link(1)
        cut = time.monotonic()
        try:
            run.wait(timeout=timeout)
            raise SystemExit("the job finished although a host was cut off")
        except WorkerFailedError:
            failed = time.monotonic() - cut
        dk.hosts.drills.wait_idle(demo, timeout=timeout)
        return failed, time.monotonic() - cut
    finally:
        run.stop()
        demo.restore_link(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=list(SCRIPTS), choices=SCRIPTS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    why = dk.hosts.demo.unavailable()
    if why:
        raise SystemExit(f"no demo cluster here: {why}")
    if "horovod" in args.strategies and not dk.horovod.available():
        raise SystemExit("Horovod is not installed: " + dk.horovod.runtime.INSTALL_FIX)
    print(f"{'strategy':<14}{'run':>4}{'fail s':>9}{'clean s':>9}")
    with dk.hosts.demo_cluster(2) as demo, tempfile.TemporaryDirectory() as runs_dir:
        for strategy in args.strategies:
            times = []
            for i in range(args.repeats):
                failed, clean = measure(demo, strategy, runs_dir, args.timeout)
                times.append((failed, clean))
                print(f"{strategy:<14}{i + 1:>4}{failed:>9.1f}{clean:>9.1f}", flush=True)
            fail_med = statistics.median(t[0] for t in times)
            clean_med = statistics.median(t[1] for t in times)
            print(f"{strategy:<14}{'med':>4}{fail_med:>9.1f}{clean_med:>9.1f}")


if __name__ == "__main__":
    main()
