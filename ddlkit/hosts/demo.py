"""A demo cluster on one machine: namespaced hosts, each running sshd, ready for dk.launch.

::

    with dk.hosts.demo_cluster(2) as demo:
        run = dk.launch.start("launch/train_multi_worker.py", workers=2, **demo.launch_kwargs())
        run.wait()

Needs root, iproute2 and openssh-server/-client (`unavailable()` says what is missing).
Everything (hosts, sshd, keys, whatever still runs inside) is gone on exit.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlkit._tables import html_table, text_table
from ddlkit.errors import MissingSystemPackageError
from ddlkit.hosts import netns, sshd
from ddlkit.hosts.netns import INNER, NetnsHost
from ddlkit.hosts.ssh import SshOptions

__all__ = ["DemoCluster", "demo_cluster", "unavailable"]


@dataclass(frozen=True, repr=False)
class DemoCluster:
    """Namespaced hosts with sshd: what `ddlkit.launch.start` needs to reach them."""

    hosts: tuple[NetnsHost, ...]
    ssh: SshOptions
    collector_host: str  # this machine's address on the hosts' network
    network_interface: str  # every host's interface (horovodrun --network-interface)
    sshd_pids: tuple[int, ...]

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    def host_list(self, slots: int = 1) -> str:
        """The ``-H`` host list, e.g. ``"10.213.7.1:1,10.213.7.2:1"``."""
        return ",".join(f"{a}:{slots}" for a in self.addresses)

    def launch_kwargs(self, slots: int = 1) -> dict[str, Any]:
        """Keyword arguments for ``dk.launch.start`` that run the job on these hosts."""
        return {
            "hosts": self.host_list(slots),
            "ssh": self.ssh,
            "collector_host": self.collector_host,
            "network_interface": self.network_interface,
        }

    def cut_link(self, index: int) -> None:
        """Take host ``index``'s network link down, as a pulled cable would."""
        netns.cut_link(self.hosts[index])

    def restore_link(self, index: int) -> None:
        netns.restore_link(self.hosts[index])

    def processes(self, index: int) -> list[int]:
        """Process ids running on host ``index`` other than its sshd."""
        return [p for p in netns.pids_in(self.hosts[index]) if p not in self.sshd_pids]

    def _cells(self) -> list[list[object]]:
        return [[h.address, h.name, self.network_interface, "yes"] for h in self.hosts]

    def __str__(self) -> str:
        headers = ("address", "namespace", "interface", "sshd")
        caption = f"demo cluster: {len(self.hosts)} hosts, launcher at {self.collector_host}"
        return text_table(headers, self._cells(), caption, rule=True)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        headers = ("address", "namespace", "interface", "sshd")
        caption = f"demo cluster: {len(self.hosts)} hosts, launcher at {self.collector_host}"
        return html_table(headers, self._cells(), caption)


def unavailable() -> str:
    """Why a demo cluster cannot be made here ('' when it can)."""
    return netns.unavailable(try_it=True) or sshd.unavailable()


@contextmanager
def demo_cluster(n: int = 2, *, directory: str | Path | None = None) -> Iterator[DemoCluster]:
    """``n`` namespaced hosts on this machine, each running sshd with keys made for them."""
    why = unavailable()
    if why:
        raise MissingSystemPackageError(f"no demo cluster here: {why}")
    with tempfile.TemporaryDirectory(prefix="ddlkit-demo-") as tmp:
        with (
            netns.namespaced_hosts(n) as hosts,
            sshd.running_sshd(hosts, Path(directory or tmp) / "sshd") as cluster,
        ):
            yield DemoCluster(
                hosts=tuple(hosts),
                ssh=cluster.options,
                collector_host=hosts[0].gateway,
                network_interface=INNER,
                sshd_pids=cluster.pids,
            )
