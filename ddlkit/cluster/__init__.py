"""Cluster configuration: host lists, free ports, TF_CONFIG per task, Horovod slots."""

from __future__ import annotations

from ddlkit.cluster.spec import (
    ROLES,
    ClusterSpec,
    HorovodPlan,
    HorovodSlot,
    Host,
    Task,
    format_hosts,
    free_ports,
    horovod_slots,
    parse_hostfile,
    parse_hosts,
    port_is_free,
    task_name,
)

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
