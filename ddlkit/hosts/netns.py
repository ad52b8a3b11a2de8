"""Hosts on one machine: Linux network namespaces joined by a bridge (needs root and iproute2).

Each host is a namespace with its own address on ``10.213.<subnet>.0/24``; a bridge in the
launching namespace (address ``.254``) joins them, so the launching machine reaches every
host and the hosts reach each other. Processes inside a namespace share the filesystem, so
one venv serves all hosts. As on real machines, every host's interface is ``eth0`` and the
machine's hostname resolves to the host's own address (a per-host /etc/hosts through
/etc/netns/NAME); /32 routes reach the launching machine's own addresses, nothing beyond.
The commands are built first as plain argv lists (`create_commands`, `route_commands`,
`destroy_commands`, `cut_link_commands`) and run in one place (`_run`). On exit everything
still running inside the hosts is stopped (SIGTERM, then SIGKILL) before they are deleted.

    with namespaced_hosts(2) as hosts:
        hosts[0].address   # '10.213.7.1'
        hosts[0].exec_argv(["python3", "-c", "print(1)"])  # argv that runs inside the host
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError, MissingSystemPackageError
from ddlkit.locks import file_lock

PREFIX = "10.213"
MAX_HOSTS = 200
# Every host's interface has this name, as on real machines: Horovod's launcher needs a
# routable interface of the same name on all hosts.
INNER = "eth0"


@dataclass(frozen=True)
class NetnsHost:
    """One namespaced host: its namespace, its address and the two ends of its veth pair."""

    name: str  # the namespace name (``ip netns``)
    address: str
    inner: str  # veth end inside the namespace
    outer: str  # veth end on the bridge, in the launching namespace
    gateway: str  # the launching namespace's address on the hosts' subnet

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass(frozen=True)
class NetnsPlan:
    """N hosts on one subnet, joined by one bridge whose address is the launcher's."""

    tag: str
    subnet: int
    bridge: str
    hosts: tuple[NetnsHost, ...]

    @property
    def gateway(self) -> str:
        """The launching namespace's address on the hosts' subnet."""
        return f"{PREFIX}.{self.subnet}.254"


def plan(n: int, *, subnet: int, tag: str) -> NetnsPlan:
    """Names and addresses for ``n`` hosts; ``tag`` (<= 6 letters/digits) keeps runs apart."""
    if not 1 <= n <= MAX_HOSTS:
        raise ConfigError(f"namespaced hosts: n={n}; use 1 to {MAX_HOSTS} hosts")
    if not 0 <= subnet <= 255:
        raise ConfigError(f"namespaced hosts: subnet={subnet}; use 0 to 255 (10.213.<subnet>.x)")
    if not (tag.isascii() and tag.isalnum() and 1 <= len(tag) <= 6):
        raise ConfigError(f"namespaced hosts: tag={tag!r}; use 1-6 ASCII letters or digits")
    hosts = tuple(
        NetnsHost(
            name=f"ddlk{tag}h{i}",
            address=f"{PREFIX}.{subnet}.{i + 1}",
            inner=INNER,
            outer=f"dk{tag}o{i}",
            gateway=f"{PREFIX}.{subnet}.254",
        )
        for i in range(n)
    )
    return NetnsPlan(tag=tag, subnet=subnet, bridge=f"dk{tag}br", hosts=hosts)


def create_commands(p: NetnsPlan) -> list[list[str]]:
    """The ``ip`` commands that make the bridge and every host, in order."""
    cmds = [
        ["ip", "link", "add", p.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{p.gateway}/24", "dev", p.bridge],
        ["ip", "link", "set", p.bridge, "up"],
    ]
    for h in p.hosts:
        cmds += [
            ["ip", "netns", "add", h.name],
            # the inner end is made inside the namespace, so every host can call it eth0
            ["ip", "link", "add", h.outer, "type", "veth"]
            + ["peer", "name", h.inner, "netns", h.name],
            ["ip", "link", "set", h.outer, "master", p.bridge],
            ["ip", "link", "set", h.outer, "up"],
            ["ip", "-n", h.name, "link", "set", "lo", "up"],
            ["ip", "-n", h.name, "addr", "add", f"{h.address}/24", "dev", h.inner],
            ["ip", "-n", h.name, "link", "set", h.inner, "up"],
        ]
    return cmds


NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` bind-mounts NETNS_ETC/NAME/* over /etc


def hosts_file_text(host: NetnsHost, hostname: str) -> str:
    """The host's own /etc/hosts: the machine's hostname names this host's address.

    All hosts share the machine's hostname; Horovod's Gloo resolves it to find its own
    address, which must be the host's, not 127.0.0.1.
    """
    return f"127.0.0.1 localhost\n{host.address} {hostname}\n"


def route_commands(p: NetnsPlan, launcher_addresses: Sequence[str]) -> list[list[str]]:
    """Routes from every host to the launching machine's own addresses, through the bridge.

    Launchers that pick their own address by interface (horovodrun's rendezvous server) may
    give the hosts an address off their subnet; a /32 route to each such address (no default
    route) lets the hosts reach the launching machine and nothing beyond it.
    """
    return [
        ["ip", "-n", h.name, "route", "add", f"{a}/32", "via", h.gateway]
        for h in p.hosts
        for a in launcher_addresses
    ]


def launcher_addresses() -> list[str]:
    """The launching namespace's IPv4 addresses other than loopback and hosts' subnets."""
    out = _run(["ip", "-o", "-4", "addr"]).stdout
    found = [line.split()[3].split("/")[0] for line in out.splitlines() if " inet " in line]
    return [a for a in found if not a.startswith(("127.", f"{PREFIX}."))]


def destroy_commands(p: NetnsPlan) -> list[list[str]]:
    """Delete each veth pair, each namespace, then the bridge.

    The veth pair is deleted explicitly: a namespace outlives ``ip netns del`` while the kernel
    still holds a socket of it (a TCP connection whose link was cut), and its veth with it.
    """
    cmds = [["ip", "link", "del", h.outer] for h in p.hosts]
    cmds += [["ip", "netns", "del", h.name] for h in p.hosts]
    return cmds + [["ip", "link", "del", p.bridge]]


def cut_link_commands(host: NetnsHost) -> list[list[str]]:
    """Take the host's link down, as a pulled cable would."""
    return [["ip", "-n", host.name, "link", "set", host.inner, "down"]]


def restore_link_commands(host: NetnsHost, launcher: Sequence[str]) -> list[list[str]]:
    """Bring the link back up, and the routes to the launcher that went down with it."""
    up = [["ip", "-n", host.name, "link", "set", host.inner, "up"]]
    return up + [
        ["ip", "-n", host.name, "route", "replace", f"{a}/32", "via", host.gateway]
        for a in launcher
    ]


def _run(cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """The one place the ``ip`` commands run."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise ConfigError(
            f"namespaced hosts: {' '.join(cmd)} failed ({done.returncode}): "
            f"{done.stderr.strip()}; fix: run as root on Linux with iproute2 installed"
        )
    return done


def unavailable(*, try_it: bool = False) -> str:
    """Why namespaced hosts cannot be made here ('' when they can).

    ``try_it`` also makes and deletes one empty namespace: a container may give root
    without the right to make namespaces.
    """
    if sys.platform != "linux":
        return "namespaced hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "namespaced hosts need root (ip netns add)"
    if shutil.which("ip") is None:
        return "namespaced hosts need `ip`: apt-get install iproute2"
    if try_it:
        name = f"ddlkprobe{os.getpid()}"
        made = _run(["ip", "netns", "add", name], check=False)
        _run(["ip", "netns", "del", name], check=False)
        if made.returncode != 0:
            return f"this machine refuses `ip netns add`: {made.stderr.strip()}"
    return ""


def existing() -> list[str]:
    """Names of the namespaces that exist now."""
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(host: NetnsHost) -> list[int]:
    """Processes running inside the host's namespace."""
    done = _run(["ip", "netns", "pids", host.name], check=False)
    return [int(x) for x in done.stdout.split()] if done.returncode == 0 else []


def _free_subnet() -> int:
    used = _run(["ip", "-o", "-4", "addr"]).stdout
    for k in range(1, 256):
        if f" {PREFIX}.{k}." not in used:
            return k
    raise ConfigError("namespaced hosts: every 10.213.x.0/24 subnet is in use; delete old ones")


_calls = itertools.count()


def _fresh_tag() -> str:
    """A tag no namespace uses yet: this process's id and a per-call counter, in hex."""
    taken = "".join(existing())
    while True:
        tag = format((os.getpid() * 64 + next(_calls)) % 16**6, "x")
        if f"ddlk{tag}h" not in taken:
            return tag


def cut_link(host: NetnsHost) -> None:
    """Take ``host``'s network link down (its processes keep running, unreachable)."""
    for cmd in cut_link_commands(host):
        _run(cmd)


def restore_link(host: NetnsHost) -> None:
    """Undo `cut_link`: the link and the host's routes to the launching machine come back."""
    for cmd in restore_link_commands(host, launcher_addresses()):
        _run(cmd)


def _stop_processes(hosts: Sequence[NetnsHost], grace: float = 5.0) -> None:
    """SIGTERM whatever still runs inside the hosts, then SIGKILL what outlives ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for h in hosts for pid in pids_in(h)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [pid for h in hosts for pid in pids_in(h)]
            time.sleep(0.05)
        if not pids:
            return


def destroy(p: NetnsPlan) -> None:
    """Stop everything inside the hosts and delete them; a missing piece is not an error."""
    _stop_processes(p.hosts)
    for cmd in destroy_commands(p):
        _run(cmd, check=False)
    for h in p.hosts:
        shutil.rmtree(NETNS_ETC / h.name, ignore_errors=True)


LOCK = "/run/ddlkit-netns.lock"  # serialises choosing names/subnets between processes


def _creation_lock():
    return file_lock(LOCK)


def _check_unused(p: NetnsPlan) -> None:
    """Refuse a plan whose names or subnet exist already: never touch what is not ours."""
    clash = set(existing()) & {h.name for h in p.hosts}
    clash |= {h.name for h in p.hosts if (NETNS_ETC / h.name).exists()}
    lines = _run(["ip", "-o", "link"]).stdout.splitlines()
    links = {line.split(": ", 2)[1].split("@")[0] for line in lines if ": " in line}
    clash |= links & {p.bridge, *(h.outer for h in p.hosts)}
    if clash:
        raise ConfigError(
            f"namespaced hosts: {sorted(clash)} already exist; "
            f"fix: delete them (`ip netns del NAME`, `ip link del NAME`) or pass another tag"
        )
    if f" {PREFIX}.{p.subnet}." in _run(["ip", "-o", "-4", "addr"]).stdout:
        raise ConfigError(
            f"namespaced hosts: subnet {PREFIX}.{p.subnet}.0/24 is in use here; "
            f"fix: pass another subnet= or leave it out to pick a free one"
        )


@contextmanager
def namespaced_hosts(
    n: int, *, subnet: int | None = None, tag: str | None = None
) -> Iterator[tuple[NetnsHost, ...]]:
    """Make ``n`` namespaced hosts; on exit (also on error) stop their processes and delete them."""
    why = unavailable()
    if why:
        raise MissingSystemPackageError(why)
    with _creation_lock():
        p = plan(
            n,
            subnet=_free_subnet() if subnet is None else subnet,
            tag=tag or _fresh_tag(),
        )
        _check_unused(p)
        try:
            for cmd in create_commands(p):
                _run(cmd)
            for cmd in route_commands(p, launcher_addresses()):
                _run(cmd)
            for h in p.hosts:
                (NETNS_ETC / h.name).mkdir(parents=True)
                (NETNS_ETC / h.name / "hosts").write_text(hosts_file_text(h, socket.gethostname()))
        except BaseException:
            destroy(p)
            raise
    try:
        yield p.hosts
    finally:
        destroy(p)
