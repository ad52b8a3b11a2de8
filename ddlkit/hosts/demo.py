"""A demo cluster on one machine: hosts each running sshd, ready for dk.launch.

As root: namespaced hosts (`netns`: each its own network stack). For anyone else: user-mode
hosts (`userhosts`: an sshd of yours per loopback address, reached as host1, host2, ...
through an ssh config). ``kind="netns"|"user"`` chooses explicitly.

::

    with dk.hosts.demo_cluster(2) as demo:
        run = dk.launch.start("launch/train_multi_worker.py", workers=2,
                              where=dk.where.Hosts.demo(demo))
        run.wait()

In a notebook, where a ``with`` block cannot span cells: ``demo = dk.hosts.start_demo_cluster(2)``
... ``demo.close()`` (also done when the interpreter exits).

Namespaced hosts need root and iproute2, both kinds openssh-server/-client
(`unavailable(kind)` says what is missing). Everything (hosts, sshd, keys, whatever still
runs on them) is gone on close.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlkit._tables import html_table, text_table
from ddlkit.cluster.ports import BASE_PORT
from ddlkit.errors import ConfigError, MissingSystemPackageError
from ddlkit.hosts import netns, sshd, userhosts
from ddlkit.hosts.netns import INNER, NetnsHost
from ddlkit.hosts.ssh import SshOptions
from ddlkit.hosts.userhosts import UserHost, UserHosts

__all__ = ["DemoCluster", "demo_cluster", "start_demo_cluster", "unavailable"]

KINDS = ("netns", "user")
# What each kind shares with this machine, for the cluster's table
DIFFERS = {
    "netns": "own network stack per host (interface eth0, own ports); same user and files",
    "user": "one network stack (a port taken is taken on every host; all on lo); "
    "one user (yours); same files",
}


@dataclass(frozen=True, repr=False)
class DemoCluster:
    """Hosts with sshd (namespaced or user-mode): what `ddlkit.launch.start` needs."""

    hosts: tuple[NetnsHost, ...] | tuple[UserHost, ...]
    ssh: SshOptions
    collector_host: str  # this machine's address on the hosts' network
    network_interface: str  # every host's interface (horovodrun --network-interface)
    sshd_pids: tuple[int, ...]
    _stack: ExitStack = field(default_factory=ExitStack, compare=False)
    kind: str = "netns"
    _user: UserHosts | None = field(default=None, compare=False)
    _port_blocks: dict[int, int] = field(default_factory=dict, compare=False)  # slots -> base

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

    @property
    def ssh_config(self) -> str | None:
        """User mode: the ssh config naming every host (``ssh -F CONFIG host1``); else None."""
        return None if self._user is None else str(self._user.plan.ssh_config)

    @property
    def names(self) -> list[str]:
        """Each host's name: the namespace, or (user mode) host1, host2, ... of the ssh config."""
        return [h.name for h in self.hosts]

    def launch_kwargs(self, slots: int = 1) -> dict[str, Any]:
        """The settings of ``dk.where.Hosts`` that run a job on these hosts (`Hosts.demo`).

        ``base_port``: the first TF server port (each host's tasks use ``base_port``,
        ``base_port + 1``, ...). Namespaced hosts use the launcher's default. User-mode hosts
        share one network stack (with everyone on this machine), so their TF servers need
        ports distinct across hosts (``distinct_ports``) from a block found free when first
        asked for; every later call with the same ``slots`` returns the same block, so the
        ports a preflight checks are the ones the run uses.
        """
        kwargs = {
            "hosts": self.host_list(slots),
            "ssh": self.ssh,
            "collector_host": self.collector_host,
            "network_interface": self.network_interface,
        }
        if self.kind != "user":
            return kwargs | {"base_port": BASE_PORT}
        if slots not in self._port_blocks:
            block = slots * len(self.hosts) + 1  # + a parameter-server job's chief
            self._port_blocks[slots] = userhosts.free_port_block(block)
        return kwargs | {"distinct_ports": True, "base_port": self._port_blocks[slots]}

    def cut_link(self, index: int) -> None:
        """Make host ``index`` stop answering, as a pulled cable would.

        Namespaced: its link goes down (its processes keep running, unreachable). User
        mode (no link of its own): its sshd, sessions and workers are stopped (SIGSTOP).
        """
        if self._user is not None:
            self._user.stop_answering(index)
        else:
            netns.cut_link(self.hosts[index])

    def restore_link(self, index: int) -> None:
        """Undo `cut_link`: the link comes back up, or (user mode) SIGCONT what was stopped."""
        if self._user is not None:
            self._user.answer_again(index)
        else:
            netns.restore_link(self.hosts[index])

    def processes(self, index: int) -> list[int]:
        """Process ids running on host ``index`` other than its sshd."""
        if self._user is not None:
            return self._user.processes(index)
        return [p for p in netns.pids_in(self.hosts[index]) if p not in self.sshd_pids]

    def leftovers(self) -> list[str]:
        """What of the cluster still exists (after close: nothing)."""
        alive = [f"sshd pid {p}" for p in self.sshd_pids if _running(p)]
        if self._user is not None:
            files = [str(self._user.plan.directory)] if self._user.plan.directory.exists() else []
            return alive + files
        made = set(netns.existing())
        return alive + [f"namespace {h.name}" for h in self.hosts if h.name in made]

    def _cells(self) -> list[list[object]]:
        return [[h.name, h.address, self.network_interface, self._port(h)] for h in self.hosts]

    def _port(self, host: NetnsHost | UserHost) -> int:
        return host.port if isinstance(host, UserHost) else self.ssh.port or 22

    def _caption(self) -> str:
        kind = "namespaced hosts" if self.kind == "netns" else "user-mode hosts (no root)"
        return (
            f"demo cluster: {len(self.hosts)} hosts, {kind}, launcher at {self.collector_host}; "
            f"{DIFFERS[self.kind]}"
        )

    _HEADERS = ("host", "address", "interface", "sshd port")

    def __str__(self) -> str:
        return text_table(self._HEADERS, self._cells(), self._caption(), rule=True)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_table(self._HEADERS, self._cells(), self._caption())


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def default_kind() -> str:
    """``"netns"`` for root, ``"user"`` for anyone else."""
    return "netns" if os.geteuid() == 0 else "user"


def unavailable(kind: str | None = None) -> str:
    """Why a demo cluster of ``kind`` (default: `default_kind`) cannot be made ('' if it can)."""
    if (kind or default_kind()) == "user":
        try:
            userhosts.find_sshd()
        except MissingSystemPackageError as exc:
            return str(exc)
        return ""
    return netns.unavailable(try_it=True) or sshd.unavailable()


def start_demo_cluster(
    n: int = 2,
    *,
    kind: str | None = None,
    sshd_path: str | None = None,
    ports: Sequence[int] | None = None,
) -> DemoCluster:
    """``n`` hosts on this machine, each running sshd with keys made for them.

    ``kind``: ``"netns"`` (namespaced hosts, root), ``"user"`` (user-mode hosts) or None
    (netns for root, user for anyone else). User mode only: ``sshd_path`` (default: found
    on PATH or in /usr/sbin), ``ports`` (default: free ones). Call ``close()`` when done (it
    also runs when the interpreter exits).
    """
    kind = kind or default_kind()
    if kind not in KINDS:
        raise ConfigError(f"demo cluster: kind={kind!r}; use 'netns' (root) or 'user'")
    if kind == "user":
        return _start_user(n, sshd_path, ports)
    if sshd_path is not None or ports is not None:
        raise ConfigError("demo cluster: sshd_path and ports are for kind='user' only")
    why = unavailable("netns")
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


def _start_user(n: int, sshd_path: str | None, ports: Sequence[int] | None) -> DemoCluster:
    """Plan (checked before anything starts), then run: user-mode hosts."""
    found = userhosts.find_sshd(sshd_path)
    if type(n) is not int or not 1 <= n <= userhosts.MAX_HOSTS:
        raise ConfigError(f"demo cluster: n={n!r}; use 1 to {userhosts.MAX_HOSTS} hosts")
    addresses = userhosts.free_addresses(n)
    chosen = list(ports) if ports is not None else [userhosts.free_port(a) for a in addresses]
    directory = Path(tempfile.mkdtemp(prefix="ddlkit-userhosts-"))
    try:
        p = userhosts.plan(
            n, directory, addresses=addresses, ports=chosen, sshd=found,
            user=userhosts.current_user(),
        )  # fmt: skip
        running = userhosts.start(p)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    stack = ExitStack()
    stack.callback(running.close)
    atexit.register(stack.close)
    stack.callback(atexit.unregister, stack.close)
    return DemoCluster(
        hosts=p.hosts,
        ssh=p.options(),
        collector_host="127.0.0.1",
        network_interface=userhosts.INTERFACE,
        sshd_pids=running.pids,
        _stack=stack,
        kind="user",
        _user=running,
    )


@contextmanager
def demo_cluster(n: int = 2, **kwargs: Any) -> Iterator[DemoCluster]:
    """`start_demo_cluster` as a ``with`` block: everything is gone on exit."""
    demo = start_demo_cluster(n, **kwargs)
    try:
        yield demo
    finally:
        demo.close()
