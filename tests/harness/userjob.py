"""Run as an ordinary user (tests/hosts/test_userhosts.py): a user-mode demo cluster and a
real 2-host job on it; prints one JSON line of what happened, for the test to check.

    python tests/harness/userjob.py RUNS_DIR STRATEGY STEPS

Everything it asserts is also in that JSON line, so a failure shows the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ddlkit as dk

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"multi_worker": "train_multi_worker.py", "horovod": "train_horovod.py"}


def main() -> None:
    runs_dir, strategy, steps = sys.argv[1], sys.argv[2], sys.argv[3]
    out: dict = {"uid": os.geteuid()}
    t0 = time.monotonic()
    demo = dk.hosts.start_demo_cluster(2)  # no kind: an ordinary user gets user-mode hosts
    try:
        out["kind"] = demo.kind
        out["start_s"] = round(time.monotonic() - t0, 2)
        out["names"] = demo.names
        out["addresses"] = demo.addresses
        # plain ssh by name, through the cluster's ssh config
        who = subprocess.run(
            ["ssh", "-F", demo.ssh_config, "host2", "printenv", "SSH_CONNECTION", "USER"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        out["ssh_host2"] = [who.returncode, who.stdout.split()]
        out["preflight_ok"] = dk.hosts.check_hosts(demo.names, demo.ssh).ok
        args = ["--steps-per-epoch", steps, "--epochs", "1", "--batch-size", "32"]
        run = dk.launch.start(
            str(ROOT / "launch" / SCRIPTS[strategy]), strategy=strategy, workers=2, args=args,
            runs_dir=runs_dir, where=dk.where.Hosts.demo(demo),
        )  # fmt: skip
        try:
            result = run.wait(timeout=600)
        finally:
            run.stop()
        out["ok"] = result.ok
        out["base_port"] = run.config.base_port
        out["tasks"] = [[t.host, t.port] for t in run.cluster.tasks] if run.cluster else []
        records = {
            w: [r for r in run.records(w) if r.kind == "step"] for w in run.collector.workers()
        }
        out["steps"] = {w: len(rs) for w, rs in records.items()}
        out["results"] = {w: r.get("steps") for w, r in run.results().items()}
        out["left_on_hosts"] = [demo.processes(i) for i in range(2)]
    finally:
        demo.close()
    out["leftovers"] = demo.leftovers()
    out["seconds"] = round(time.monotonic() - t0, 1)
    print("USERJOB " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
