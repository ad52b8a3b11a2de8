"""What a Kubernetes training job is made of, checked: :class:`JobPlan` (pure data).

``dk.k8s.manifest(...)`` checks its arguments here once (one ConfigError naming the value
and the fix, before anything is built or written), then :mod:`ddlkit.k8s.objects` (an
Indexed Job + headless Service, core API only) or :mod:`ddlkit.k8s.tfjob` (Kubeflow's
TFJob) turn the plan into Kubernetes objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddlkit import strategies
from ddlkit.environments.kubernetes import TF_PORT, check_label
from ddlkit.errors import ConfigError
from ddlkit.image import KIT_IMAGE
from ddlkit.k8s.peers import DEFAULT_PEER_WAIT

STRATEGIES = ("multi_worker", "parameter_server", "horovod")
KINDS = ("job", "tfjob", "mpijob")
# Which kinds can run which strategies: TensorFlow's own on the Indexed Job or a TFJob;
# Horovod under an MPI launcher only (the MPI operator's MPIJob, ddlkit.k8s.mpijob).
MPI_KINDS = ("mpijob",)
CONTAINER = "tensorflow"  # the container's name (Kubeflow's TFJob requires this one)
MOUNT = "/checkpoints"  # where the checkpoint volume appears in every pod
# Retries of one pod index before the job fails (see objects.py for why they differ).
RETRIES = {"multi_worker": 2, "parameter_server": 5, "horovod": 0}
# Kubernetes' resource quantity: 1, 0.5, 500m, 2Gi, 512Mi, 1e3 ...
_QUANTITY_RE = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?")
# A StorageClass name: a DNS subdomain (RFC 1123), at most 253 characters
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_RE = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
# A label's key: an optional DNS-subdomain prefix and '/', then a name of up to 63 characters;
# its value: up to 63 characters, alphanumeric at both ends (or empty).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE_RE = re.compile(rf"({_LABEL_NAME})?")
NAME_MOST = 50  # the Job name; its pods are <name>-<index> (host names of at most 63)


@dataclass(frozen=True)
class JobPlan:
    """One training job for Kubernetes: who runs what, with which resources."""

    strategy: str
    workers: int
    ps: int
    image: str
    script: str
    args: tuple[str, ...]
    name: str
    cpu: str
    memory: str
    gpus: int
    storage: str
    retries: int
    storage_class: str | None = None  # a class that offers ReadWriteMany (None: the default)
    port: int = TF_PORT
    collector: str | None = None  # host:port of a metrics collector the pods reach
    token_secret: str | None = None  # the Secret whose key "token" is the collector's token
    peer_wait: float = DEFAULT_PEER_WAIT  # s a pod waits for Pending peers (0: not at all)
    pull_secret: str | None = None  # a Secret of type dockerconfigjson for a private registry
    node_selector: tuple[tuple[str, str], ...] = ()  # node labels a pod must land on
    shm: str | None = None  # a memory-backed /dev/shm of this size (the runtime's is 64 MiB)

    @property
    def pods(self) -> int:
        """Every process is a pod: MWMS its workers; PS one chief, the ps tasks, the workers;
        Horovod its workers (one rank each) and a launcher."""
        s = strategies.get(self.strategy)
        if s.chief:  # a PS coordinator of its own
            return 1 + self.ps + self.workers
        return self.workers + (1 if s.needs_horovodrun else 0)

    @property
    def service(self) -> str:
        return self.name  # the headless Service is named as the job (Kubeflow does the same)

    @property
    def claim(self) -> str:
        return f"{self.name}-checkpoints"

    @property
    def run_dir(self) -> str:
        return f"{MOUNT}/{self.name}"


def _count(label: str, value: object, least: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{label}={value!r}: must be an integer >= {least}. Fix: {fix}.")
    return value


def _quantity(label: str, value: object, example: str) -> str:
    text = str(value)
    if not _QUANTITY_RE.fullmatch(text) or float(re.sub(r"[^0-9.]", "", text) or 0) <= 0:
        raise ConfigError(
            f"{label}={value!r} is not a Kubernetes resource quantity. "
            f"Fix: e.g. {label}={example!r}."
        )
    return text


def check_kind(strategy: str, kind: str) -> None:
    """ConfigError when ``kind`` cannot run ``strategy`` (Horovod needs an MPI launcher)."""
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r} is unknown. Fix: use one of {', '.join(KINDS)}.")
    if strategy not in STRATEGIES:
        return  # make_plan names the strategies
    mpi = strategies.get(strategy).needs_horovodrun
    if mpi and kind not in MPI_KINDS:
        raise ConfigError(
            f"strategy {strategy!r} runs under an MPI launcher, which kind={kind!r} has not. "
            f"Fix: use kind='mpijob' (--kind mpijob: the MPI operator's MPIJob)."
        )
    if not mpi and kind in MPI_KINDS:
        raise ConfigError(
            f"kind={kind!r} runs Horovod only; strategy {strategy!r} is TensorFlow's own. "
            f"Fix: use kind='job' (the core Indexed Job) or 'tfjob'."
        )


def make_plan(
    script: str,
    *,
    strategy: str,
    workers: int,
    image: str,
    ps: int = 0,
    args: tuple[str, ...] | list[str] = (),
    name: str = "ddlkit",
    cpu: str | int = "1",
    memory: str = "2Gi",
    gpus: int = 0,
    storage: str = "1Gi",
    storage_class: str | None = None,
    retries: int | None = None,
    port: int = TF_PORT,
    collector: str | None = None,
    token_secret: str | None = None,
    peer_wait: float = DEFAULT_PEER_WAIT,
    pull_secret: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    shm: str | None = None,
) -> JobPlan:
    """The checked plan (ConfigError for the first bad value, naming the fix)."""
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise ConfigError(
            f"image={image!r} is not an image name. Fix: leave --image (image=) out for the "
            f"kit's own, {KIT_IMAGE} (`make image` builds it), or pass an image that holds the "
            f"kit and your script, e.g. REGISTRY/ddlkit:0.1.0."
        )
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"strategy {strategy!r} has no Kubernetes form. Fix: use one of "
            f"{', '.join(STRATEGIES)}."
        )
    _count("workers", workers, 1, "pass -n N with N >= 1 (N: training workers)")
    if strategies.get(strategy).chief:  # parameter_server: a coordinator and ps tasks
        _count("ps", ps, 1, "pass --ps K with K >= 1 for parameter_server")
    elif ps:
        raise ConfigError(
            f"ps={ps!r} with strategy {strategy!r}. Fix: leave --ps out, or use --strategy "
            f"parameter_server."
        )
    if not isinstance(script, str) or not script:
        raise ConfigError(
            "no script given. Fix: name the training script, e.g. launch/train_multi_worker.py."
        )
    check_label("Job", name, NAME_MOST)
    _count("gpus", gpus, 0, "pass --gpus 0 or more (nvidia.com/gpu per pod)")
    _count("port", port, 1, "use a TCP port 1..65535, e.g. 2222")
    if port > 65535:
        raise ConfigError(f"port={port} is not a TCP port. Fix: use 1..65535, e.g. 2222.")
    if retries is None:
        retries = RETRIES[strategy]
    _count("retries", retries, 0, "pass --retries 0 or more (restarts of one pod)")
    if (collector is None) != (token_secret is None):
        raise ConfigError(
            "collector and token_secret go together: the pods need the collector's address and "
            "its token (from a Secret, never inline). Fix: pass both --collector HOST:PORT and "
            "--token-secret NAME, or neither."
        )
    if collector is not None and not re.fullmatch(r"[A-Za-z0-9._-]+:[0-9]{1,5}", collector):
        raise ConfigError(f"collector {collector!r} is not HOST:PORT. Fix: e.g. 10.0.0.5:7000.")
    if token_secret is not None:
        check_label("Secret", token_secret)
    if isinstance(peer_wait, bool) or not isinstance(peer_wait, int | float) or not peer_wait >= 0:
        raise ConfigError(
            f"peer_wait={peer_wait!r} is not a number of seconds >= 0. Fix: pass --peer-wait S "
            f"(how long a pod waits for Pending peers; 0: not at all), e.g. 600."
        )
    if pull_secret is not None:
        check_label("Secret", pull_secret)
    selector = tuple(sorted((node_selector or {}).items()))
    for key, value in selector:
        if not _LABEL_KEY_RE.fullmatch(str(key)) or not _LABEL_VALUE_RE.fullmatch(str(value)):
            raise ConfigError(
                f"node selector {key}={value} is not a Kubernetes label. Fix: name a label "
                f"your GPU nodes carry (kubectl get nodes --show-labels), e.g. "
                f"nvidia.com/gpu.present=true."
            )
    if storage_class is not None and not _SUBDOMAIN_RE.fullmatch(str(storage_class)):
        raise ConfigError(
            f"storage_class={storage_class!r} is not a StorageClass name (lowercase letters, "
            f"digits, '-' and '.'). Fix: name a class of your cluster that offers ReadWriteMany "
            f"(kubectl get storageclass), e.g. storage_class='nfs-client'."
        )
    return JobPlan(
        strategy=strategy,
        workers=workers,
        ps=ps,
        image=image,
        script=script,
        args=tuple(str(a) for a in args),
        name=name,
        cpu=_quantity("cpu", cpu, "2"),
        memory=_quantity("memory", memory, "4Gi"),
        gpus=gpus,
        storage=_quantity("storage", storage, "10Gi"),
        storage_class=storage_class,
        retries=retries,
        port=port,
        collector=collector,
        token_secret=token_secret,
        peer_wait=float(peer_wait),
        pull_secret=pull_secret,
        node_selector=selector,
        shm=None if shm is None else _quantity("shm", shm, "1Gi"),
    )
