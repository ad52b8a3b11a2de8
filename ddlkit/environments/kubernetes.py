"""Kubernetes as an environment: an Indexed Job starts the pods, each reads who it is.

What :mod:`ddlkit.k8s` (``python -m ddlkit.k8s exec``, run in every pod of the manifest
``ddlkit k8s manifest`` writes) builds on. The Job controller gives each pod of an Indexed
Job (``completionMode: Indexed``) its index in ``JOB_COMPLETION_INDEX`` and the host name
``<job>-<index>``; the pod template's ``subdomain`` names a headless Service, so every pod
is reachable at the stable DNS name ``<job>-<index>.<service>`` (from pods of the same
namespace). Those names, one port, and the pod's index are all TF_CONFIG needs:

- ``ps=0`` (MultiWorkerMirroredStrategy): pod i is ``worker`` i (worker 0 is the chief);
- ``ps=K`` (ParameterServerStrategy): pod 0 is the ``chief`` (coordinator), pods 1..K
  the ``ps`` tasks, the rest ``worker`` (the same order as Slurm's, :func:`ps_roles`).

A replaced pod (``restartPolicy: Never`` and a per-index backoff limit) gets the same index
and so the same name: its peers find it where the old one was. Pure functions of an
environment mapping; :class:`Kubernetes` is the environment of one pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddlkit._tables import html_table
from ddlkit.cluster import ClusterSpec, Task
from ddlkit.environments.base import Environment
from ddlkit.environments.slurm import ps_roles
from ddlkit.errors import ConfigError

INDEX_VAR = "JOB_COMPLETION_INDEX"  # Kubernetes' own: set in every pod of an Indexed Job
SERVICE_HOST_VAR = "KUBERNETES_SERVICE_HOST"  # Kubernetes' own: set in every pod
TF_PORT = 2222  # TensorFlow's customary server port; every pod has its own address
# A DNS label (RFC 1123): what Kubernetes accepts as a Job or Service name.
_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
INSIDE_FIX = (
    "Fix: run it as the command of a pod of an Indexed Job (`completionMode: Indexed`), "
    "e.g. the manifest `ddlkit k8s manifest` writes; by hand, set JOB_COMPLETION_INDEX=0..N-1."
)


def check_label(kind: str, value: str, most: int = 63) -> str:
    """``value`` if it is a DNS label Kubernetes accepts as a ``kind`` name, else ConfigError."""
    if not isinstance(value, str) or len(value) > most or not _LABEL_RE.fullmatch(value):
        raise ConfigError(
            f"{kind} name {value!r} is not a Kubernetes DNS label. Fix: use 1-{most} lower-case "
            f"letters, digits or '-', starting and ending with a letter or digit, e.g. 'mnist'."
        )
    return value


def pod_host(job: str, service: str, index: int) -> str:
    """Pod ``index``'s stable name: ``<job>-<index>.<service>`` (Indexed Job + subdomain)."""
    return f"{job}-{index}.{service}"


@dataclass(frozen=True)
class Pod:
    """One pod of the job: its index among ``pods``, the names that reach it, its role."""

    job: str
    service: str
    index: int
    pods: int
    ps: int = 0
    port: int = TF_PORT

    def __post_init__(self) -> None:
        check_label("Job", self.job)
        check_label("Service", self.service)
        if not isinstance(self.pods, int) or self.pods < 1:
            raise ConfigError(
                f"{self.pods!r} pods: the job needs at least one. Fix: pass --pods N with N >= 1 "
                f"(the Job's `completions`)."
            )
        if not isinstance(self.index, int) or not 0 <= self.index < self.pods:
            raise ConfigError(
                f"{INDEX_VAR}={self.index!r} is outside 0..{self.pods - 1} for a job of "
                f"{self.pods} pods. Fix: pass --pods equal to the Job's `completions`."
            )
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is not a TCP port. Fix: use 1..65535, e.g. 2222.")
        if self.ps:
            ps_roles(self.pods, self.ps)  # ConfigError if chief + ps + one worker do not fit

    @property
    def host(self) -> str:
        return pod_host(self.job, self.service, self.index)


def pod_from_env(
    environ: Mapping[str, str], job: str, service: str, pods: int, ps: int = 0, port: int = TF_PORT
) -> Pod:
    """This pod, from ``JOB_COMPLETION_INDEX`` and the job's shape (ConfigError naming the fix)."""
    text = environ.get(INDEX_VAR)
    if text is None or text == "":
        raise ConfigError(
            f"{INDEX_VAR} is not set: this is not a pod of an Indexed Job. {INSIDE_FIX}"
        )
    if not text.isdigit():
        raise ConfigError(f"{INDEX_VAR}={text!r} is not a number. {INSIDE_FIX}")
    return Pod(job, service, int(text), pods, ps, port)


class Kubernetes(Environment):
    """This pod of an Indexed Job (the Job controller started it): who it is, its cluster."""

    name = "kubernetes"
    creates_processes_externally = True

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.host = pod.host

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """A pod of an Indexed Job: Kubernetes' service variable and a completion index."""
        return bool(environ.get(SERVICE_HOST_VAR)) and environ.get(INDEX_VAR, "").isdigit()

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        job: str,
        service: str,
        pods: int,
        ps: int = 0,
        port: int = TF_PORT,
    ) -> Kubernetes:
        return cls(pod_from_env(environ, job, service, pods, ps, port))

    def world_size(self) -> int:
        return self.pod.pods

    def global_rank(self) -> int:
        return self.pod.index

    def roles(self) -> dict[str, int]:
        if not self.pod.ps:
            return {"worker": self.pod.pods}
        return ps_roles(self.pod.pods, self.pod.ps)

    def cluster(self) -> ClusterSpec:
        """Every pod's task at ``<job>-<i>.<service>:port``, roles in order chief, ps, worker."""
        roles = [role for role, count in self.roles().items() for _ in range(count)]
        seen: dict[str, int] = {}
        tasks = []
        for i, role in enumerate(roles):
            tasks.append(
                Task(
                    role,
                    seen.get(role, 0),
                    pod_host(self.pod.job, self.pod.service, i),
                    self.pod.port,
                )
            )
            seen[role] = seen.get(role, 0) + 1
        return ClusterSpec(tuple(tasks))

    def _repr_html_(self) -> str:
        rows = [
            (t.name, t.address, "this pod" if t == self.task() else "")
            for t in self.cluster().tasks
        ]
        return html_table(("task", "address", ""), rows, caption=f"Kubernetes job {self.pod.job}")
