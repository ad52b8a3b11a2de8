"""The kit's image, built here, and a manifest's pods run as real podman containers of it.

The image is built once per session (``ddlkit.image.build``: buildah with its layer cache and
this machine's caches); the pods are containers on a podman network of their own, named as
Kubernetes names them, running the manifest's own command.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ddlkit import contract
from ddlkit.errors import ConfigError
from ddlkit.image import build, podman
from ddlkit.k8s import manifest, needs
from ddlkit.k8s.containers import (
    LABEL,
    PodContainers,
    PodFailedError,
    addresses,
    job_pods,
    mpijob_pods,
    pod_containers,
)

SCRIPT = "launch/train_multi_worker.py"  # relative: the image's WORKDIR is the kit's root


# --- pure ------------------------------------------------------------------------------------
def test_limits_are_the_machines_hard_limits_with_processes_capped_at_pid_max():
    assert podman.ulimits(20000, 96365, 32768) == ("nofile=20000:20000", "nproc=32768:32768")
    assert podman.ulimits(1024, 4096, 32768) == ("nofile=1024:1024", "nproc=4096:4096")
    text = podman.conf_text(20000, 96365, 32768)
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' in text
    assert 'cgroup_manager = "cgroupfs"' in text and 'runtime = "runc"' in text
    assert 'network_backend = "netavark"' in text  # names resolve between containers


def test_podman_without_its_network_helpers_is_one_error_naming_them(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "podman").write_text("#!/bin/sh\n")
    (fake / "podman").chmod(0o755)
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "netavark").write_text("#!/bin/sh\n")
    (helpers / "netavark").chmod(0o755)
    assert podman.missing_helpers([str(helpers)]) == ["aardvark-dns"]
    with pytest.raises(ConfigError, match="aardvark-dns not found.*apt-get install .*aardvark-dns"):
        podman.require("podman", path=str(fake), helper_dirs=[str(helpers)])
    (helpers / "aardvark-dns").write_text("#!/bin/sh\n")
    (helpers / "aardvark-dns").chmod(0o755)
    if os.geteuid() == 0:
        podman.require("podman", path=str(fake), helper_dirs=[str(helpers)])


def test_the_build_is_one_argv_with_the_base_and_the_caches_as_volumes(tmp_path):
    p = build.BuildPlan(
        tag="localhost/x:1", base="localhost/b:2", context=tmp_path,
        mounts=(("/h/uv", "/cache/uv", ""), ("/h/bin", "/cache/bin", "ro")),
    )  # fmt: skip
    argv = p.argv()
    assert argv[:2] == ["buildah", "bud"] and argv[-1] == str(tmp_path)
    assert ["--build-arg", "BASE=localhost/b:2"] == argv[argv.index("--build-arg") :][:2]
    assert "/h/uv:/cache/uv" in argv and "/h/bin:/cache/bin:ro" in argv
    assert ["--isolation", "oci"] == argv[2:4]  # chroot isolation crashes Horovod's check
    assert "--force-rm" in argv  # a failed step leaves no working container
    assert ["--network", "host"] == argv[argv.index("--network") :][:2]  # no bridge needed
    assert build.base_digest() != build.base_digest(packages=("python3",))


def test_pod_addresses_follow_the_gateway_and_every_pod_names_every_pod():
    gateway, pods = addresses("10.89.3.0/24", 3)
    assert gateway == "10.89.3.1" and pods == ("10.89.3.2", "10.89.3.3", "10.89.3.4")
    m = manifest(SCRIPT, workers=2, image="localhost/ddlkit:0.1.0", name="mnist",
                 collector="10.89.3.1:7000", token_secret="tok")  # fmt: skip
    hosts = ("mnist-0.mnist", "mnist-1.mnist")
    p = PodContainers("mnist", "job", "ab12", "ddlkit-ab12", gateway, pods[:2], hosts, Path("/e"))
    pod = job_pods(m, Path("/v"), {"tok": {"token": "s3cret-value"}})[1]
    assert pod.env["JOB_COMPLETION_INDEX"] == "1" and pod.env[contract.TOKEN_VAR] == "s3cret-value"
    argv = p.run_argv(pod, 1)
    assert "s3cret-value" not in " ".join(argv)  # a Secret's value never in argv
    assert f"--env={contract.TOKEN_VAR}" in argv and "/v:/checkpoints" in argv
    assert "--add-host=mnist-0.mnist:10.89.3.2" in argv and "--add-host=mnist-1:10.89.3.3" in argv
    assert argv[argv.index("--hostname") + 1] == "mnist-1"
    assert argv[argv.index("--ip") + 1] == "10.89.3.3"
    assert argv[argv.index("localhost/ddlkit:0.1.0") + 1 :][:3] == ["python", "-m", "ddlkit.k8s"]
    with pytest.raises(ConfigError, match="secrets= lacks"):
        job_pods(m, Path("/v"), {})


def test_an_mpijobs_pods_are_a_launcher_with_the_hostfile_and_sshd_workers():
    m = manifest("launch/train_horovod.py", strategy="horovod", kind="mpijob", workers=2,
                 image="localhost/ddlkit:0.1.0", name="hvd")  # fmt: skip
    launcher, *workers = mpijob_pods(m, Path("/v"), {}, Path("/e"))
    assert [p.name for p in (launcher, *workers)] == ["hvd-launcher", "hvd-worker-0",
                                                      "hvd-worker-1"]  # fmt: skip
    assert launcher.ends and not any(w.ends for w in workers)  # servers: ended after
    assert launcher.env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert ("/e/mpi", "/etc/mpi", "ro") in launcher.mounts
    assert all(("/e/ssh", "/home/ddlkit/.ssh", "ro") in p.mounts for p in (launcher, *workers))
    assert workers[0].command[0] == "/usr/sbin/sshd"


def test_without_podman_one_line_names_the_packages(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="apt-get install podman buildah runc mmdebstrap"):
        podman.require("podman", "buildah")
    with pytest.raises(ConfigError, match="podman"):
        build.build("localhost/never:1", echo=lambda _m: None)


def test_a_manifests_needs_come_from_its_own_pod_commands():
    job = needs.needs(manifest(SCRIPT, workers=2, name="mnist"))
    # the pods run python -m ddlkit.k8s exec
    assert job == needs.Needs(("tensorflow", "ddlkit"), ("python",), (SCRIPT,))
    mpi = needs.needs(manifest("launch/train_horovod.py", strategy="horovod", kind="mpijob"))
    assert mpi.modules == ("tensorflow", "horovod")
    # the launcher's horovodrun and the mpirun its --mpi runs; the workers' sshd
    assert mpi.programs == ("python", "horovodrun", "mpirun", "/usr/sbin/sshd")
    assert mpi.files == ("launch/train_horovod.py",)
    line = needs.lacking("img:1", manifest(SCRIPT), ["horovod", "mpirun"])
    assert "\n" not in line and line.startswith("image 'img:1' lacks what a multi_worker job")


# --- real: the image and the containers (root, podman) ---------------------------------------
needs_podman = pytest.mark.skipif(
    bool(__import__("ddlkit.k8s.containers", fromlist=["x"]).unavailable()),
    reason="podman is not installed or this is not root",
)


@pytest.fixture(scope="session")
def image() -> str:
    lines: list[str] = []
    tag = build.build(echo=lines.append)
    first = podman.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag]).stdout
    start = time.monotonic()
    again: list[str] = []
    assert build.build(echo=again.append) == tag
    # Nothing changed: the base is found up to date and every layer is reused (same image).
    assert any("up to date" in line for line in again), again
    assert podman.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag]).stdout == first
    print(f"image rebuild with nothing changed: {time.monotonic() - start:.0f} s; {lines[-1]}")
    return tag


@pytest.mark.slow
@needs_podman
def test_the_image_holds_the_kit_horovod_and_the_data_as_a_non_root_user(image):
    probe = (
        "import os, horovod.tensorflow as hvd, tensorflow as tf; from ddlkit.data import load; "
        "(x, y), _ = load('mnist'); "
        "print(os.getuid(), os.getcwd(), tf.__version__, hvd.mpi_built(), hvd.gloo_built(), "
        "len(x), os.path.exists(tf.sysconfig.get_include()))"
    )
    done = podman.run(["podman", "run", "--rm", image, "python", "-c", probe], timeout=120)
    uid, cwd, tf_version, mpi, gloo, n, headers = done.stdout.split()[-7:]
    assert (uid, cwd, tf_version, mpi, gloo, n) == ("1000", "/opt/ddlkit", "2.21.0", "True",
                                                    "True", "60000")  # fmt: skip
    assert headers == "False"  # TensorFlow's C++ headers stayed in the build
    tools = "mpirun ssh /usr/sbin/sshd horovodrun g++ cmake"
    look = f"for t in {tools}; do command -v $t || echo no-$t; done"
    tools = podman.run(["podman", "run", "--rm", image, "sh", "-c", look]).stdout.split()
    assert tools == ["/usr/bin/mpirun", "/usr/bin/ssh", "/usr/sbin/sshd",
                     "/opt/venv/bin/horovodrun", "no-g++", "no-cmake"]  # fmt: skip


@pytest.mark.slow
@needs_podman
def test_an_image_that_does_not_exist_is_one_error_and_nothing_is_left(tmp_path):
    m = manifest(SCRIPT, workers=2, image="localhost/ddlkit-missing:0", name="mnist")
    before = podman.run(["podman", "network", "ls", "--format", "{{.Name}}"]).stdout
    with pytest.raises(ConfigError, match="not in podman's store. Fix: build it"):
        with pod_containers(m):
            pass
    assert podman.run(["podman", "network", "ls", "--format", "{{.Name}}"]).stdout == before
    assert not (tmp_path / "volume").exists()


def _networks() -> str:
    return podman.run(["podman", "network", "ls", "--format", "{{.Name}}"]).stdout


@pytest.mark.slow
@needs_podman
def test_an_image_without_what_the_strategy_runs_is_one_line_and_nothing_is_left(image):
    """The kit's image with Horovod taken out: a Horovod MPIJob is refused, naming Horovod
    and horovodrun, before any network exists; a MultiWorkerMirrored job still starts. An
    image without Python at all (the kit's Debian base) is refused the same way."""
    tag = "localhost/ddlkit-test-no-horovod:0"
    site = "/opt/venv/lib/python3.11/site-packages"
    name = f"ddlkit-test-strip-{time.monotonic_ns()}"
    podman.run(["podman", "run", "--name", name, "--user", "root", "--entrypoint", "rm", image,
                "-rf", f"{site}/horovod", "/opt/venv/bin/horovodrun"])  # fmt: skip
    try:
        podman.run(["podman", "commit", "--quiet", name, tag], timeout=300)
    finally:
        podman.run(["podman", "rm", "--force", name], check=False)
    before = _networks()
    try:
        hvd = manifest("launch/train_horovod.py", strategy="horovod", kind="mpijob", image=tag)
        with pytest.raises(ConfigError) as info:
            with pod_containers(hvd):
                pass
        message = str(info.value)
        assert message.startswith(f"image {tag!r} lacks what a horovod mpijob's pods run: ")
        assert message.split("pods run: ")[1].startswith("horovod, horovodrun. Fix:"), message
        assert _networks() == before
        with pod_containers(manifest(SCRIPT, workers=2, image=tag)) as pods:
            assert pods.network in _networks()  # TensorFlow and the kit are there: it starts
        base = manifest(SCRIPT, workers=2, image=build.BASE_IMAGE)
        with pytest.raises(ConfigError, match="lacks what a multi_worker job's pods run: python"):
            with pod_containers(base):
                pass
        assert _networks() == before
    finally:
        podman.run(["podman", "rmi", "--force", tag], check=False)


@pytest.mark.slow
@needs_podman
def test_pods_as_containers_train_mwms_and_stream_metrics(image, tmp_path):
    """Two containers named mnist-0, mnist-1 (and mnist-i.mnist) run the manifest's own
    command; they find each other by those names, train 3 steps and stream to a collector
    listening on this machine's address on the pods' network."""
    from ddlkit.metrics import Collector

    args = ["--steps-per-epoch", "3", "--epochs", "1", "--batch-size", "32"]
    probe = manifest(SCRIPT, workers=2, image=image, name="mnist", args=args)
    with pod_containers(probe) as pods:
        assert pods.names() == ["mnist-0.mnist", "mnist-1.mnist"]
        token = "k8s-container-token-1234"
        with Collector(tmp_path / "collected", host=pods.gateway, token=token) as collector:
            m = manifest(SCRIPT, workers=2, image=image, name="mnist", args=args,
                         collector=f"{pods.gateway}:{collector.port}",
                         token_secret="ddlkit-token")  # fmt: skip
            pods.start(m, mount=tmp_path / "volume", secrets={"ddlkit-token": {"token": token}})
            codes = pods.wait(timeout=300)
            logs = pods.logs()
            got = {r.worker for r in collector.records()}
    assert codes == [0, 0], logs
    assert got == {"worker-0", "worker-1"}, logs
    for i in (0, 1):
        assert f"ddlkit.k8s: worker-{i} TF_CONFIG=" in logs[f"mnist-{i}"]
        assert "mnist-0.mnist:2222" in logs[f"mnist-{i}"]
    results = contract.read_results(tmp_path / "volume" / "mnist")
    assert sorted(results) == ["worker-0", "worker-1"], logs
    assert all(r["replicas"] == 2 and r["steps"] == 3 for r in results.values()), results
    assert pods.leftovers() == []


@pytest.mark.slow
@needs_podman
def test_a_parameter_server_job_of_containers_finishes_and_its_servers_end(image, tmp_path):
    """Chief, ps and worker as three containers: the chief trains through the others, and
    `exec --ps` ends the ps and worker servers (which never end by themselves) once the
    chief's result is on the volume."""
    args = ["--steps-per-epoch", "20", "--epochs", "1", "--batch-size", "32", "--eval-every", "0",
            "--report-every", "10"]  # fmt: skip
    m = manifest("launch/train_parameter_server.py", strategy="parameter_server", workers=1,
                 ps=1, image=image, name="psjob", args=args)  # fmt: skip
    with pod_containers(m) as pods:
        pods.start(m, mount=tmp_path / "volume")
        codes = pods.wait(timeout=300)
        logs = pods.logs()
    assert codes == [0, 0, 0], logs
    for i, name in enumerate(("chief-0", "ps-0", "worker-0")):
        assert f"ddlkit.k8s: {name} TF_CONFIG=" in logs[f"psjob-{i}"], logs
    assert all("the chief reported" in logs[f"psjob-{i}"] for i in (1, 2)), logs
    results = contract.read_results(tmp_path / "volume" / "psjob")
    assert list(results) == ["chief-0"], logs
    assert results["chief-0"]["steps"] == 20, results
    assert pods.leftovers() == []


@pytest.mark.slow
@needs_podman
def test_horovod_runs_as_an_mpijob_across_containers_over_ssh(image, tmp_path):
    """The MPIJob's pods as the operator makes them: two workers running only sshd (the
    image's user, port 2222, keys from the job's Secret), and a launcher whose horovodrun
    reads the operator's hostfile and starts one rank in each worker over ssh and MPI."""
    from ddlkit.metrics import Collector

    args = ["--steps-per-epoch", "4", "--epochs", "1", "--batch-size", "32", "--eval-every", "0"]
    probe = manifest("launch/train_horovod.py", strategy="horovod", kind="mpijob", workers=2,
                     image=image, name="hvd", args=args)  # fmt: skip
    with pod_containers(probe) as pods:
        assert pods.names() == ["hvd-launcher.hvd.default.svc", "hvd-worker-0.hvd.default.svc",
                                "hvd-worker-1.hvd.default.svc"]  # fmt: skip
        token = "k8s-mpijob-token-1234"
        with Collector(tmp_path / "collected", host=pods.gateway, token=token) as collector:
            m = manifest("launch/train_horovod.py", strategy="horovod", kind="mpijob", workers=2,
                         image=image, name="hvd", args=args, token_secret="ddlkit-token",
                         collector=f"{pods.gateway}:{collector.port}")  # fmt: skip
            pods.start(m, mount=tmp_path / "volume", secrets={"ddlkit-token": {"token": token}})
            hostfile = (pods.etc / "mpi" / "hostfile").read_text()
            codes = pods.wait(timeout=300)
            logs = pods.logs()
            got = {r.worker for r in collector.records()}
    assert (
        hostfile == "hvd-worker-0.hvd.default.svc slots=1\nhvd-worker-1.hvd.default.svc slots=1\n"
    )
    assert codes == [0], logs  # the launcher's exit is the job's; the workers were then ended
    assert got == {"rank-0", "rank-1"}, logs  # one rank in each worker, both reporting
    results = contract.read_results(tmp_path / "volume" / "hvd")
    assert sorted(results) == ["rank-0", "rank-1"], logs
    assert all(r["replicas"] == 2 for r in results.values()), results
    tags = {line.split(":")[0] for line in logs["hvd-launcher"].splitlines() if "RESULT" in line}
    assert tags == {"[1,0]<stdout>", "[1,1]<stdout>"}, logs  # mpirun relays both ranks' output
    assert pods.leftovers() == [] and not pods.etc.exists()  # the Secret and hostfile too


@pytest.mark.slow
@needs_podman
def test_a_killed_container_fails_the_job_naming_its_pod_and_nothing_is_left(image, tmp_path):
    from ddlkit.metrics import Collector

    args = ["--steps-per-epoch", "5000", "--epochs", "1", "--batch-size", "32"]
    probe = manifest(SCRIPT, workers=2, image=image, name="drill", args=args)
    with pod_containers(probe) as pods:
        token = "k8s-container-token-5678"
        with Collector(tmp_path / "collected", host=pods.gateway, token=token) as collector:
            m = manifest(SCRIPT, workers=2, image=image, name="drill", args=args,
                         collector=f"{pods.gateway}:{collector.port}",
                         token_secret="ddlkit-token")  # fmt: skip
            pods.start(m, mount=tmp_path / "volume", secrets={"ddlkit-token": {"token": token}})
            deadline = time.monotonic() + 180
            while not any(r.kind == "step" for r in collector.records()):  # training has begun
                assert time.monotonic() < deadline, pods.logs()
                time.sleep(0.5)
            pods.kill(1)
            killed = time.monotonic()
            with pytest.raises(PodFailedError) as info:
                pods.wait(timeout=120)
            took = time.monotonic() - killed
    assert info.value.pod == "drill-1" and info.value.exit_code == 137, str(info.value)
    assert "pod drill-1 exited with code 137" in str(info.value)
    assert took < 30, took
    assert pods.leftovers() == []
    nets = subprocess.run(["podman", "network", "ls", "--filter", f"label={LABEL}={pods.run}",
                           "--format", "{{.Name}}"], capture_output=True, text=True,
                          env=podman.env())  # fmt: skip
    assert nets.stdout.split() == []


# A user's own MultiWorkerMirrored script, with no kit code in it: TF_CONFIG names the
# containers, and only podman's DNS (netavark's aardvark-dns) can say where they are.
PLAIN_MWMS = """
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
x = np.arange(64, dtype="float32").reshape(16, 4) / 64
model.fit(x, x.sum(axis=1, keepdims=True), batch_size=8, epochs=2, verbose=0)
print("replicas", strategy.num_replicas_in_sync, "kernel", model.get_weights()[0].ravel().tolist())
"""


@pytest.mark.slow
@needs_podman
def test_two_plain_containers_find_each_other_by_name_and_train(image, tmp_path):
    script = tmp_path / "plain_mwms.py"
    script.write_text(PLAIN_MWMS)
    run = f"ddlkit-test-dns-{time.monotonic_ns()}"
    names = [f"{run}-w{i}" for i in range(2)]
    cluster = {"worker": [f"{n}:23456" for n in names]}
    podman.run(["podman", "network", "create", run])
    try:
        for i, name in enumerate(names):
            config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            podman.run(["podman", "run", "--detach", "--name", name, "--network", run,
                        "--env", f"TF_CONFIG={config}", "--volume", f"{script}:/plain/mwms.py:ro",
                        image, "python", "/plain/mwms.py"])  # fmt: skip
        # Each ends by itself once trained; a name that resolves nowhere would wait for hours.
        codes = podman.run(["podman", "wait", *names], timeout=300).stdout.split()
        shown = [podman.run(["podman", "logs", n]) for n in names]
        logs = [done.stdout + done.stderr for done in shown]
    finally:
        podman.run(["podman", "rm", "--force", "--time", "0", *names], check=False)
        podman.run(["podman", "network", "rm", "--force", run], check=False)
    assert codes == ["0", "0"], logs
    lines = [next(ln for ln in log.splitlines() if ln.startswith("replicas")) for log in logs]
    assert lines[0].startswith("replicas 2 kernel") and lines[0] == lines[1], lines
    assert run not in _networks()


@pytest.mark.slow
@needs_podman
def test_a_pod_whose_peer_stays_pending_fails_in_bounded_time_naming_it(image, tmp_path):
    """Pod lone-1 never starts and its name resolves nowhere, as a Pending pod's: lone-0
    waits --peer-wait seconds, not TensorFlow's hour, then fails naming lone-1."""
    m = manifest(SCRIPT, workers=2, image=image, name="lone", peer_wait=5)
    with pod_containers(m) as pods:
        started = time.monotonic()
        pods.start(m, mount=tmp_path / "volume", pending={1})
        with pytest.raises(PodFailedError) as info:
            pods.wait(timeout=60)
        took = time.monotonic() - started
        log = pods.logs()["lone-0"]
    assert (info.value.pod, info.value.exit_code) == ("lone-0", 3), log
    assert "worker-0 waited 5 s for pod(s) lone-1 to get an address" in log
    assert "kubectl describe pod lone-1" in log and "Traceback" not in log
    assert took < 55, took  # 8-12 s here: a container start, Python's and the 5 s wait
    assert pods.leftovers() == []


def test_the_suite_prebuilds_the_image_only_when_it_runs_the_container_tests(tmp_path):
    from tests.harness.image_prebuild import NEEDS_IMAGE, ROOT, wanted

    assert wanted([], ROOT)  # the whole suite (testpaths)
    assert wanted(["tests"], ROOT) and wanted(["tests/k8s"], ROOT)
    assert wanted([f"{NEEDS_IMAGE}::test_x", "-x"], ROOT)
    assert wanted(["notebooks/11_kubernetes.ipynb"], ROOT) and wanted(["notebooks"], ROOT)
    assert not wanted(["tests/k8s/test_k8s_manifest.py", "notebooks/05_horovod.ipynb"], ROOT)
