"""Cluster configuration: host lists, free ports, TF_CONFIG per task, Horovod slots.

>>> spec = ClusterSpec.local(workers=2)
>>> spec.env("worker-0")  # {"TF_CONFIG": "...", "DDLKIT_WORKER": "worker-0"}
>>> plan = horovod_slots("h1:2,h2:2", np=4)

Modules: :mod:`.hosts` (``Host``, host lists and host files), :mod:`.ports` (free
TCP ports: the only module that opens sockets), :mod:`.spec` (``Task``,
``ClusterSpec`` and its TF_CONFIG rules), :mod:`.horovod` (ranks per host slot),
:mod:`._table` (the text/HTML table the spec and the plan show). Everything else
is plain data, and nothing here imports TensorFlow.
"""

from __future__ import annotations

from ddlkit.cluster.horovod import HorovodPlan, HorovodSlot, horovod_slots
from ddlkit.cluster.hosts import Host, format_hosts, parse_hostfile, parse_hosts
from ddlkit.cluster.ports import free_ports, port_is_free
from ddlkit.cluster.spec import ROLES, ClusterSpec, Task, task_name

__all__ = [
    "ROLES",
    "ClusterSpec",
    "HorovodPlan",
    "HorovodSlot",
    "Host",
    "Task",
    "format_hosts",
    "free_ports",
    "horovod_slots",
    "parse_hostfile",
    "parse_hosts",
    "port_is_free",
    "task_name",
]
