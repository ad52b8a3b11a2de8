"""``dk.k8s.manifest(...)``: a training job as Kubernetes objects, ready for ``kubectl apply``.

::

    m = dk.k8s.manifest("launch/train_multi_worker.py", strategy="multi_worker", workers=2,
                        image="registry.example/ddlkit:0.1", args=["--epochs", "3"])
    m                      # a table: each object and what it is for
    print(m.to_yaml())     # the YAML `kubectl apply -f -` reads
    m.write("job.yaml")    # written whole or not at all

``kind="job"``: a headless Service, a checkpoint volume claim and an Indexed Job (core API
only, :mod:`ddlkit.k8s.objects`); ``kind="tfjob"``: the legacy Kubeflow Training Operator's
TFJob (:mod:`ddlkit.k8s.tfjob`); ``kind="mpijob"`` (``strategy="horovod"``): the MPI
operator's MPIJob (:mod:`ddlkit.k8s.mpijob`).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.image import KIT_IMAGE
from ddlkit.k8s import mpijob, objects, tfjob
from ddlkit.k8s.peers import DEFAULT_PEER_WAIT
from ddlkit.k8s.plan import JobPlan, check_kind, make_plan

_ROLE = {
    "Service": "headless: each pod reachable as <job>-<index>.<service>",
    "PersistentVolumeClaim": "the checkpoint volume every pod mounts (run dir, backups)",
    "Job": "one pod per TensorFlow task, JOB_COMPLETION_INDEX = its task",
    "TFJob": "Kubeflow's operator makes the pods and writes their TF_CONFIG",
    "MPIJob": "the MPI operator: sshd workers, a launcher running horovodrun over its hostfile",
}
_BUILD = {"job": objects.objects, "tfjob": tfjob.objects_tfjob, "mpijob": mpijob.objects_mpijob}


@dataclass(frozen=True, repr=False)
class Manifest:
    """Kubernetes objects for one training job (plain dicts, in the order to apply them)."""

    plan: JobPlan
    kind: str
    objects: tuple[dict, ...]

    def to_dicts(self) -> list[dict]:
        """The objects as new dicts (change them freely)."""
        return copy.deepcopy(list(self.objects))

    def to_yaml(self) -> str:
        """One YAML document per object, separated by ``---`` (what ``kubectl apply`` reads)."""
        import yaml

        return yaml.safe_dump_all(self.to_dicts(), sort_keys=False, default_flow_style=False)

    def write(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_yaml` to ``path`` atomically (a temporary name, then a rename)."""
        target = Path(path)
        if not target.parent.is_dir():
            raise ConfigError(
                f"cannot write {target}: {target.parent} is not a directory. "
                f"Fix: create it first or pick another -o path."
            )
        text = self.to_yaml()
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def _rows(self) -> list[tuple[str, str, str]]:
        return [(o["kind"], o["metadata"]["name"], _ROLE[o["kind"]]) for o in self.objects]

    def _caption(self) -> str:
        p = self.plan
        return f"{p.strategy} on Kubernetes: {p.pods} pods of {p.image} ({self.kind})"

    def __repr__(self) -> str:
        return text_table(("kind", "name", "what it is for"), self._rows(), self._caption())

    def _repr_html_(self) -> str:
        return html_table(("kind", "name", "what it is for"), self._rows(), self._caption())


def manifest(
    script: str,
    *,
    strategy: str = "multi_worker",
    workers: int = 2,
    image: str = KIT_IMAGE,
    ps: int = 0,
    args: tuple[str, ...] | list[str] = (),
    kind: str = "job",
    name: str = "ddlkit",
    cpu: str | int = "1",
    memory: str = "2Gi",
    gpus: int = 0,
    storage: str = "1Gi",
    storage_class: str | None = None,
    retries: int | None = None,
    port: int = 2222,
    collector: str | None = None,
    token_secret: str | None = None,
    peer_wait: float = DEFAULT_PEER_WAIT,
    pull_secret: str | None = None,
    node_selector: dict[str, str] | None = None,
    shm: str | None = None,
) -> Manifest:
    """The manifest of ``script`` trained with ``strategy`` on ``workers`` pods (pure).

    ``parameter_server`` adds one chief (coordinator) and ``ps`` parameter servers.
    ``cpu``, ``memory``, ``gpus`` (``nvidia.com/gpu``) are per pod, requested and limited;
    ``storage`` sizes the checkpoint volume, ``storage_class`` names a class that offers
    ReadWriteMany volumes (default: the cluster's default class); ``retries`` is how often
    one pod may be replaced (default by strategy); ``collector`` + ``token_secret`` send
    live metrics to a collector the pods can reach; ``peer_wait`` is how long each pod waits
    for peers that are still Pending (:mod:`ddlkit.k8s.peers`). For a real cluster:
    ``pull_secret`` names the Secret for a private registry (``imagePullSecrets``),
    ``node_selector`` the node labels the pods need (GPU nodes), ``shm`` the size of a
    memory-backed ``/dev/shm``. ConfigError for a bad value, before
    anything is built.
    """
    check_kind(strategy, kind)
    plan = make_plan(
        script, strategy=strategy, workers=workers, image=image, ps=ps, args=args, name=name,
        cpu=cpu, memory=memory, gpus=gpus, storage=storage, storage_class=storage_class,
        retries=retries, port=port,
        collector=collector, token_secret=token_secret, peer_wait=peer_wait,
        pull_secret=pull_secret, node_selector=node_selector, shm=shm,
    )  # fmt: skip
    return Manifest(plan, kind, _BUILD[kind](plan))
