"""Horovod's form of a training job: the MPI operator's ``MPIJob`` (``kubeflow.org/v2beta1``).

Where the MPI operator is installed, it reads one ``MPIJob``: a ``Launcher`` pod and
``Worker`` pods. It writes the workers' names into a hostfile it mounts at
``/etc/mpi/hostfile`` (``<job>-worker-<i>.<job>.<namespace>.svc slots=N``, also named by
``OMPI_MCA_orte_default_hostfile``), puts an SSH key pair in a Secret mounted at
``sshAuthMountPath`` in every pod, and starts the launcher once the workers run. The workers
run only ``sshd``, as the image's user (the operator's non-root pattern: port 2222, the
user's own ``sshd_config``); the launcher runs ``horovodrun --hostfile /etc/mpi/hostfile``,
which reaches every worker over ssh and starts one rank per slot there (without
``--hostfile`` it would start every rank on the launcher). When the launcher ends, the job
ends and the worker pods are deleted (``cleanPodPolicy: Running``). The checkpoint volume
claim is the same object as in the core form.
"""

from __future__ import annotations

from ddlkit.k8s import objects
from ddlkit.k8s.plan import JobPlan

HOSTFILE = "/etc/mpi/hostfile"  # where the operator mounts the hostfile it writes
SSH_DIR = "/home/ddlkit/.ssh"  # sshAuthMountPath: the image's user's (Containerfile)
SSHD_CONFIG = "/home/ddlkit/.sshd_config"  # the image's non-root sshd settings (port 2222)
SSH_PORT = 2222
NAMESPACE = "default"  # the hostfile's names hold the namespace; the kit writes no other


def launcher_command(plan: JobPlan, slots: int = 1) -> list[str]:
    """``horovodrun`` over the operator's hostfile (an argv: no shell)."""
    ranks = plan.workers * slots
    return ["horovodrun", "-np", str(ranks), "--hostfile", HOSTFILE, "--mpi",
            "python", plan.script, *plan.args]  # fmt: skip


def worker_command() -> list[str]:
    """The worker pods' one process: sshd in the foreground, logging to stderr."""
    return ["/usr/sbin/sshd", "-De", "-f", SSHD_CONFIG]


def hostfile_of(workers: list[str], job: dict) -> str:
    """The hostfile the operator writes for an MPIJob's ``workers`` (their DNS names; pure)."""
    slots = job["spec"]["slotsPerWorker"]
    return "".join(f"{host} slots={slots}\n" for host in workers)


def _replica(plan: JobPlan, replicas: int, command: list[str], role: str) -> dict:
    container = objects.container(plan, command, gpus=role == "worker", port_name="ssh")
    container["name"] = f"mpi-{role}"
    if role == "worker":  # sshd: the launcher's mpirun reaches each worker here
        container["ports"] = [{"name": "ssh", "containerPort": SSH_PORT}]
    else:  # the launcher runs no rank and listens on nothing: no GPU
        del container["ports"]
        container["resources"] = objects.resources(plan, gpus=False)
    return {
        "replicas": replicas,
        "restartPolicy": "Never",
        "template": {
            "metadata": {"labels": objects.labels(plan)},
            "spec": {
                "containers": [container],
                "volumes": objects.volumes(plan),
                **objects.pod_options(plan),
            },
        },
    }


def mpijob(plan: JobPlan, slots: int = 1) -> dict:
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": plan.name, "labels": objects.labels(plan)},
        "spec": {
            "slotsPerWorker": slots,
            "sshAuthMountPath": SSH_DIR,
            # The launcher's exit is the job's; a failed rank fails mpirun, so no retries.
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": plan.retries},
            "mpiReplicaSpecs": {
                "Launcher": _replica(plan, 1, launcher_command(plan, slots), "launcher"),
                "Worker": _replica(plan, plan.workers, worker_command(), "worker"),
            },
        },
    }


def objects_mpijob(plan: JobPlan) -> tuple[dict, ...]:
    return (objects.volume_claim(plan), mpijob(plan))
