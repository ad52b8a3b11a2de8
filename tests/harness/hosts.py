"""Namespaced hosts for tests: network namespaces on this machine, each with its own
address and sshd, and the check that nothing of them is left afterwards.

    with sshd_hosts(2, tmp_dir) as cluster: ...   # ddlkit.hosts.netns + sshd
    with demo_hosts(2) as cluster: ...            # ddlkit.hosts.demo_cluster (+ launch kwargs)

Needs root, iproute2 and openssh-server (the tests skip with the reason otherwise).
Used by tests/hosts/ and tests/launch/test_remote_launch.py.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddlkit import hosts
from ddlkit.hosts import netns, sshd
from harness.procutil import alive


def links() -> str:
    """``ip -o link``: this machine's network links (a namespaced host's outer end is one)."""
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


@contextlib.contextmanager
def sshd_hosts(n: int, sshd_dir: Path) -> Iterator[Any]:
    """`n` namespaced hosts, each running sshd with test keys in `sshd_dir`. Afterwards
    (also after a cut link: an orphaned TCP socket keeps a namespace alive) no namespace,
    link, sshd or /etc/netns entry of them is left."""
    with netns.namespaced_hosts(n) as made, sshd.running_sshd(made, sshd_dir) as cluster:
        yield cluster
    assert not {h.name for h in made} & set(netns.existing())
    assert not any(h.outer in links() for h in made)
    assert not any(alive(p) for p in cluster.pids)
    assert not any((netns.NETNS_ETC / h.name).exists() for h in made)


@contextlib.contextmanager
def demo_hosts(n: int = 2, *, check_left: bool = True) -> Iterator[Any]:
    """:func:`ddlkit.hosts.demo_cluster` of `n` hosts; with `check_left`, afterwards no
    namespace or sshd of it is left."""
    with hosts.demo_cluster(n) as cluster:
        yield cluster
    if check_left:
        assert not {h.name for h in cluster.hosts} & set(netns.existing())
        assert not any(alive(p) for p in cluster.sshd_pids)
