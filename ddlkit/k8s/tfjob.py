"""The Kubeflow form of a training job: one ``TFJob`` (``kubeflow.org/v1``).

The TFJob belongs to Kubeflow's legacy Training Operator (v1, in maintenance: security fixes
only); its successor, Kubeflow Trainer v2, replaces TFJob, PyTorchJob and MPIJob with one
``TrainJob`` and ships no TensorFlow runtime. Where the v1 operator is installed, it reads
``tfReplicaSpecs``, makes a pod and a Service per replica and writes every pod's TF_CONFIG
itself, so the container runs the script directly: no ``ddlkit.k8s exec``. What it gives
that the core-API form cannot: a pod template per role (the ps tasks need no GPU) and the
operator's own restart rules. The checkpoint volume claim is the same object as in the core form.
"""

from __future__ import annotations

from ddlkit.k8s import objects
from ddlkit.k8s.plan import JobPlan


def replica(plan: JobPlan, replicas: int, restart: str, gpus: bool = True) -> dict:
    command = ["python", plan.script, *plan.args]
    return {
        "replicas": replicas,
        "restartPolicy": restart,
        "template": {
            "metadata": {"labels": objects.labels(plan)},
            "spec": {
                # "tfjob-port": the port the operator writes into every TF_CONFIG
                "containers": [objects.container(plan, command, gpus, "tfjob-port")],
                "volumes": objects.volumes(plan),
                **objects.pod_options(plan),
            },
        },
    }


def tfjob(plan: JobPlan) -> dict:
    """The TFJob: ``Worker`` replicas (MWMS), or ``Chief`` + ``PS`` + ``Worker`` (PS)."""
    # ExitCode: the operator restarts a pod that died of a signal or a retryable code
    # (128+), not one that exited 1-127 (a bug or bad input would fail again).
    if not plan.ps:  # multi_worker: every pod a worker
        specs = {"Worker": replica(plan, plan.workers, "ExitCode")}
    else:
        specs = {
            "Chief": replica(plan, 1, "ExitCode"),
            "PS": replica(plan, plan.ps, "ExitCode", gpus=False),  # variables only: CPU
            "Worker": replica(plan, plan.workers, "ExitCode"),
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": plan.name, "labels": objects.labels(plan)},
        "spec": {
            # Running: when the job ends, the pods still running (ps servers) are deleted.
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": plan.retries},
            "tfReplicaSpecs": specs,
        },
    }


def objects_tfjob(plan: JobPlan) -> tuple[dict, ...]:
    return (objects.volume_claim(plan), tfjob(plan))
