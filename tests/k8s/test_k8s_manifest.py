"""The manifests `ddlkit k8s manifest` writes, checked against Kubernetes' official schemas.

kubernetes-validate (PyPI, 1.37.0) ships the JSON schemas of Kubernetes 1.25-1.37 and
validates offline (1.30's is the first with every field of the Job form: successPolicy came
then); ``strict`` rejects a field the API does not know. It does not check enum values, so
those are asserted here. The TFJob form has no schema in any registry
this kit installs from: its test is structural, against the fields of Kubeflow's CRD
(kubeflow/training-operator, manifests/base/crds/kubeflow.org_tfjobs.yaml, kubeflow.org/v1),
with each pod template validated as a core PodTemplate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ddlkit.errors import ConfigError
from ddlkit.image import KIT_IMAGE
from ddlkit.k8s import manifest
from ddlkit.k8s.objects import JOB_LABEL

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30.0", "1.37.0")  # the oldest Kubernetes the Job form needs, the newest known
IMAGE = "registry.example/ddlkit:0.1"
SHAPES = [  # strategy, workers, ps, gpus
    ("multi_worker", 1, 0, 0),
    ("multi_worker", 4, 0, 2),
    ("parameter_server", 1, 1, 0),
    ("parameter_server", 3, 2, 1),
]


def _validate(obj: dict, version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def _by_kind(m) -> dict[str, dict]:
    return {o["kind"]: o for o in m.to_dicts()}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("strategy", "workers", "ps", "gpus"), SHAPES)
def test_every_object_is_valid_for_kubernetes(strategy, workers, ps, gpus, version):
    m = manifest("train.py", strategy=strategy, workers=workers, ps=ps, gpus=gpus, image=IMAGE)
    assert [o["kind"] for o in m.objects] == ["Service", "PersistentVolumeClaim", "Job"]
    for obj in m.to_dicts():
        _validate(obj, version)


def test_the_schema_check_can_fail():
    job = _by_kind(manifest("train.py", image=IMAGE))["Job"]
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"  # a typo
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolcy"):
        _validate(job, "1.30.0")


@pytest.mark.parametrize(("strategy", "workers", "ps", "gpus"), SHAPES)
def test_the_job_runs_one_pod_per_task_named_through_the_headless_service(
    strategy, workers, ps, gpus
):
    m = manifest("train.py", strategy=strategy, workers=workers, ps=ps, gpus=gpus, image=IMAGE,
                 name="mnist", args=["--epochs", "3"])  # fmt: skip
    objs = _by_kind(m)
    pods = workers + (1 + ps if strategy == "parameter_server" else 0)
    spec = objs["Job"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == pods == m.plan.pods
    pod = spec["template"]["spec"]
    svc = objs["Service"]["spec"]
    assert pod["subdomain"] == objs["Service"]["metadata"]["name"] == "mnist"
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert svc["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert svc["selector"][JOB_LABEL] == "mnist"
    (box,) = pod["containers"]
    assert box["command"][:4] == ["python", "-m", "ddlkit.k8s", "exec"]
    tail = box["command"][box["command"].index("--") :]
    assert tail == ["--", "train.py", "--epochs", "3"]
    shape = box["command"][4 : box["command"].index("--")]
    assert shape[shape.index("--pods") + 1] == str(pods)
    assert ("--ps" in shape) == (strategy == "parameter_server")
    assert box["ports"] == [{"name": "tf", "containerPort": 2222}]
    res = box["resources"]
    assert res["requests"] == res["limits"]  # Guaranteed QoS
    assert res["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    claim = objs["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    (vol,) = pod["volumes"]
    assert vol["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert box["volumeMounts"] == [{"name": vol["name"], "mountPath": "/checkpoints"}]
    assert {"name": "DDLKIT_RUN_DIR", "value": "/checkpoints/mnist"} in box["env"]


def test_restart_policy_fits_the_strategy():
    mwms = _by_kind(manifest("t.py", strategy="multi_worker", workers=2, image=IMAGE))["Job"]
    ps = _by_kind(manifest("t.py", strategy="parameter_server", workers=2, ps=1, image=IMAGE))
    ps = ps["Job"]
    for spec in (mwms["spec"], ps["spec"]):
        assert spec["template"]["spec"]["restartPolicy"] == "Never"  # the Job replaces pods
        assert spec["podReplacementPolicy"] == "Failed" and spec["maxFailedIndexes"] == 0
        rules = spec["podFailurePolicy"]["rules"]
        assert [r["action"] for r in rules] == ["FailJob", "Ignore"]
        assert rules[0]["onExitCodes"]["values"] == [2]  # bad input: no retry
        assert rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget"
    # a PS worker may be replaced while training goes on: more retries than MWMS
    assert ps["spec"]["backoffLimitPerIndex"] > mwms["spec"]["backoffLimitPerIndex"] >= 1
    assert ps["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}  # the chief
    assert "successPolicy" not in mwms["spec"]


def test_the_volume_claim_names_a_storage_class_that_offers_read_write_many():
    default = _by_kind(manifest("t.py", image=IMAGE))["PersistentVolumeClaim"]
    assert "storageClassName" not in default["spec"]  # the cluster's default class
    m = manifest("t.py", image=IMAGE, storage_class="nfs-client")
    claim = _by_kind(m)["PersistentVolumeClaim"]
    assert claim["spec"]["storageClassName"] == "nfs-client"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for version in VERSIONS:
        _validate(claim, version)
    out = _cli("--image", IMAGE, "--storage-class", "cephfs.csi", "t.py", cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "storageClassName: cephfs.csi" in out.stdout


def test_live_metrics_take_the_token_from_a_secret_never_inline():
    m = manifest("t.py", image=IMAGE, collector="10.0.0.5:7000", token_secret="ddlkit-token")
    (box,) = _by_kind(m)["Job"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in box["env"]}
    assert env["DDLKIT_COLLECTOR"]["value"] == "10.0.0.5:7000"
    ref = env["DDLKIT_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ddlkit-token", "key": "token"} and "value" not in env["DDLKIT_TOKEN"]
    _validate(_by_kind(m)["Job"], "1.30.0")


# --- the TFJob form: structural, against the fields of Kubeflow's CRD (kubeflow.org/v1) -----
TFJOB_SPEC = {"enableDynamicWorker", "runPolicy", "successPolicy", "tfReplicaSpecs"}
RUN_POLICY = {"activeDeadlineSeconds", "backoffLimit", "cleanPodPolicy", "schedulingPolicy",
              "suspend", "ttlSecondsAfterFinished", "managedBy"}  # fmt: skip
REPLICA = {"replicas", "restartPolicy", "template"}
REPLICA_TYPES = {"Chief", "PS", "Worker", "Evaluator", "Master"}
RESTART = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN = {"None", "Running", "All"}


@pytest.mark.parametrize(("strategy", "workers", "ps", "gpus"), SHAPES)
def test_the_tfjob_form_has_only_the_crds_fields(strategy, workers, ps, gpus):
    m = manifest("train.py", strategy=strategy, workers=workers, ps=ps, gpus=gpus, image=IMAGE,
                 kind="tfjob", args=["--epochs", "1"])  # fmt: skip
    objs = _by_kind(m)
    assert sorted(objs) == ["PersistentVolumeClaim", "TFJob"]
    _validate(objs["PersistentVolumeClaim"], "1.30.0")
    job = objs["TFJob"]
    assert (job["apiVersion"], set(job)) == ("kubeflow.org/v1", {"apiVersion", "kind",
                                                                 "metadata", "spec"})  # fmt: skip
    assert set(job["spec"]) <= TFJOB_SPEC and set(job["spec"]["runPolicy"]) <= RUN_POLICY
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] in CLEAN
    specs = job["spec"]["tfReplicaSpecs"]
    assert set(specs) <= REPLICA_TYPES
    want = {"Worker": workers} | ({"Chief": 1, "PS": ps} if strategy == "parameter_server" else {})
    assert {k: v["replicas"] for k, v in specs.items()} == want
    for role, replica in specs.items():
        assert set(replica) <= REPLICA and replica["restartPolicy"] in RESTART
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                    "template": replica["template"]}  # fmt: skip
        for version in VERSIONS:
            _validate(template, version)
        (box,) = replica["template"]["spec"]["containers"]
        assert box["name"] == "tensorflow"  # the operator looks for this container
        assert box["command"] == ["python", "train.py", "--epochs", "1"]  # it sets TF_CONFIG
        assert box["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]  # and reads this
        gpu = box["resources"]["limits"].get("nvidia.com/gpu")
        assert gpu == (str(gpus) if gpus and role != "PS" else None)  # ps: CPU only


# --- YAML, the CLI, bad input ---------------------------------------------------------------
def _cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "ddlkit.cli", "k8s", "manifest", *argv],
                          cwd=cwd, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_cli_writes_the_same_yaml_to_stdout_and_to_a_file(tmp_path):
    argv = ["--strategy", "parameter_server", "-n", "2", "--ps", "1", "--image", IMAGE,
            "launch/train_parameter_server.py", "--", "--epochs", "1", "a b"]  # fmt: skip
    out = _cli(*argv, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    want = manifest("launch/train_parameter_server.py", strategy="parameter_server",
                    workers=2, ps=1, image=IMAGE, args=["--epochs", "1", "a b"])  # fmt: skip
    assert docs == want.to_dicts()
    written = _cli("-o", "job.yaml", *argv, cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "job.yaml").read_text() == out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]  # no temporary left
    assert "headless" in repr(want) and "<table>" in want._repr_html_()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-n", "2", "--image", " ", "t.py"], "is not an image name"),
        (["-n", "0", "--image", IMAGE, "t.py"], "workers=0"),
        (["-n", "-1", "--image", IMAGE, "t.py"], "workers=-1"),
        (["--strategy", "parameter_server", "--image", IMAGE, "t.py"], "ps=0"),
        (["--ps", "1", "--image", IMAGE, "t.py"], "leave --ps out"),
        (["--image", IMAGE, "--name", "My_Job", "t.py"], "DNS label"),
        (["--image", IMAGE, "--memory", "lots", "t.py"], "resource quantity"),
        (["--image", IMAGE, "--collector", "h:1", "t.py"], "go together"),
        (["--image", IMAGE, "--storage-class", "Fast_SSD", "t.py"], "not a StorageClass name"),
        (["--image", IMAGE, "--node-selector", "gpu", "t.py"], "is not KEY=VALUE"),
        (["--image", IMAGE, "--node-selector", "a b=c", "t.py"], "is not a Kubernetes label"),
        (["--image", IMAGE, "--shm", "lots", "t.py"], "resource quantity"),
        (["--image", IMAGE, "--image-pull-secret", "Reg_Key", "t.py"], "DNS label"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, argv, words):
    proc = _cli("-o", "job.yaml", *argv, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert words in proc.stderr and "Fix:" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_kits_own_image_is_the_default_and_the_cli_says_how_to_push_it(tmp_path):
    (box,) = _by_kind(manifest("t.py"))["Job"]["spec"]["template"]["spec"]["containers"]
    assert box["image"] == KIT_IMAGE == "localhost/ddlkit:0.1.0"  # what `make image` tags
    out = _cli("t.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"image: {KIT_IMAGE}" in out.stdout
    note = "podman tag localhost/ddlkit:0.1.0 REGISTRY/ddlkit:0.1.0 && podman push"
    assert note in out.stderr and "--image REGISTRY/ddlkit:0.1.0" in out.stderr
    pushed = _cli("--image", IMAGE, "t.py", cwd=tmp_path)
    assert pushed.returncode == 0 and pushed.stderr == ""  # a registry's image: no note


def _pod_specs(m) -> list[dict]:
    """Every pod template's spec of a manifest, whichever its kind."""
    top = m.to_dicts()[-1]
    if top["kind"] == "Job":
        return [top["spec"]["template"]["spec"]]
    replicas = top["spec"].get("tfReplicaSpecs") or top["spec"]["mpiReplicaSpecs"]
    return [r["template"]["spec"] for r in replicas.values()]


@pytest.mark.parametrize(
    ("strategy", "kind"),
    [("multi_worker", "job"), ("parameter_server", "tfjob"), ("horovod", "mpijob")],
)
def test_a_real_clusters_registry_nodes_and_shared_memory_are_pod_fields(strategy, kind):
    """The three things a real cluster most often needs changed, each a valid pod field."""
    m = manifest("t.py", strategy=strategy, workers=2, ps=1 if strategy == "parameter_server"
                 else 0, image=IMAGE, kind=kind, gpus=1, pull_secret="registry-key",
                 node_selector={"nvidia.com/gpu.present": "true"}, shm="1Gi")  # fmt: skip
    for spec in _pod_specs(m):
        assert spec["imagePullSecrets"] == [{"name": "registry-key"}]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in spec[
            "volumes"
        ]
        (box,) = spec["containers"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in box["volumeMounts"]
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                    "template": {"spec": spec}}  # fmt: skip
        for version in VERSIONS:
            _validate(template, version)
    plain = _pod_specs(manifest("t.py", image=IMAGE))[0]
    assert "imagePullSecrets" not in plain and "nodeSelector" not in plain
    assert [v["name"] for v in plain["volumes"]] == ["checkpoints"]


def test_bad_input_in_python_is_a_config_error():
    with pytest.raises(ConfigError, match="is not an image name"):
        manifest("t.py", workers=2, image="")
    with pytest.raises(ConfigError, match="kind 'helm' is unknown"):
        manifest("t.py", image=IMAGE, kind="helm")


# --- Horovod: the MPI operator's MPIJob -----------------------------------------------------
# The fields of MPIJobSpec, RunPolicy and ReplicaSpec in kubeflow/mpi-operator's
# pkg/apis/kubeflow/v2beta1/types.go (kubeflow.org/v2beta1); no schema of it is installed here.
MPIJOB_SPEC = {"slotsPerWorker", "runPolicy", "mpiReplicaSpecs", "sshAuthMountPath",
               "waitForWorkers", "mpiImplementation"}  # fmt: skip


def test_horovod_is_an_mpijob_whose_launcher_reads_the_operators_hostfile():
    m = manifest("launch/train_horovod.py", strategy="horovod", kind="mpijob", workers=2,
                 image=IMAGE, name="hvd", args=["--epochs", "1"], gpus=1)  # fmt: skip
    objs = _by_kind(m)
    assert sorted(objs) == ["MPIJob", "PersistentVolumeClaim"] and m.plan.pods == 3
    job = objs["MPIJob"]
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and set(job["spec"]) <= MPIJOB_SPEC
    assert set(job["spec"]["runPolicy"]) <= RUN_POLICY
    specs = job["spec"]["mpiReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Launcher": 1, "Worker": 2}
    for replica in specs.values():
        assert set(replica) <= REPLICA and replica["restartPolicy"] in RESTART
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                    "template": replica["template"]}  # fmt: skip
        for version in VERSIONS:
            _validate(template, version)
    (launcher,) = specs["Launcher"]["template"]["spec"]["containers"]
    (worker,) = specs["Worker"]["template"]["spec"]["containers"]
    # Without --hostfile, horovodrun would start both ranks on the launcher itself.
    want = ["horovodrun", "-np", "2", "--hostfile", "/etc/mpi/hostfile", "--mpi", "python",
            "launch/train_horovod.py", "--epochs", "1"]  # fmt: skip
    assert launcher["command"] == want
    assert worker["command"] == ["/usr/sbin/sshd", "-De", "-f", "/home/ddlkit/.sshd_config"]
    assert job["spec"]["sshAuthMountPath"] == "/home/ddlkit/.ssh"  # the image's user's
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"  # ranks run on the workers
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"]


@pytest.mark.parametrize(
    ("strategy", "kind", "words"),
    [("horovod", "job", "use kind='mpijob'"), ("horovod", "tfjob", "use kind='mpijob'"),
     ("multi_worker", "mpijob", "runs Horovod only")],
)  # fmt: skip
def test_a_kind_that_cannot_run_the_strategy_is_one_error(strategy, kind, words):
    with pytest.raises(ConfigError, match=words):
        manifest("t.py", strategy=strategy, kind=kind, image=IMAGE)
