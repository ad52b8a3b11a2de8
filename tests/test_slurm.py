"""Slurm: TF_CONFIG from a job step (pure), and the launch/slurm/ templates on a real Slurm.

The pure part reads fixed environments; it checks the cluster against TensorFlow's own
SlurmClusterResolver on the same variables. The slow part starts a private single-node
Slurm (munged, slurmctld and slurmd in the foreground, with the test's own key, config,
ports and state directory), submits the templates with sbatch and checks every task's
TF_CONFIG, result and metrics; every wait is bounded and a failure shows the daemons' log
tails. Nothing the test started is left running: every process that carries its marker
variable is gone at the end (checked).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from harness.slurm import (
    Node,
    cmdline,
    marked_pids,
    netns_prefix,
    skip_unless_slurm_can_run,
    slurm_cluster,
    this_node,
)

from ddlkit import slurm
from ddlkit.errors import ConfigError
from ddlkit.launch import plan

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "launch" / "slurm"


def _env(procid: int = 0, tasks: int = 2, nodes: str = "vm", tpn: str = "2", **more) -> dict:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": tpn,
    }
    env.update(more)
    return env


# --- pure: host lists, task counts, TF_CONFIG -------------------------------------------


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("vm", ["vm"]),
        ("n[1-2],m5,o[3-4,6,7-9]", ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("n[9-10]", ["n9", "n10"]),
        ("a-b.c[1]", ["a-b.c1"]),
    ],
)
def test_expand_hostlist_keeps_slurm_order_and_padding(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["", "n[1-", "a]b", "n[[1]]", "a,,b", "n[2-1]", "n[x]", "n[1]x"])
def test_bad_hostlist_is_one_config_error_with_the_fix(text):
    with pytest.raises(ConfigError, match="Fix:"):
        slurm.expand_hostlist(text)


def test_expand_tasks_per_node():
    assert slurm.expand_tasks_per_node("3(x2),2,1") == [3, 3, 2, 1]
    assert slurm.expand_tasks_per_node("2") == [2]
    for bad in ("", "x", "2(x)", "0", "2,,1"):
        with pytest.raises(ConfigError, match="SLURM_STEP_TASKS_PER_NODE"):
            slurm.expand_tasks_per_node(bad)


def test_tf_config_two_tasks_on_one_node():
    configs = [slurm.tf_config_from_slurm(_env(p), port_base=9000) for p in (0, 1)]
    for index, config in enumerate(configs):
        assert config == {
            "cluster": {"worker": ["vm:9000", "vm:9001"]},
            "task": {"type": "worker", "index": index},
        }


def test_tf_config_blocks_across_nodes_in_slurm_order():
    env = _env(3, tasks=4, nodes="n[9-10]", tpn="2(x2)", SLURM_LOCALID="1")
    config = slurm.tf_config_from_slurm(env, port_base=9000)
    assert config["cluster"]["worker"] == ["n9:9000", "n9:9001", "n10:9000", "n10:9001"]
    assert config["task"] == {"type": "worker", "index": 3}


def test_default_port_base_is_the_same_for_every_task_and_differs_between_jobs():
    a = [slurm.tf_config_from_slurm(_env(p)) for p in (0, 1)]
    assert a[0]["cluster"] == a[1]["cluster"]
    base = slurm.default_port_base(7)
    assert a[0]["cluster"]["worker"] == [f"vm:{base}", f"vm:{base + 1}"]
    assert slurm.default_port_base(8) - slurm.default_port_base(7) == slurm.PORTS_PER_JOB
    jobs = (0, 637, 638, 1069, 1999, 2000, 10**9)
    assert all(1024 < slurm.default_port_base(j) for j in jobs)
    # every port of every job below Linux's default ephemeral range (32768-60999), which the
    # kernel hands to outgoing connections
    assert slurm.EPHEMERAL_FLOOR == 32768
    assert all(slurm.default_port_base(j) + slurm.PORTS_PER_JOB <= 32768 for j in jobs)
    last = slurm.default_port_base(slurm.PORT_SLOTS - 1)  # the highest base, then it wraps
    assert last + slurm.PORTS_PER_JOB <= slurm.EPHEMERAL_FLOOR < last + 2 * slurm.PORTS_PER_JOB
    assert slurm.default_port_base(slurm.PORT_SLOTS) == slurm.PORT_FLOOR


def test_missing_slurm_variables_are_named_in_one_error_with_the_fix():
    with pytest.raises(ConfigError) as info:
        slurm.tf_config_from_slurm({"SLURM_JOB_ID": "3"})
    message = str(info.value)
    for var in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST"):
        assert var in message
    assert "SLURM_JOB_ID" not in message.split("Fix:")[0]
    assert "srun" in message and "launch/slurm/multi_worker.sbatch" in message


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (_env(0, tasks=3), "disagree"),
        (_env(2), "disagree"),
        (_env(0, nodes="n[1-2]", tpn="2"), "2 hosts but 1 task counts"),
        (_env(0, nodes="n1,n1", tpn="1(x2)"), "appears twice"),
        (_env("x"), "not a number"),
        (_env(1, SLURM_LOCALID="0"), "distribution=block"),
        (_env(0, SLURMD_NODENAME="other"), "distribution=block"),
    ],
)
def test_inconsistent_step_variables_are_refused(env, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        slurm.tf_config_from_slurm(env)


def test_port_base_out_of_range_and_too_many_tasks_per_node():
    with pytest.raises(ConfigError, match="between 1024 and 65533"):
        slurm.tf_config_from_slurm(_env(0), port_base=65535)
    many = _env(0, tasks=21, tpn="21")
    with pytest.raises(ConfigError, match="--port-base"):
        slurm.tf_config_from_slurm(many)
    assert len(slurm.tf_config_from_slurm(many, port_base=30000)["cluster"]["worker"]) == 21


def test_worker_env_names_the_worker_and_its_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_RUNS", str(tmp_path))
    env = slurm.worker_env(_env(1), port_base=9000)
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert env["DDLKIT_WORKER"] == "worker-1"
    assert env["DDLKIT_RUN_DIR"] == str(tmp_path / "slurm-7")
    assert env["TF_USE_LEGACY_KERAS"] in ("0", "1")
    given = slurm.worker_env(_env(0, DDLKIT_RUN_DIR=str(tmp_path / "x")))
    assert given["DDLKIT_RUN_DIR"] == str(tmp_path / "x")


def test_parameter_server_layout_chief_then_ps_then_workers(tmp_path):
    configs = [slurm.tf_config_from_slurm(_env(p, tasks=4, tpn="4"), 9000, ps=1) for p in range(4)]
    cluster = {"chief": ["vm:9000"], "ps": ["vm:9001"], "worker": ["vm:9002", "vm:9003"]}
    assert all(c["cluster"] == cluster for c in configs)
    tasks = [(c["task"]["type"], c["task"]["index"]) for c in configs]
    assert tasks == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    names = [
        slurm.worker_env(_env(p, tasks=4, tpn="4"), 9000, tmp_path, ps=1)["DDLKIT_WORKER"]
        for p in range(4)
    ]
    assert names == ["chief-0", "ps-0", "worker-0", "worker-1"]
    for tasks, ps in ((2, 1), (4, 3), (4, 0), (3, -1)):
        with pytest.raises(ConfigError, match="--ntasks"):
            slurm.ps_roles(tasks, ps)


def test_a_server_ends_when_the_chief_reports_and_not_before(tmp_path):
    forever = [sys.executable, "-c", "import time; time.sleep(600)"]
    result = tmp_path / "results" / "chief-0.json"
    result.parent.mkdir()
    result.write_text("{}")
    os.utime(result, (time.time() - 3600, time.time() - 3600))  # an old run's result
    quits = [sys.executable, "-c", "import time, sys; time.sleep(2); sys.exit(3)"]
    start = time.monotonic()
    assert slurm.serve_until_chief_reports(quits, result, "ps-0", poll=0.1) == 3
    assert time.monotonic() - start >= 1.5  # the stale result did not end it early
    timer = threading.Timer(1.0, lambda: result.write_text('{"steps": 1}'))
    timer.start()
    start = time.monotonic()
    assert slurm.serve_until_chief_reports(forever, result, "ps-0", poll=0.1, grace=5) == 0
    assert 0.9 <= time.monotonic() - start < 20
    timer.join()


def test_horovod_hosts_from_the_job_allocation():
    env = {"SLURM_JOB_NODELIST": "n[1-2],gpu7", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert slurm.horovod_hosts(env) == "n1:2,n2:2,gpu7:1"
    with pytest.raises(ConfigError, match="SLURM_TASKS_PER_NODE.*horovod.sbatch"):
        slurm.horovod_hosts({"SLURM_JOB_NODELIST": "n1"})


def test_step_shows_as_a_table():
    step = slurm.step_from_env(_env(1, tasks=3, nodes="a,<b>", tpn="2,1"))
    html = step._repr_html_()
    assert "task 1 of 3" in html and "&lt;b&gt;" in html and "<b>" not in html


# --- against TensorFlow's SlurmClusterResolver --------------------------------------------


def _tf_resolver_view(monkeypatch, env: dict, **kwargs):
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as scr

    for name in [n for n in os.environ if n.startswith("SLURM")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resolver = scr.SlurmClusterResolver(**kwargs)
    return resolver.cluster_spec().as_dict(), resolver.get_task_info()


@pytest.mark.parametrize(
    ("nodes", "tpn"), [("vm", "2"), ("n[1-2]", "2(x2)"), ("a,b,c", "1,2,1"), ("n[08-10]", "1(x3)")]
)
def test_same_cluster_as_tensorflows_slurm_resolver(monkeypatch, nodes, tpn):
    tasks = sum(slurm.expand_tasks_per_node(tpn))
    for procid in range(tasks):
        env = _env(procid, tasks=tasks, nodes=nodes, tpn=tpn)
        ours = slurm.tf_config_from_slurm(env, port_base=9000)
        most = max(slurm.expand_tasks_per_node(tpn))
        cluster, (task_type, task_id) = _tf_resolver_view(
            monkeypatch, env, port_base=9000, gpus_per_node=most, gpus_per_task=1,
            auto_set_gpu=False,
        )  # fmt: skip
        assert ours["cluster"] == cluster
        assert ours["task"] == {"type": task_type, "index": task_id}


@pytest.mark.parametrize(("nodes", "tpn", "ps"), [("vm", "4", 1), ("n[1-3]", "2(x3)", 2)])
def test_parameter_server_layout_is_tensorflows_resolver_with_jobs(monkeypatch, nodes, tpn, ps):
    counts = slurm.expand_tasks_per_node(tpn)
    tasks = sum(counts)
    jobs = slurm.ps_roles(tasks, ps)
    for procid in range(tasks):
        env = _env(procid, tasks=tasks, nodes=nodes, tpn=tpn)
        ours = slurm.tf_config_from_slurm(env, port_base=9000, ps=ps)
        cluster, (task_type, task_id) = _tf_resolver_view(
            monkeypatch, env, jobs=jobs, port_base=9000, **_cpu_kwargs(max(counts))
        )
        assert ours["cluster"] == cluster
        assert ours["task"] == {"type": task_type, "index": task_id}


def test_tensorflows_resolver_fails_on_cpu_nodes_and_ours_works(monkeypatch, tmp_path):
    """Why the kit does not call SlurmClusterResolver() as it comes (TF 2.21)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, as on a CPU node
    with pytest.raises(FileNotFoundError, match="nvidia-smi"):
        _tf_resolver_view(monkeypatch, _env(0), port_base=9000)
    with pytest.raises(ValueError, match="must not be zero"):
        _tf_resolver_view(monkeypatch, _env(0), port_base=9000, gpus_per_node=0)
    cluster, task = _tf_resolver_view(monkeypatch, _env(1), port_base=9000, **_cpu_kwargs(2))
    assert cluster == {"worker": ["vm:9000", "vm:9001"]} and task == ("worker", 1)
    # With n9 and n10 TensorFlow sorts the names as strings: n10 first, so task 0 (which
    # Slurm runs on n9) would be given n10's address. The kit keeps Slurm's order.
    env = _env(0, tasks=2, nodes="n[9-10]", tpn="1(x2)")
    cluster, _ = _tf_resolver_view(monkeypatch, env, port_base=9000, **_cpu_kwargs(1))
    assert cluster["worker"] == ["n10:9000", "n9:9000"]
    assert slurm.tf_config_from_slurm(env, 9000)["cluster"]["worker"] == ["n9:9000", "n10:9000"]


def _cpu_kwargs(most: int) -> dict:
    return {"gpus_per_node": most, "gpus_per_task": 1, "auto_set_gpu": False}


def test_resolver_helper_gives_tensorflows_resolver_working_on_cpu(monkeypatch):
    env = _env(1, SLURM_JOB_ID="12")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resolver = slurm.resolver()
    base = slurm.default_port_base(12)
    assert resolver.cluster_spec().as_dict() == {"worker": [f"vm:{base}", f"vm:{base + 1}"]}
    assert resolver.get_task_info() == ("worker", 1)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


# --- the exec wrapper, for real (no Slurm needed) ------------------------------------------


def test_exec_sets_the_worker_env_and_passes_arguments_verbatim(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ('TF_CONFIG', 'DDLKIT_WORKER', 'DDLKIT_RUN_DIR', 'TF_USE_LEGACY_KERAS')\n"
        "print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid(),\n"
        "                  **{k: os.environ.get(k) for k in keys}}))\n"
    )
    odd = ["a b", "$(touch pwned)", ";", "--epochs", "1", "*"]
    env = {**os.environ, **_env(1), "DDLKIT_RUNS": str(tmp_path / "runs")}
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit.slurm", "exec", "--port-base", "9100", "--", str(script)]
        + odd,
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["argv"] == odd and not (tmp_path / "pwned").exists()
    assert json.loads(shown["TF_CONFIG"]) == {
        "cluster": {"worker": ["vm:9100", "vm:9101"]},
        "task": {"type": "worker", "index": 1},
    }
    assert shown["DDLKIT_WORKER"] == "worker-1"
    assert shown["DDLKIT_RUN_DIR"] == str(tmp_path / "runs" / "slurm-7")
    assert "worker-1 TF_CONFIG=" in proc.stderr  # shown in the job's output


@pytest.mark.parametrize(
    ("env", "argv", "words"),
    [
        ({}, ["exec", "--", "launch/train_multi_worker.py"], "not inside a Slurm job step"),
        (_env(0), ["exec", "--", "no/such/script.py"], "not found"),
        ({}, ["hosts"], "not inside a Slurm job"),
        ({}, ["run-dir"], "SLURM_JOB_ID"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(env, argv, words):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    proc = subprocess.run(
        [sys.executable, "-m", "ddlkit.slurm", *argv],
        env={**clean, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert words in proc.stderr and "Fix:" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_templates_are_plain_bash_that_quote_their_variables():
    for name in ("multi_worker.sbatch", "parameter_server.sbatch", "horovod.sbatch"):
        path = TEMPLATES / name
        text = path.read_text()
        assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
        assert subprocess.run(["bash", "-n", str(path)], timeout=30).returncode == 0
        assert '"$@"' in text and "eval" not in text
        # every expansion of a variable in a command line is inside double quotes
        code = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        for line in code:
            unquoted = re.sub(r'"[^"]*"', "", line)
            assert not re.search(r"\$[\w{@*]", unquoted), f"{name}: unquoted {line!r}"


# --- a real single-node Slurm (tests/harness/slurm.py) -----------------------------------


@pytest.fixture(scope="module")
def mini_slurm():
    skip_unless_slurm_can_run()
    with slurm_cluster() as cluster:
        yield cluster


def _job_env(tmp_path: Path, script: str | None = None) -> dict[str, str]:
    env = {"DDLKIT_RUNS": str(tmp_path / "runs"), "DDLKIT_PYTHON": sys.executable}
    if script:
        env["DDLKIT_SCRIPT"] = script
    return env


@pytest.mark.slow
def test_real_slurm_each_task_gets_the_tf_config_tensorflows_resolver_builds(mini_slurm, tmp_path):
    check = tmp_path / "check_tf_config.py"
    check.write_text(
        textwrap.dedent("""\
        import json, os
        import ddlkit  # noqa: F401
        import tensorflow as tf
        from ddlkit import slurm
        tf_slurm = slurm.resolver()  # TensorFlow's SlurmClusterResolver from SLURM_* vars
        tf_config = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        out = os.path.join(os.environ["DDLKIT_RUN_DIR"], "check")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, os.environ["DDLKIT_WORKER"] + ".json"), "w") as fh:
            json.dump({
                "slurm": [tf_slurm.cluster_spec().as_dict(), list(tf_slurm.get_task_info())],
                "tf_config": [tf_config.cluster_spec().as_dict(),
                              [tf_config.task_type, tf_config.task_id]],
                "procid": os.environ["SLURM_PROCID"],
            }, fh)
        """)
    )
    template = TEMPLATES / "multi_worker.sbatch"
    job, _ = mini_slurm.submit(
        template, [], tmp_path / "check.out", _job_env(tmp_path, str(check)), timeout=300
    )
    seen = {
        p.stem: json.loads(p.read_text())
        for p in (tmp_path / "runs" / f"slurm-{job}" / "check").glob("*.json")
    }
    assert sorted(seen) == ["worker-0", "worker-1"], seen
    base = slurm.default_port_base(job)
    expected = {"worker": [f"{mini_slurm.node}:{base}", f"{mini_slurm.node}:{base + 1}"]}
    for name, view in seen.items():
        index = int(name.split("-")[1])
        assert view["procid"] == str(index)
        assert view["slurm"] == view["tf_config"] == [expected, ["worker", index]], view


@pytest.mark.slow
def test_real_slurm_multi_worker_template_trains_two_workers(mini_slurm, data_env, tmp_path):
    args = ["--steps-per-epoch", "5", "--epochs", "1", "--batch-size", "32"]
    template = TEMPLATES / "multi_worker.sbatch"
    job, output = mini_slurm.submit(template, args, tmp_path / "mwms.out", _job_env(tmp_path))
    # every task printed the TF_CONFIG it was given: one cluster, indexes 0 and 1
    shown = re.findall(r"ddlkit\.slurm: (worker-\d) TF_CONFIG=(\{.*?\}) run_dir=", output)
    configs = {name: json.loads(text) for name, text in shown}
    assert sorted(configs) == ["worker-0", "worker-1"], output[-3000:]
    base = slurm.default_port_base(job)
    for name, config in configs.items():
        assert config["cluster"]["worker"] == [f"{mini_slurm.node}:{base + i}" for i in (0, 1)]
        assert config["task"] == {"type": "worker", "index": int(name[-1])}
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    results = {p.stem: json.loads(p.read_text()) for p in (run_dir / "results").glob("*.json")}
    assert sorted(results) == ["worker-0", "worker-1"], output[-3000:]
    for result in results.values():
        assert result["replicas"] == 2 and result["steps"] == 5 and result["global_batch"] == 64
        assert 0.0 <= result["test_accuracy"] <= 1.0 and math.isfinite(result["train_seconds"])
    assert results["worker-0"]["test_accuracy"] == results["worker-1"]["test_accuracy"]
    from ddlkit.metrics import load_run

    steps = {}
    for record in load_run(run_dir):
        if record.kind == "step":
            steps[record.worker] = max(steps.get(record.worker, 0), record.step)
    assert steps == {"worker-0": 5, "worker-1": 5}


@pytest.mark.slow
def test_real_slurm_horovod_template_trains_two_averaged_ranks(mini_slurm, data_env, tmp_path):
    horovodrun = plan.find_horovodrun(sys.executable)
    if horovodrun is None:
        pytest.skip("no horovodrun in this venv. Fix: scripts/build-horovod.sh .venv/bin/python")
    args = ["--steps-per-epoch", "5", "--epochs", "1", "--batch-size", "32"]
    env = {**_job_env(tmp_path), "DDLKIT_HOROVODRUN": horovodrun}
    template = TEMPLATES / "horovod.sbatch"
    job, output = mini_slurm.submit(template, args, tmp_path / "hvd.out", env)
    assert f"-H {mini_slurm.node}:2;" in output, output[-3000:]
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    results = {p.stem: json.loads(p.read_text()) for p in (run_dir / "results").glob("*.json")}
    assert sorted(results) == ["rank-0", "rank-1"], output[-3000:]
    r0, r1 = results["rank-0"], results["rank-1"]
    assert r0["replicas"] == r1["replicas"] == 2 and r0["steps"] == 5
    assert r0["weights_checksum"] == r1["weights_checksum"], "replicas diverged"
    assert r0["loss"] == r1["loss"], "MetricAverageCallback: ranks disagree on the epoch loss"
    from ddlkit.metrics import load_run

    workers = {r.worker for r in load_run(run_dir) if r.kind == "step"}
    assert workers == {"rank-0", "rank-1"}


@pytest.mark.slow
def test_real_slurm_parameter_server_template_ends_its_servers(mini_slurm, data_env, tmp_path):
    args = ["--steps-per-epoch", "10", "--epochs", "1", "--report-every", "5", "--eval-every", "0"]
    template = TEMPLATES / "parameter_server.sbatch"
    job, output = mini_slurm.submit(
        template, args, tmp_path / "ps.out", _job_env(tmp_path), options=("--overcommit",)
    )
    base = slurm.default_port_base(job)
    node = mini_slurm.node
    shown = dict(re.findall(r"ddlkit\.slurm: (\S+) TF_CONFIG=(\{.*?\}) run_dir=", output))
    assert sorted(shown) == ["chief-0", "ps-0", "worker-0", "worker-1"], output[-3000:]
    for text in shown.values():
        assert json.loads(text)["cluster"] == {
            "chief": [f"{node}:{base}"],
            "ps": [f"{node}:{base + 1}"],
            "worker": [f"{node}:{base + 2}", f"{node}:{base + 3}"],
        }
    for server in ("ps-0", "worker-0", "worker-1"):  # ended by the wrapper, not by Slurm
        assert f"ddlkit.slurm: {server}: the chief reported; ending this server" in output
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    results = {p.stem: json.loads(p.read_text()) for p in (run_dir / "results").glob("*.json")}
    assert sorted(results) == ["chief-0"], output[-3000:]
    assert results["chief-0"]["steps"] == 10, results


@pytest.mark.slow
def test_real_slurm_live_workers_are_srun_tasks_of_the_allocation(mini_slurm, tmp_path):
    """dk.workers(where=dk.where.Slurm()) in an allocation (salloc): the engines are the
    tasks of one srun step, each with the TF_CONFIG ddlkit.slurm gives; cells, an
    all-reduce, a killed worker, restart; nothing left after close or a killed kernel."""
    script = ROOT / "tests" / "harness" / "slurmworkers.py"
    done = mini_slurm.run(
        ["salloc", "--ntasks=2", "--time=10", sys.executable, str(script)],
        cwd=ROOT, timeout=600, env={"DDLKIT_RUNS": str(tmp_path / "runs")},
    )  # fmt: skip
    lines = [x for x in done.stdout.splitlines() if x.startswith("SLURMWORKERS ")]
    if done.returncode != 0 or not lines:  # shown whole under "Captured stdout call"
        print(done.stdout, done.stderr, sep="\n")
        for log in sorted((tmp_path / "runs").glob("*/logs/*.log")):
            print(f"--- {log}", log.read_text(errors="replace")[-4000:], sep="\n")
    assert done.returncode == 0 and lines, f"salloc ended with {done.returncode}: see above"
    out = json.loads(lines[0].removeprefix("SLURMWORKERS "))
    job = int(out["job"])
    assert out["names"] == ["worker-0", "worker-1"] and out["processes"] == ["ipcontroller", "srun"]
    assert out["address"] == "127.0.0.1"  # every node of the allocation is this machine
    base = slurm.default_port_base(job)
    cluster = {"worker": [f"{mini_slurm.node}:{base}", f"{mini_slurm.node}:{base + 1}"]}
    shown = {}
    for line in out["shown"]:  # [worker-i] task PROCID STEP NAME TF_CONFIG
        label, _, procid, step, name, tf_config = line.split(" ", 5)
        shown[label] = (procid, step, name, json.loads(tf_config))
    assert shown == {
        f"[worker-{i}]": (str(i), "0", f"worker-{i}", {"cluster": cluster, "task": task})
        for i, task in enumerate([{"type": "worker", "index": 0}, {"type": "worker", "index": 1}])
    }, out["shown"]
    assert sorted(out["sum"]) == ["[worker-0] sum 3.0", "[worker-1] sum 3.0"], out
    said = out["after_kill"]
    assert "worker-1 (SIGKILL sent by workers.kill) died" in said and "workers.restart()" in said
    assert sorted(out["restarted"]) == ["[worker-0] fresh 1", "[worker-1] fresh 1"], out
    assert out["left"] == [] and out["kernel_killed_left"] == [], out


@pytest.mark.slow
def test_real_slurm_bad_script_fails_the_step_with_the_fix(mini_slurm, tmp_path):
    proc = mini_slurm.run(
        ["srun", "-n", "2", sys.executable, "-m", "ddlkit.slurm", "exec", "--", "no/such.py"],
        cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.count("worker script 'no/such.py' not found") == 2, proc.stderr


@pytest.mark.slow
def test_a_node_that_never_registers_fails_in_bounded_time_with_the_logs():
    skip_unless_slurm_can_run()
    start = time.monotonic()
    with (
        pytest.raises(pytest.fail.Exception) as info,
        slurm_cluster(start_slurmd=False, idle_timeout=8),
    ):
        pass
    message = str(info.value)
    assert "every node to be idle: not within 8 s" in message
    assert "--- slurmctld (last lines) ---" in message and "slurmctld version" in message
    assert time.monotonic() - start < 60  # the wait, plus stopping what was started


@pytest.mark.slow
def test_a_job_past_its_wait_is_cancelled_and_leaves_nothing(mini_slurm, tmp_path):
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    env = _job_env(tmp_path, str(sleeper))
    # 20 s: time for sbatch, srun and two Python starts on a slow, loaded machine (3-5 s here)
    with pytest.raises(pytest.fail.Exception, match="still running after 20 s") as info:
        mini_slurm.submit(TEMPLATES / "multi_worker.sbatch", [], tmp_path / "s.out", env, 20)
    assert "worker-1 TF_CONFIG=" in str(info.value)  # its workers had started
    gone = lambda: not [p for p in marked_pids(mini_slurm.marker) if str(sleeper) in cmdline(p)]  # noqa: E731
    deadline = time.monotonic() + 60
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert gone(), "the cancelled job's workers are still running"


@pytest.mark.slow
def test_real_two_node_slurm_trains_one_worker_per_node(data_env, tmp_path):
    """Two Slurm nodes, each a network namespace with its own address and slurmd.

    Named n9 and n10: Slurm starts task 0 on n9 (its node order), so the cluster must list
    n9 first, where TensorFlow's SlurmClusterResolver (string sort) would put n10.
    """
    skip_unless_slurm_can_run()
    from ddlkit.hosts import netns

    why = netns.unavailable(try_it=True)
    if why:
        pytest.skip(why)
    if shutil.which("nsenter") is None or shutil.which("unshare") is None:
        pytest.skip("nsenter and unshare (util-linux) are needed to start slurmd in a namespace")
    cpus = this_node().cpus
    args = ["--steps-per-epoch", "5", "--epochs", "1", "--batch-size", "32"]
    with netns.namespaced_hosts(2) as hosts:
        names = ("n9", "n10")  # Slurm's order; sorted as strings n10 would come first
        known = "".join(f"{h.address} {name}\n" for h, name in zip(hosts, names, strict=True))
        nodes = []
        for h, name in zip(hosts, names, strict=True):
            hosts_file = netns.NETNS_ETC / h.name / "hosts"  # the node names resolve in both
            hosts_file.write_text(hosts_file.read_text() + known)
            nodes.append(Node(name, h.address, cpus, netns_prefix(h.name, hosts_file)))
        with slurm_cluster(nodes, controller=hosts[0].gateway) as cluster:
            job, output = cluster.submit(
                TEMPLATES / "multi_worker.sbatch", args, tmp_path / "two.out",
                _job_env(tmp_path), options=("--nodes=2", "--ntasks-per-node=1"),
            )  # fmt: skip
    base = slurm.default_port_base(job)
    shown = re.findall(r"ddlkit\.slurm: (worker-\d) TF_CONFIG=(\{.*?\}) run_dir=", output)
    configs = {name: json.loads(text) for name, text in shown}
    assert sorted(configs) == ["worker-0", "worker-1"], output[-3000:]
    for name, config in configs.items():
        assert config["cluster"]["worker"] == [f"n9:{base}", f"n10:{base}"]  # one port, 2 hosts
        assert config["task"] == {"type": "worker", "index": int(name[-1])}
    # each worker's gRPC server came up on its own node's name
    assert f"target: grpc://n9:{base}" in output and f"target: grpc://n10:{base}" in output
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    results = {p.stem: json.loads(p.read_text()) for p in (run_dir / "results").glob("*.json")}
    assert sorted(results) == ["worker-0", "worker-1"], output[-3000:]
    assert all(r["replicas"] == 2 and r["steps"] == 5 for r in results.values()), results
    assert results["worker-0"]["test_accuracy"] == results["worker-1"]["test_accuracy"]


@pytest.mark.slow
def test_real_two_node_slurm_horovod_template_reaches_the_second_node_over_ssh(data_env, tmp_path):
    """horovodrun in the batch step on n1 starts rank 1 on n2 through sshd there."""
    skip_unless_slurm_can_run()
    from ddlkit.hosts import netns, sshd
    from ddlkit.hosts.ssh import write_ssh_shim

    why = netns.unavailable(try_it=True) or sshd.unavailable()
    if why:
        pytest.skip(why)
    horovodrun = plan.find_horovodrun(sys.executable)
    if horovodrun is None:
        pytest.skip("no horovodrun in this venv. Fix: scripts/build-horovod.sh .venv/bin/python")
    cpus = this_node().cpus
    args = ["--steps-per-epoch", "5", "--epochs", "1", "--batch-size", "32"]
    with (
        netns.namespaced_hosts(2) as hosts,
        sshd.running_sshd(hosts, tmp_path / "sshd") as ssh_cluster,
    ):
        names = ("n1", "n2")
        known = "".join(f"{h.address} {name}\n" for h, name in zip(hosts, names, strict=True))
        host_key = (tmp_path / "sshd" / "host_ed25519.pub").read_text().split()[:2]
        with open(ssh_cluster.options.known_hosts, "a") as fh:  # ssh to n1/n2 by name
            fh.writelines(f"{name} {' '.join(host_key)}\n" for name in names)
        nodes = []
        for h, name in zip(hosts, names, strict=True):
            hosts_file = netns.NETNS_ETC / h.name / "hosts"
            hosts_file.write_text(hosts_file.read_text() + known)
            nodes.append(Node(name, h.address, cpus, netns_prefix(h.name, hosts_file)))
        shim = tmp_path / "shim"
        shim.mkdir()
        write_ssh_shim(shim, ssh_cluster.options)  # horovodrun's ssh: our key, BatchMode
        env = {
            **_job_env(tmp_path),
            "DDLKIT_HOROVODRUN": horovodrun,
            "DDLKIT_NETWORK_INTERFACE": "eth0",
            "PATH": f"{shim}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        }
        with slurm_cluster(nodes, controller=hosts[0].gateway) as cluster:
            job, output = cluster.submit(
                TEMPLATES / "horovod.sbatch", args, tmp_path / "hvd2.out", env,
                options=("--nodes=2", "--ntasks-per-node=1"),
            )  # fmt: skip
        for h, pid in zip(hosts, ssh_cluster.pids, strict=True):  # only sshd is left
            left = subprocess.run(["ip", "netns", "pids", h.name], capture_output=True, text=True)
            assert left.stdout.split() in ([str(pid)], []), (h.name, left.stdout)
    assert "-H n1:1,n2:1;" in output, output[-3000:]
    logins = [(tmp_path / "sshd" / f"sshd.{h.name}.log").read_text() for h in hosts]
    assert "Accepted publickey" not in logins[0]  # n1 runs the batch step: rank 0 is local
    assert "Accepted publickey" in logins[1], logins[1]  # rank 1 went to n2 over ssh
    run_dir = tmp_path / "runs" / f"slurm-{job}"
    results = {p.stem: json.loads(p.read_text()) for p in (run_dir / "results").glob("*.json")}
    assert sorted(results) == ["rank-0", "rank-1"], output[-3000:]
    r0, r1 = results["rank-0"], results["rank-1"]
    assert r0["replicas"] == r1["replicas"] == 2
    assert r0["weights_checksum"] == r1["weights_checksum"] and r0["loss"] == r1["loss"]
