"""The core-API form of a training job: headless Service, checkpoint volume claim, Indexed Job.

Pure functions from a :class:`~ddlkit.k8s.plan.JobPlan` to plain dicts (what ``kubectl
apply -f`` reads), with nothing but Kubernetes' own API (``v1`` and ``batch/v1``, 1.30 and
later): no operator needs to be installed. Two things the core API leaves to the cluster: a
storage class that offers ReadWriteMany volumes, and all-or-nothing scheduling of the pods
(a Job is not gang-scheduled: Kueue, JobSet or Volcano add it). Why each field is there is
said beside it; tests/k8s/ validates the objects against the official schemas
(``kubernetes-validate``).
"""

from __future__ import annotations

from ddlkit import contract
from ddlkit.k8s.plan import CONTAINER, MOUNT, JobPlan

JOB_LABEL = "ddlkit.io/job"  # our label on the pods; the Service selects them by it
EXIT_BAD_INPUT = 2  # ddlkit's exit code for bad input: restarting cannot fix it


def labels(plan: JobPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "ddlkit", JOB_LABEL: plan.name}


def service(plan: JobPlan) -> dict:
    """The headless Service that gives every pod the DNS name ``<job>-<index>.<service>``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": plan.service, "labels": labels(plan)},
        "spec": {
            "clusterIP": "None",  # headless: DNS names each pod, no load-balancing virtual IP
            "selector": labels(plan),
            # Names resolve before a pod is Ready: TensorFlow's servers dial their peers while
            # starting, and a training pod has no readiness probe to pass first.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "tf", "port": plan.port, "targetPort": plan.port}],
        },
    }


def volume_claim(plan: JobPlan) -> dict:
    """The volume every pod mounts: the run directory, and a script's checkpoints and
    backups (BackupAndRestore's, where the script has one).

    ReadWriteMany: all pods write to one run directory, and a replaced pod (on any node)
    finds what its predecessor left. Only a storage class whose provisioner offers it (an
    NFS, CephFS or cloud file-share driver) can bind such a claim; the default class of most
    clusters offers block disks (ReadWriteOnce), and the claim, with every pod, would stay
    Pending. ``storage_class`` names one.
    """
    spec = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": plan.storage}},
    }
    if plan.storage_class is not None:
        spec["storageClassName"] = plan.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": plan.claim, "labels": labels(plan)},
        "spec": spec,
    }


def exec_command(plan: JobPlan) -> list[str]:
    """The pod's command: ``python -m ddlkit.k8s exec`` builds TF_CONFIG, then runs the script."""
    shape = ["--job", plan.name, "--service", plan.service, "--pods", str(plan.pods)]
    if plan.ps:  # parameter_server (the plan allows ps tasks for it alone)
        shape += ["--ps", str(plan.ps)]
    shape += ["--port", str(plan.port), "--peer-wait", f"{plan.peer_wait:g}"]
    return ["python", "-m", "ddlkit.k8s", "exec", *shape, "--", plan.script, *plan.args]


def resources(plan: JobPlan, gpus: bool = True) -> dict:
    """Requests equal to limits: the Guaranteed QoS class, so a training pod is among the last
    to be evicted under memory pressure and, with the static CPU manager and an integer
    ``cpu``, gets whole cores of its own."""
    amounts = {"cpu": plan.cpu, "memory": plan.memory}
    if gpus and plan.gpus:
        amounts["nvidia.com/gpu"] = str(plan.gpus)  # the NVIDIA device plugin's resource
    return {"requests": dict(amounts), "limits": dict(amounts)}


def env(plan: JobPlan) -> list[dict]:
    """What every pod is told besides TF_CONFIG (which ``exec`` builds from its index)."""
    out = [{"name": contract.RUN_DIR_VAR, "value": plan.run_dir}]
    if plan.collector is not None:  # live metrics: the collector's address and its token
        out.append({"name": contract.COLLECTOR_VAR, "value": plan.collector})
        secret = {"name": plan.token_secret, "key": "token"}  # from a Secret, never inline
        out.append({"name": contract.TOKEN_VAR, "valueFrom": {"secretKeyRef": secret}})
    return out


def container(plan: JobPlan, command: list[str], gpus: bool = True, port_name: str = "tf") -> dict:
    return {
        "name": CONTAINER,
        "image": plan.image,
        "command": command,  # an argv: no shell between Kubernetes and Python
        "env": env(plan),
        "ports": [{"name": port_name, "containerPort": plan.port}],
        "resources": resources(plan, gpus),
        "volumeMounts": [{"name": "checkpoints", "mountPath": MOUNT}]
        + ([{"name": "dshm", "mountPath": "/dev/shm"}] if plan.shm else []),
    }


def volumes(plan: JobPlan) -> list[dict]:
    out = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": plan.claim}}]
    if plan.shm:  # the container runtime gives /dev/shm 64 MiB; this one is RAM, up to shm
        out.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": plan.shm}})
    return out


def pod_options(plan: JobPlan) -> dict:
    """What a pod spec adds for a real cluster: the private registry's pull Secret and the
    node labels its pods need (e.g. GPU nodes), when given."""
    out: dict = {}
    if plan.pull_secret:
        out["imagePullSecrets"] = [{"name": plan.pull_secret}]
    if plan.node_selector:
        out["nodeSelector"] = dict(plan.node_selector)
    return out


def pod_failure_policy() -> dict:
    """Which pod failures count: bad input fails the job at once, disruptions not at all."""
    return {
        "rules": [
            {  # ddlkit's bad-input exit: the same command would fail again in every retry
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [EXIT_BAD_INPUT],
                },
            },
            {  # eviction, preemption, a drained node: not the program's fault, not counted
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def job(plan: JobPlan) -> dict:
    """The Indexed Job: one pod per TensorFlow task, each told its index."""
    spec = {
        "completionMode": "Indexed",  # pod i gets JOB_COMPLETION_INDEX=i, host name <job>-i
        "completions": plan.pods,
        # The controller creates every pod at once; the scheduler still places each on its
        # own, so with too little room some run and wait for peers that stay Pending (gang
        # admission: Kueue, JobSet or Volcano on the cluster).
        "parallelism": plan.pods,
        # A failed pod is replaced with the same index, so the same name: its peers find the
        # replacement where the old pod was. MultiWorkerMirroredStrategy: a lost worker fails
        # its peers' collectives (after a timeout), each failed index is replaced, and every
        # replacement starts the script again: from the beginning, or from the last backup
        # when the script uses BackupAndRestore on the shared volume. Few retries: each costs
        # that much work. ParameterServerStrategy: a worker may be replaced while training
        # goes on (the coordinator reschedules its steps and reconnects to the same address),
        # so it gets more retries.
        "backoffLimitPerIndex": plan.retries,
        "maxFailedIndexes": 0,  # an index out of retries fails the job: no task is optional
        "podFailurePolicy": pod_failure_policy(),
        # Start a replacement only once the old pod has failed and is gone: never two pods
        # with one host name (<job>-<i>). With a podFailurePolicy it is the only value the
        # API accepts.
        "podReplacementPolicy": "Failed",
        "template": {
            "metadata": {"labels": labels(plan)},
            "spec": {
                "subdomain": plan.service,  # with the headless Service: <job>-<i>.<service>
                "restartPolicy": "Never",  # the Job replaces pods (needed by the policies above)
                "containers": [container(plan, exec_command(plan))],
                "volumes": volumes(plan),
                **pod_options(plan),
            },
        },
    }
    if plan.ps:  # parameter_server
        # The job is done when the chief (index 0) is: the Job controller then ends the ps
        # and worker pods, whose servers never exit by themselves (Kubernetes >= 1.31; on
        # 1.30 `exec --ps` ends them once the chief's result is on the shared volume).
        spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": plan.name, "labels": labels(plan)},
        "spec": spec,
    }


def objects(plan: JobPlan) -> tuple[dict, ...]:
    """Service first: the names must exist when the pods start dialling each other."""
    return (service(plan), volume_claim(plan), job(plan))
