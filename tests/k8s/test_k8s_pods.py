"""Inside the pods: TF_CONFIG from JOB_COMPLETION_INDEX and the pods' stable names.

Pure first (the cluster each pod builds, the worker names, what is refused), then
``python -m ddlkit.k8s exec`` as a real process, then (slow, root) the pod side for real:
one namespaced host per pod whose /etc/hosts names every pod ``<job>-<index>.<service>``,
the manifest's own container command run in each with JOB_COMPLETION_INDEX set, and a
MultiWorkerMirroredStrategy job training across them with its metrics reaching the
notebook's collector.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit import contract
from ddlkit.environments import Kubernetes, detect
from ddlkit.errors import ConfigError
from ddlkit.k8s import manifest, worker_env

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example/ddlkit:0.1"


def _pod(index, pods=2, ps=0, job="mnist", service="mnist"):
    return Kubernetes.from_env({"JOB_COMPLETION_INDEX": str(index)}, job, service, pods, ps)


def test_every_pod_builds_the_same_cluster_of_pod_names_and_its_own_task():
    configs = [_pod(i, pods=3).tf_config() for i in range(3)]
    names = ["mnist-0.mnist:2222", "mnist-1.mnist:2222", "mnist-2.mnist:2222"]
    assert all(c["cluster"] == {"worker": names} for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert [_pod(i, pods=3).worker_name() for i in range(3)] == ["worker-0", "worker-1", "worker-2"]
    assert (_pod(1).world_size(), _pod(1).global_rank(), _pod(1).host) == (2, 1, "mnist-1.mnist")


def test_parameter_server_pods_are_chief_then_ps_then_workers():
    pods = [_pod(i, pods=5, ps=2, job="j", service="s") for i in range(5)]
    assert [p.worker_name() for p in pods] == ["chief-0", "ps-0", "ps-1", "worker-0", "worker-1"]
    assert pods[3].tf_config() == {
        "cluster": {"chief": ["j-0.s:2222"], "ps": ["j-1.s:2222", "j-2.s:2222"],
                    "worker": ["j-3.s:2222", "j-4.s:2222"]},
        "task": {"type": "worker", "index": 0},
    }  # fmt: skip


def test_the_manifest_and_the_pods_agree_on_names_and_count():
    m = manifest("t.py", strategy="parameter_server", workers=2, ps=1, image=IMAGE, name="ps")
    job = next(o for o in m.objects if o["kind"] == "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    shape = dict(zip(command[4:-2:2], command[5:-2:2], strict=True))
    spec = job["spec"]
    assert shape == {"--job": "ps", "--service": spec["template"]["spec"]["subdomain"],
                     "--pods": str(spec["completions"]), "--ps": "1", "--port": "2222",
                     "--peer-wait": "600"}  # fmt: skip


def test_worker_env_names_the_worker_and_its_run_dir(tmp_path):
    env = worker_env({"JOB_COMPLETION_INDEX": "1", contract.RUN_DIR_VAR: str(tmp_path)},
                     "mnist", "mnist", 2)  # fmt: skip
    assert env[contract.WORKER_VAR] == "worker-1" and env[contract.RUN_DIR_VAR] == str(tmp_path)
    assert json.loads(env[contract.TF_CONFIG_VAR])["task"] == {"type": "worker", "index": 1}
    assert env["TF_USE_LEGACY_KERAS"] == "1"


def test_detect_needs_a_pod_of_an_indexed_job():
    assert (
        detect({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": "0"}) is Kubernetes
    )
    assert detect({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None  # a pod, not an Indexed Job
    assert detect({"JOB_COMPLETION_INDEX": "0"}) is None


@pytest.mark.parametrize(
    ("environ", "pods", "ps", "words"),
    [
        ({}, 2, 0, "JOB_COMPLETION_INDEX is not set"),
        ({"JOB_COMPLETION_INDEX": "x"}, 2, 0, "not a number"),
        ({"JOB_COMPLETION_INDEX": "2"}, 2, 0, "outside 0..1"),
        ({"JOB_COMPLETION_INDEX": "0"}, 0, 0, "at least one"),
        ({"JOB_COMPLETION_INDEX": "0"}, 2, 1, "cannot hold a chief"),
    ],
)
def test_what_a_pod_refuses(environ, pods, ps, words):
    with pytest.raises(ConfigError, match=words) as err:
        Kubernetes.from_env(environ, "mnist", "mnist", pods, ps)
    assert "Fix:" in str(err.value)


def _exec(argv, env, cwd):
    clean = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    return subprocess.run([sys.executable, "-m", "ddlkit.k8s", "exec", *argv],
                          env={**clean, **env}, cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_exec_sets_the_worker_env_and_passes_arguments_verbatim(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ('TF_CONFIG', 'DDLKIT_WORKER', 'DDLKIT_RUN_DIR', 'TF_USE_LEGACY_KERAS')\n"
        "print(json.dumps({'argv': sys.argv[1:], **{k: os.environ.get(k) for k in keys}}))\n"
    )
    odd = ["a b", "$(touch pwned)", ";", "--epochs", "1", "*"]
    env = {"JOB_COMPLETION_INDEX": "1", "DDLKIT_RUNS": str(tmp_path / "runs")}
    argv = ["--job", "mnist", "--pods", "2", "--peer-wait", "0", "--", str(script), *odd]
    proc = _exec(argv, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["argv"] == odd and not (tmp_path / "pwned").exists()
    assert json.loads(shown["TF_CONFIG"]) == {
        "cluster": {"worker": ["mnist-0.mnist:2222", "mnist-1.mnist:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert shown["DDLKIT_WORKER"] == "worker-1" and shown["TF_USE_LEGACY_KERAS"] == "1"
    assert shown["DDLKIT_RUN_DIR"] == str(tmp_path / "runs" / "k8s-mnist")
    assert "ddlkit.k8s: worker-1 TF_CONFIG=" in proc.stderr


@pytest.mark.parametrize(
    ("env", "argv", "words"),
    [
        ({}, ["--job", "mnist", "--pods", "2"], "JOB_COMPLETION_INDEX is not set"),
        ({"JOB_COMPLETION_INDEX": "0"}, ["--job", "mnist", "--pods", "0"], "at least one"),
        ({"JOB_COMPLETION_INDEX": "0"}, ["--job", "Bad_Name", "--pods", "2"], "DNS label"),
    ],
)
def test_exec_bad_input_is_one_line_exit_2_and_nothing_started(tmp_path, env, argv, words):
    script = tmp_path / "mark.py"
    script.write_text("open('started', 'w').close()\n")
    proc = _exec([*argv, "--", str(script)], env, tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert words in proc.stderr and "Fix:" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "started").exists()


def test_parameter_server_pods_serve_until_the_chief_reports(tmp_path):
    """Three pods of a PS job (chief, ps, worker) as real processes: the servers, which
    never end by themselves, are ended by `exec --ps` once the chief's result is written."""
    script = tmp_path / "task.py"
    script.write_text(
        "import os, time\n"
        "from ddlkit import contract\n"
        "name = os.environ[contract.WORKER_VAR]\n"
        "if name == 'chief-0':\n"
        "    time.sleep(1)\n"
        "    contract.write_result(os.environ[contract.RUN_DIR_VAR], name, '{}')\n"
        "else:\n"
        "    time.sleep(300)  # a tf.distribute.Server's join(): never returns\n"
    )
    argv = [sys.executable, "-m", "ddlkit.k8s", "exec", "--job", "ps", "--pods", "3", "--ps",
            "1", "--peer-wait", "0", "--run-dir", str(tmp_path / "run"), "--",
            str(script)]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    procs = [
        subprocess.Popen(
            argv,
            env={**clean, "JOB_COMPLETION_INDEX": str(i)},
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(3)
    ]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert [o.split()[1] for o in outs] == ["chief-0", "ps-0", "worker-0"]
    assert all("the chief reported" in o for o in outs[1:]), outs


# --- the pod side for real: namespaced hosts named like pods (root) ------------------------
@pytest.mark.slow
def test_pods_on_namespaced_hosts_train_mwms_and_stream_metrics(data_env, tmp_path):
    """Two "pods" (namespaced hosts named mnist-0.mnist, mnist-1.mnist) run the manifest's
    own command; worker 0 and 1 find each other by those names and train 3 steps."""
    from ddlkit.hosts import netns
    from ddlkit.k8s.local import pod_hosts
    from ddlkit.metrics import Collector

    why = netns.unavailable(try_it=True)
    if why:
        pytest.skip(why)
    script = ROOT / "launch" / "train_multi_worker.py"
    args = ["--steps-per-epoch", "3", "--epochs", "1", "--batch-size", "32"]
    probe = manifest(str(script), workers=2, image=IMAGE, name="mnist", args=args)
    with pod_hosts(probe) as pods:
        assert pods.names() == ["mnist-0.mnist", "mnist-1.mnist"]
        assert not pods.closed()
        for i in (0, 1):  # every pod's /etc/hosts names every pod, as the Service's DNS would
            assert pods.hosts_lines() in pods.etc_hosts(i)
        token = "k8s-test-token-1234"
        with Collector(tmp_path / "collected", host=pods.gateway, token=token) as collector:
            m = manifest(str(script), workers=2, image=IMAGE, name="mnist", args=args,
                         collector=f"{pods.gateway}:{collector.port}",
                         token_secret="ddlkit-token")  # fmt: skip
            pods.start(m, mount=tmp_path / "volume", secrets={"ddlkit-token": {"token": token}},
                       cwd=ROOT, logs=tmp_path / "logs")  # fmt: skip
            codes = pods.wait(timeout=400)  # the pods start() started, as PodContainers waits
            logs = {f"{name}.log": text for name, text in pods.logs().items()}
            assert codes == [0, 0], logs
            assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(logs)
            got = {r.worker for r in collector.records()}
    assert got == {"worker-0", "worker-1"}, logs
    for i in (0, 1):  # each pod's TF server came up under its pod name
        assert f"ddlkit.k8s: worker-{i} TF_CONFIG=" in logs[f"mnist-{i}.log"]
    results = contract.read_results(tmp_path / "volume" / "mnist")
    assert sorted(results) == ["worker-0", "worker-1"], logs
    assert all(r["replicas"] == 2 and r["steps"] == 3 for r in results.values()), results
    assert not any(netns.pids_in(h) for h in pods.hosts)
    assert pods.closed()  # the hosts are gone with the block


def test_exec_waits_for_a_pending_peer_then_fails_naming_it_and_starts_nothing(tmp_path):
    """A peer with no address (a Pending pod: no DNS record) stops exec after --peer-wait."""
    script = tmp_path / "mark.py"
    script.write_text("open('started', 'w').close()\n")
    env = {"JOB_COMPLETION_INDEX": "1", "DDLKIT_RUNS": str(tmp_path / "runs")}
    argv = ["--job", "ghost", "--service", "ghosts", "--pods", "3", "--peer-wait", "2"]
    proc = _exec([*argv, "--", str(script)], env, tmp_path)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("ddlkit.k8s: error: worker-1 waited 2 s for pod(s) ghost-0, ghost-2 ")
    assert "Pending" in error and "kubectl describe pod ghost-0" in error and "Fix:" in error
    assert not (tmp_path / "started").exists()
