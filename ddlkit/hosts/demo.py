"""A demo cluster on one machine: namespaced hosts, each running sshd, ready for dk.launch.

::

    with dk.hosts.demo_cluster(2) as demo:
        run = dk.launch.start("launch/train_multi_worker.py", workers=2, **demo.launch_kwargs())
        run.wait()

In a notebook, where a ``with`` block cannot span cells: ``demo = dk.hosts.start_demo_cluster(2)``
... ``demo.close()`` (also done when the interpreter exits).

Needs root, iproute2 and openssh-server/-client (`unavailable()` says what is missing).
Everything (hosts, sshd, keys, whatever still runs inside) is gone on close.
"""

from __future__ import annotations

import atexit
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlkit._tables import html_table, text_table
from ddlkit.errors import MissingSystemPackageError
from ddlkit.hosts import netns, sshd
from ddlkit.hosts.netns import INNER, NetnsHost
from ddlkit.hosts.ssh import SshOptions

__all__ = ["DemoCluster", "demo_cluster", "start_demo_cluster", "unavailable"]


@dataclass(frozen=True, repr=False)
class DemoCluster:
    """Namespaced hosts with sshd: what `ddlkit.launch.start` needs to reach them."""

    hosts: tuple[NetnsHost, ...]
    ssh: SshOptions
    collector_host: str  # this machine's address on the hosts' network
    network_interface: str  # every host's interface (horovodrun --network-interface)
    sshd_pids: tuple[int, ...]
    _stack: ExitStack = field(default_factory=ExitStack, compare=False)

    def close(self) -> None:
        """Stop everything on the hosts, their sshd, and delete them (idempotent)."""
        self._stack.close()

    def __enter__(self) -> DemoCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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


def start_demo_cluster(n: int = 2) -> DemoCluster:
    """``n`` namespaced hosts on this machine, each running sshd with keys made for them.

    Call ``close()`` when done (it also runs when the interpreter exits).
    """
    why = unavailable()
    if why:
        raise MissingSystemPackageError(f"no demo cluster here: {why}")
    stack = ExitStack()
    try:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ddlkit-demo-"))
        hosts = stack.enter_context(netns.namespaced_hosts(n))
        cluster = stack.enter_context(sshd.running_sshd(hosts, Path(tmp) / "sshd"))
    except BaseException:
        stack.close()
        raise
    atexit.register(stack.close)
    stack.callback(atexit.unregister, stack.close)
    return DemoCluster(
        hosts=tuple(hosts),
        ssh=cluster.options,
        collector_host=hosts[0].gateway,
        network_interface=INNER,
        sshd_pids=cluster.pids,
        _stack=stack,
    )


@contextmanager
def demo_cluster(n: int = 2) -> Iterator[DemoCluster]:
    """`start_demo_cluster` as a ``with`` block: everything is gone on exit."""
    demo = start_demo_cluster(n)
    try:
        yield demo
    finally:
        demo.close()
