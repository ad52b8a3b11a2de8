"""Several hosts: reaching them over SSH, checking them, and making namespaced ones locally.

- `ssh`: the OpenSSH client argv (BatchMode, bounded connect time, argv-only remote command)
  and `run_on`, which runs it and turns ssh failures into a `HostError` naming host and fix.
- `preflight`: per-host reachability, Python/TensorFlow/Horovod versions and free ports.
- `netns`: hosts on one machine as Linux network namespaces (root, iproute2).
- `sshd`: an sshd in each namespaced host with keys made for the occasion.
- `userhosts`: hosts without root: an sshd of yours per loopback address, an ssh config.
- `demo`: `start_demo_cluster(n)` / `demo_cluster(n)`, hosts with sshd (namespaced as root,
  user-mode otherwise; ``kind=``), as `ddlkit.launch.start` needs them.
- `drills`: faults made on purpose on a demo cluster (a stranger's key, a held port).
"""

from __future__ import annotations

from ddlkit.hosts import drills, userhosts
from ddlkit.hosts.demo import DemoCluster, demo_cluster, start_demo_cluster
from ddlkit.hosts.netns import NetnsHost, cut_link, namespaced_hosts, restore_link
from ddlkit.hosts.preflight import HostCheck, Preflight, check_hosts
from ddlkit.hosts.ssh import HostError, SshOptions, run_on, ssh_argv
from ddlkit.hosts.sshd import SshdCluster, running_sshd

__all__ = [
    "DemoCluster",
    "demo_cluster",
    "drills",
    "userhosts",
    "HostCheck",
    "HostError",
    "Preflight",
    "check_hosts",
    "NetnsHost",
    "SshOptions",
    "SshdCluster",
    "cut_link",
    "namespaced_hosts",
    "restore_link",
    "run_on",
    "running_sshd",
    "ssh_argv",
    "start_demo_cluster",
]
