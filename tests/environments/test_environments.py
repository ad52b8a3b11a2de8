"""Where a worker runs is one abstraction: Local, Ssh, and Slurm (a scheduler's processes)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ddlkit import slurm
from ddlkit.cluster import ClusterSpec, Host
from ddlkit.environments import LOCAL, Slurm, Ssh, detect, for_worker
from ddlkit.errors import ConfigError
from ddlkit.hosts import SshOptions
from ddlkit.launch.spec import WorkerSpec

ROOT = Path(__file__).resolve().parents[2]


def _worker(host=None, **kw):
    return WorkerSpec(
        "worker-0",
        ("/usr/bin/python3", "train.py"),
        {"TF_CONFIG": "{}", "DDLKIT_TOKEN": "s3cret"},
        Path("/tmp/r/work/worker-0"),
        Path("/tmp/r/logs/worker-0.log"),
        host=host,
        **kw,
    )


def test_a_worker_without_a_host_is_a_local_process():
    w = _worker()
    where = for_worker(w)
    assert where is LOCAL and where.pins_cores and not where.heartbeat
    env = where.worker_env(w, "/tmp/r", base={"PATH": "/bin"})
    assert env["DDLKIT_WORKER"] == "worker-0" and env["PATH"] == "/bin"
    how = where.popen(w, env, base={})
    assert (how.argv, how.cwd, how.stdin) == (w.argv, w.cwd, None)
    assert how.env == env and where.exit_meaning(255) is None
    assert not where.soft_stop_closes_stdin()


def test_a_worker_with_a_host_runs_there_over_ssh_with_its_secrets_on_stdin():
    w = _worker(host="10.0.0.7", ssh=SshOptions(identity="/k/id"))
    where = for_worker(w)
    assert isinstance(where, Ssh) and where.host == "10.0.0.7"
    assert not where.pins_cores and where.heartbeat and where.soft_stop_closes_stdin()
    env = where.worker_env(w, "/tmp/r", base={"PATH": "/bin", "DDLKIT_FAST": "1"})
    assert "PATH" not in env and env["DDLKIT_FAST"] == "1"  # only the kit's settings travel
    how = where.popen(w, env, base={"PATH": "/bin"})
    assert how.argv[0] == "ssh" and "10.0.0.7" in how.argv
    assert "s3cret" not in " ".join(how.argv) and b"s3cret" in how.stdin
    assert how.env == {"PATH": "/bin"} and how.cwd == w.log_path.parent
    how_, fix = where.exit_meaning(255)
    assert "lost its SSH session to 10.0.0.7" in how_ and "10.0.0.7 is up" in fix
    assert "busy on 10.0.0.7" in where.port_busy_fix()


def test_slurm_is_detected_from_its_step_variables():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "n[9-10]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    assert detect(env) is Slurm and detect({"SLURM_JOB_ID": "7"}) is None and detect({}) is None
    task = Slurm.from_env(env, port_base=9000, ps=1)
    assert Slurm.creates_processes_externally and not type(LOCAL).creates_processes_externally
    assert (task.world_size(), task.global_rank(), task.host) == (4, 3, "n10")
    assert task.worker_name() == "worker-1"
    # the same ClusterSpec builder as every other launch path
    expect = ClusterSpec.from_hosts(
        (Host("n9", 2), Host("n10", 2)), workers=2, ps=1, chief=True, base_port=9000
    )
    assert task.cluster() == expect
    assert task.tf_config() == expect.tf_config("worker-1")
    assert slurm.tf_config_from_slurm(env, 9000, ps=1) == task.tf_config()
    assert task.tf_config()["cluster"]["chief"] == ["n9:9000"]
    env_vars = task.task_env("/shared/run")
    assert json.loads(env_vars["TF_CONFIG"]) == task.tf_config()
    assert env_vars["DDLKIT_WORKER"] == "worker-1" and env_vars["DDLKIT_RUN_DIR"] == "/shared/run"
    with pytest.raises(ConfigError, match="cannot hold a chief, 3 parameter server"):
        Slurm.from_env(env, port_base=9000, ps=3).cluster()


def test_the_launcher_asks_the_environment_not_the_host():
    """Outside ddlkit/environments/, only the data layer (WorkerSpec's own checks, the ssh
    command's guard) and the planner's placement look at whether a worker has a host."""
    allowed = {"launch/spec.py", "launch/remote.py", "strategies/base.py"}
    found = {}
    for path in sorted((ROOT / "ddlkit").rglob("*.py")):
        rel = path.relative_to(ROOT / "ddlkit").as_posix()
        if rel.startswith("environments/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Attribute | ast.Name)
                and getattr(node.left, "attr", getattr(node.left, "id", "")) == "host"
                and isinstance(node.ops[0], ast.Is | ast.IsNot)
            ):
                found.setdefault(rel, []).append(node.lineno)
    assert set(found) <= allowed, found
