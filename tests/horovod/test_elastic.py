"""Notebook 05c's elastic Horovod job, run by hand where ddlkit cannot be imported.

``workers/hvd_elastic.py`` is taken out of the committed notebook and started with
``horovodrun --min-np 1 --max-np 3 --host-discovery-script`` on 2 ranks; the test edits the
discovery script's answer from ``localhost:2`` to ``localhost:3`` and back while the job
trains, as the notebook does. What the notebook states is asserted on the events every rank
wrote: rank 0 trained at sizes 2, 3, 2; the rank that joined started from rank 0's committed
step; no step was taken twice; every epoch was trained in order; the two ranks that finished
hold the same weights, every number; the ranks read different shards (their losses differ
at one step); ``horovodrun`` exited 0 and no rank outlived it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.nbscripts import NOTEBOOKS, no_ddlkit_env, write_scripts

NOTEBOOK = NOTEBOOKS / "05c_elastic_horovod.ipynb"
SCRIPT = "workers/hvd_elastic.py"
EPOCHS, STEPS = 30, 5
TIMEOUT = 300  # seconds for any one wait; TensorFlow ranks on a loaded 2-core machine


def _events(logs: Path) -> list[dict]:
    found = [
        json.loads(line)
        for path in logs.glob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return sorted(found, key=lambda e: e["time"])


def _wait_for(job: subprocess.Popen, logs: Path, condition) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition(_events(logs)):
        assert job.poll() is None, f"horovodrun ended early with {job.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _rank0_batches_at(events: list[dict], size: int) -> int:
    return sum(e["event"] == "batch" and e["size"] == size and e["rank"] == 0 for e in events)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_the_notebooks_elastic_job_grows_and_shrinks_without_redoing_a_step(tmp_path):
    scripts = write_scripts(NOTEBOOK, tmp_path)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    logs = tmp_path / "events"
    logs.mkdir()
    command = [
        sys.executable, "-m", "horovod.runner.launch",
        "-np", "2", "--min-np", "1", "--max-np", "3",
        "--host-discovery-script", str(discover), "--network-interface", "lo", "--gloo",
        sys.executable, str(scripts[SCRIPT]), "--log-dir", str(logs),
        "--epochs", str(EPOCHS), "--steps", str(STEPS), "--pause", "0.05",
    ]  # fmt: skip
    output = tmp_path / "horovodrun.log"
    with open(output, "w") as out:
        job = subprocess.Popen(
            command, env=no_ddlkit_env(tmp_path), cwd=tmp_path, stdout=out, stderr=out
        )
    try:
        _wait_for(job, logs, lambda ev: any(e["event"] == "batch" and e["epoch"] >= 2 for e in ev))
        hosts.write_text("localhost:3\n")
        _wait_for(job, logs, lambda ev: any(e["event"] == "batch" and e["size"] == 3 for e in ev))
        _wait_for(job, logs, lambda ev: _rank0_batches_at(ev, 3) >= 2 * STEPS)
        hosts.write_text("localhost:2\n")
        code = job.wait(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
    log = output.read_text()
    assert code == 0, log[-3000:]

    ev = _events(logs)
    first = next(e["pid"] for e in ev if e["event"] == "start" and e["rank"] == 0)
    rank0 = [e for e in ev if e["pid"] == first]
    sizes = [e["size"] for e in rank0 if e["event"] == "batch"]
    assert [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]] == [2, 3, 2]

    joined = next(e for e in ev if e["event"] == "train" and e["rank"] == 2)
    before = [e["step"] for e in rank0 if e["event"] == "batch" and e["time"] < joined["time"]]
    assert joined["step"] == before[-1] > 0  # rank 0's committed step, synced to the new rank

    steps = [e["step"] for e in rank0 if e["event"] == "batch"]
    assert steps == list(range(1, len(steps) + 1))  # each step once: none redone
    epochs = [e["epoch"] for e in rank0 if e["event"] == "batch"]
    assert epochs == sorted(epochs) and sorted(set(epochs)) == list(range(EPOCHS))

    done = [e for e in ev if e["event"] == "done"]
    assert len(done) == 2 and done[0]["weights"] == done[1]["weights"]  # every number

    # each rank reads its own shard: at the first step both ranks of size 2 logged, on the
    # same (synced) weights, their losses differ
    losses: dict[int, dict[int, float]] = {}
    for e in ev:
        if e["event"] == "batch" and e["size"] == 2:
            losses.setdefault(e["step"], {})[e["rank"]] = e["loss"]
    common = min(s for s, by_rank in losses.items() if len(by_rank) == 2)
    assert losses[common][0] != losses[common][1], losses[common]
    assert "has been removed from elastic job" in log  # the third rank was ended, not finished
    assert not [pid for pid in {e["pid"] for e in ev} if _alive(pid)]
