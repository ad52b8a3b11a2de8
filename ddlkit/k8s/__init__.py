"""Kubernetes: the manifests of a training job, and what runs inside its pods.

- :func:`manifest` (``ddlkit k8s manifest``): an Indexed Job + headless Service + checkpoint
  volume claim (core API only, :mod:`ddlkit.k8s.objects`), or Kubeflow's TFJob
  (:mod:`ddlkit.k8s.tfjob`), as a :class:`Manifest` (pure data; ``to_yaml``, ``write``);
- ``python -m ddlkit.k8s exec -- SCRIPT ARGS`` in each pod (:mod:`ddlkit.k8s.pod`): TF_CONFIG
  from ``JOB_COMPLETION_INDEX`` and the pods' names ``<job>-<index>.<service>``
  (:class:`ddlkit.environments.kubernetes.Kubernetes`), then the script, without a shell;
- :mod:`ddlkit.k8s.local`: pods played by namespaced hosts on this machine (root), named as
  Kubernetes names them, to run the pod side for real without a cluster;
- :mod:`ddlkit.k8s.containers`: the same pods as podman containers of the kit's image (root),
  an Indexed Job's or an MPIJob's (:mod:`ddlkit.k8s.mpijob`: Horovod's launcher and workers).
"""

from __future__ import annotations

from ddlkit.k8s.manifest import Manifest, manifest
from ddlkit.k8s.pod import worker_env

__all__ = ["Manifest", "containers", "local", "manifest", "worker_env"]


def __getattr__(name: str):
    if name in ("local", "containers"):  # load ddlkit.hosts, podman's setup only when asked
        import importlib

        return importlib.import_module(f"ddlkit.k8s.{name}")
    raise AttributeError(f"module 'ddlkit.k8s' has no attribute {name!r}")
