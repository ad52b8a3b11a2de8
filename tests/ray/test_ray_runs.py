"""The kit's MWMS script as Ray actors on a real 2-node Ray cluster (no mocks).

Each worker trains a few steps on its own node, both workers' records reach this process's
collector and the workers end with identical weights; a worker killed mid-run fails the job
within seconds, naming it, and leaves no actor nor placement group on the cluster; a run that
asks for more CPUs than the cluster has is refused before anything starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.procutil import alive, wait_until

from ddlkit.errors import ConfigError, WorkerFailedError
from ddlkit.launch import run as run_mod
from ddlkit.metrics.protocol import is_loopback
from ddlkit.procs import descendants
from ddlkit.where import Ray

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "train_multi_worker.py"
STEPS = ["--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "32"]
pytestmark = pytest.mark.slow


def _start(cluster, tmp_path, args=STEPS, workers=2, placement="STRICT_SPREAD"):
    return run_mod.start(
        SCRIPT,
        strategy="multi_worker",
        workers=workers,
        args=args,
        where=Ray(cluster.address, placement=placement, collector_host="auto"),
        runs_dir=tmp_path,
    )


def _cluster_holds(cluster) -> dict:
    """The actors and placement groups the cluster still holds, as its GCS says (Ray's state
    API needs the dashboard, which the local cluster does not start)."""
    code = (
        "import json, ray\n"
        "from ray._private import state\n"
        "from ray.util import placement_group_table\n"
        "ray.init(log_to_driver=False, logging_level='ERROR')\n"
        "actors = [a['State'] for a in state.actors().values() if a['State'] != 'DEAD']\n"
        "groups = [g['state'] for g in placement_group_table().values()"
        " if g['state'] != 'REMOVED']\n"
        "print(json.dumps({'actors': actors, 'groups': groups, "
        "'cpus': ray.available_resources().get('CPU', 0)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # Ray's own log lines may follow on stdout (e.g. a warning about the node just restarted)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(lines[-1])


def test_mwms_trains_as_actors_on_two_nodes_with_live_metrics(ray_cluster, data_env, tmp_path):
    run = _start(ray_cluster, tmp_path)
    result = run.wait(timeout=300)
    assert result.ok, run.tail("ray-driver", 60)
    names = ["worker-0", "worker-1"]
    reports = run.results()
    assert sorted(reports) == names, (reports, run.tail("ray-driver", 40))
    a, b = (reports[n] for n in names)
    assert a["weights_checksum"] == b["weights_checksum"], "workers diverged"
    assert a["replicas"] == b["replicas"] == 2 and a["steps"] == 4
    for name in names:  # every worker's steps reached this process's collector, live
        assert [r.kind for r in run.records(name)].count("step") == 4, name
    driver = run.tail("ray-driver", 40)
    # STRICT_SPREAD: one worker on each node (another host as root), each node's address in
    # the TF_CONFIG, and the steps came back from both to a collector they reach
    ran_on = {line.rsplit("on node ", 1)[1].rstrip(")") for line in driver.splitlines()
              if ": finished in " in line}  # fmt: skip
    assert ran_on == set(ray_cluster.info.nodes), driver
    head = ray_cluster.address.rpartition(":")[0]
    assert run.collector.host == ("127.0.0.1" if is_loopback(head) else head), run.collector.host
    assert "worker-1: finished" in driver
    held = _cluster_holds(ray_cluster)
    assert held["actors"] == [] and held["groups"] == [] and held["cpus"] == 2, held


def _worker_pid(cluster, name: str) -> int | None:
    """The training process an actor started (below a node's raylet)."""
    for node in cluster.procs:
        for pid, cmd in descendants(node.pid):
            if SCRIPT.name in cmd and "ddlkit.ray" not in cmd and f"={name}\0" in _env(pid):
                return pid
    return None


def _env(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_killed_worker_fails_the_job_fast_naming_it(ray_cluster, data_env, tmp_path):
    args = ["--epochs", "1", "--steps-per-epoch", "100000", "--batch-size", "32"]
    run = _start(ray_cluster, tmp_path, args)
    assert wait_until(lambda: run.records("worker-1"), 240, step=0.2), run.tail("ray-driver")
    pid = _worker_pid(ray_cluster, "worker-1")
    assert pid is not None
    other = _worker_pid(ray_cluster, "worker-0")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerFailedError) as failed:
        run.wait(timeout=60)
    took = time.monotonic() - killed
    # Seconds: the actor sees its child die and returns the failure; the driver then kills
    # every actor. Left alone, worker-0 would wait in its all-reduce for TensorFlow's timeout.
    assert took < 30, f"the job took {took:.0f} s to fail"
    text = str(failed.value)
    assert "worker-1" in text and "Ray actor 1" in text and "SIGKILL" in text, text
    assert wait_until(lambda: not alive(other), 15), "worker-0's training process was left"
    assert not alive(run.job._procs["ray-driver"].pid)
    held = _cluster_holds(ray_cluster)
    assert held["actors"] == [] and held["groups"] == [] and held["cpus"] == 2, held


def test_more_workers_than_the_clusters_cpus_is_refused(ray_cluster, tmp_path):
    with pytest.raises(ConfigError) as refused:
        _start(ray_cluster, tmp_path, workers=3)
    text = str(refused.value)
    assert "3 workers need 3 CPUs" in text and "has 2 of 2 CPUs free" in text, text
    assert "local_cluster(nodes=3)" in text, text
    assert list(tmp_path.iterdir()) == []  # no run directory: nothing started
    held = _cluster_holds(ray_cluster)
    assert held["actors"] == [] and held["groups"] == [], held


def test_horovod_ranks_through_horovod_ray(ray_cluster, data_env, tmp_path):
    run = run_mod.start(
        SCRIPT.with_name("train_horovod.py"),
        strategy="horovod",
        workers=2,
        args=STEPS,
        where=Ray(ray_cluster.address, placement="STRICT_SPREAD"),
        runs_dir=tmp_path,
    )
    result = run.wait(timeout=300)
    assert result.ok, run.tail("ray-driver", 60)
    reports = run.results()
    assert sorted(reports) == ["rank-0", "rank-1"], (reports, run.tail("ray-driver", 40))
    assert reports["rank-0"]["weights_checksum"] == reports["rank-1"]["weights_checksum"]
    for name in reports:
        assert [r.kind for r in run.records(name)].count("step") == 4, name
    assert "horovod.ray.RayExecutor" in run.tail("ray-driver")
    held = _cluster_holds(ray_cluster)
    assert held["actors"] == [] and held["groups"] == [] and held["cpus"] == 2, held


def test_killed_node_fails_the_job_fast_naming_it(ray_cluster, data_env, tmp_path):
    """Last in the file: it kills the worker node, then starts it again for later tests."""
    args = ["--epochs", "1", "--steps-per-epoch", "100000", "--batch-size", "32"]
    run = _start(ray_cluster, tmp_path, args)
    assert wait_until(lambda: run.records("worker-1"), 240, step=0.2), run.tail("ray-driver")
    on_node = _worker_pid(ray_cluster, "worker-0"), _worker_pid(ray_cluster, "worker-1")
    killed = time.monotonic()
    ray_cluster.kill_node(1)  # the worker node: its raylet, its actors and their scripts
    try:
        with pytest.raises(WorkerFailedError) as failed:
            run.wait(timeout=60)
        took = time.monotonic() - killed
        assert took < 30, f"the job took {took:.0f} s to fail"
        text = str(failed.value)
        assert f"on node {ray_cluster.info.nodes[1]}" in text and "died" in text, text
        lost = "worker-0" if "worker-0 (Ray actor" in text else "worker-1"
        assert f"{lost} (Ray actor" in text, text
        assert wait_until(lambda: not any(p and alive(p) for p in on_node), 15)
    finally:
        ray_cluster.restart_node(1)
    held = _cluster_holds(ray_cluster)
    assert held["actors"] == [] and held["groups"] == [], held


def test_the_token_is_in_no_command_line(ray_cluster):
    """Ray's token authenticates every process joining the cluster: it is read from a 0600
    file named by RAY_AUTH_TOKEN_PATH, never passed on a command line (which any user of the
    machine can read in /proc)."""
    token = ray_cluster.token_path.read_text().strip()
    assert len(token) >= 32 and oct(ray_cluster.token_path.stat().st_mode & 0o777) == "0o600"
    pids = ray_cluster.pids()
    assert len(pids) > 4  # the nodes' daemons: GCS, raylets, agents, workers
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        assert token not in cmdline, f"process {pid} has the token in its command line"
