"""Several hosts: reaching them over SSH, checking them, and making namespaced ones locally.

- `ssh`: the OpenSSH client argv (BatchMode, bounded connect time, argv-only remote command).
- `preflight`: per-host reachability, Python/TensorFlow/Horovod versions and free ports.
- `netns`: hosts on one machine as Linux network namespaces (root, iproute2).
- `sshd`: an sshd in each namespaced host with keys made for the occasion.
"""

from __future__ import annotations

from ddlkit.hosts.netns import NetnsHost, cut_link, namespaced_hosts, restore_link
from ddlkit.hosts.preflight import HostCheck, HostError, Preflight, check_hosts
from ddlkit.hosts.ssh import SshOptions, ssh_argv
from ddlkit.hosts.sshd import SshdCluster, running_sshd

__all__ = [
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
    "running_sshd",
    "ssh_argv",
]
