"""Hosts without root: one ``sshd`` per host, run by you, on its own loopback address.

Linux routes all of 127.0.0.0/8 to the loopback interface with no set-up, so host ``k``
can be ``127.0.0.k+1`` with its own sshd (its own host key, ``UsePAM no``, your own
``authorized_keys``) on a free port. An ssh config names them (``Host host1 127.0.0.2``
-> ``HostName``, ``Port``, ``IdentityFile``, ``UserKnownHostsFile``), so ``ssh -F CONFIG
host1``, ddlkit (``SshOptions(config_file=CONFIG, port=None)``) and horovodrun (through
ddlkit's ssh shim, which puts ``-F CONFIG`` first) reach them by name or address.

What differs from namespaced hosts: one network stack (a port taken on one host is taken
on all: TensorFlow servers bind every address) and one user (a host's processes are the
descendants of its sshd). A host that "stops answering" is its sshd and everything under
it stopped with SIGSTOP (`stop_answering`), the user-mode pulled cable.

`plan` is pure data (addresses, ports, file paths, the config texts); `start` runs a plan
in one place and returns a `UserHosts` whose ``close()`` stops every process and deletes
every file. `find_sshd`, `check_plan` raise one clear error before anything starts.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit import procs
from ddlkit.cluster import ports
from ddlkit.errors import ConfigError, MissingSystemPackageError
from ddlkit.hosts import sshd
from ddlkit.hosts.ssh import SshOptions

MAX_HOSTS = 200
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # not on an ordinary user's PATH
INTERFACE = "lo"  # every user-mode host's network interface (horovodrun --network-interface)


@dataclass(frozen=True)
class UserHost:
    """One user-mode host: its name in the ssh config, its loopback address and sshd port."""

    name: str  # host1, host2, ...
    address: str  # 127.0.0.2, ...
    port: int

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` "on" this host: the same machine, network and user."""
        return list(argv)


@dataclass(frozen=True)
class UserPlan:
    """Everything a user-mode cluster is, before anything runs: hosts, files, config texts."""

    hosts: tuple[UserHost, ...]
    directory: Path
    sshd: str  # absolute path (sshd re-executes itself)
    user: str

    @property
    def keys(self) -> sshd.SshdKeys:
        d = self.directory
        return sshd.SshdKeys(d / "host_ed25519", d / "client_ed25519", d / "authorized_keys")

    @property
    def ssh_config(self) -> Path:
        return self.directory / "ssh_config"

    @property
    def options_config(self) -> Path:
        """The config `options` name: without IdentityFile (SshOptions gives ``-i``, so a
        key put in its place is the only one tried)."""
        return self.directory / "ssh_config.options"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    def sshd_config(self, host: UserHost) -> Path:
        return self.directory / f"sshd_config.{host.name}"

    def log(self, host: UserHost) -> Path:
        return self.directory / f"sshd.{host.name}.log"

    def sshd_config_text(self, host: UserHost) -> str:
        pid_file = self.directory / f"sshd.{host.name}.pid"
        return sshd.sshd_config(host.address, host.port, self.keys, pid_file)

    def sshd_argv(self, host: UserHost) -> list[str]:
        return [self.sshd, "-D", "-f", str(self.sshd_config(host)), "-E", str(self.log(host))]

    def ssh_config_text(self, *, identity: bool = True) -> str:
        """``Host host1 127.0.0.2`` blocks: reach each host by name or by address.

        ``identity`` False leaves IdentityFile out (ssh would try it besides any ``-i``)."""
        blocks = []
        for h in self.hosts:
            blocks += [
                f"Host {h.name} {h.address}",
                f"  HostName {h.address}",
                f"  Port {h.port}",
                f"  User {self.user}",
                *([f"  IdentityFile {self.keys.client_key}"] if identity else []),
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.known_hosts}",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
                "",
            ]
        return "\n".join(blocks)

    def known_hosts_text(self, host_key_line: str) -> str:
        """``[127.0.0.2]:PORT,[host1]:PORT KEY`` per host (``host_key_line``: the .pub text)."""
        key = " ".join(host_key_line.split()[:2])
        return "".join(f"[{h.address}]:{h.port},[{h.name}]:{h.port} {key}\n" for h in self.hosts)

    def options(self) -> SshOptions:
        """How ddlkit reaches these hosts: the config gives each host's port."""
        return SshOptions(
            identity=str(self.keys.client_key),
            known_hosts=str(self.known_hosts),
            port=None,
            config_file=str(self.options_config),
        )


def plan(
    n: int,
    directory: str | Path,
    *,
    addresses: Sequence[str],
    ports: Sequence[int],
    sshd: str,
    user: str,
) -> UserPlan:
    """``n`` hosts ``host1..hostn`` at ``addresses`` (127.x.y.z) on ``ports`` (pure)."""
    if type(n) is not int or not 1 <= n <= MAX_HOSTS:
        raise ConfigError(f"user-mode hosts: n={n!r}; use 1 to {MAX_HOSTS} hosts")
    if len(addresses) != n or len(ports) != n:
        raise ConfigError(
            f"user-mode hosts: {n} hosts need {n} addresses and {n} ports, "
            f"got {len(addresses)} and {len(ports)}"
        )
    for a in addresses:
        if not a.startswith("127.") or a == "127.0.0.1" or len(a.split(".")) != 4:
            raise ConfigError(
                f"user-mode hosts: address {a!r}; use loopback addresses 127.0.0.2 and up "
                f"(127.0.0.1 is this machine's own)"
            )
    if len(set(addresses)) != n:
        raise ConfigError(f"user-mode hosts: addresses {list(addresses)} repeat; one per host")
    for p in ports:
        if type(p) is not int or not 1024 <= p <= 65535:
            raise ConfigError(
                f"user-mode hosts: port {p!r}; an ordinary user's sshd needs 1024 to 65535"
            )
    if not os.path.isabs(sshd):
        raise ConfigError(f"user-mode hosts: sshd={sshd!r}; give its absolute path")
    hosts = tuple(
        UserHost(f"host{i + 1}", a, p)
        for i, (a, p) in enumerate(zip(addresses, ports, strict=True))
    )
    return UserPlan(hosts=hosts, directory=Path(directory), sshd=sshd, user=user)


def find_sshd(
    sshd_path: str | None = None, *, path: str | None = None, dirs: Sequence[str] = SBIN_DIRS
) -> str:
    """The sshd to run: ``sshd_path`` if given, else ``sshd`` on ``path`` (default PATH) or in
    the sbin directories (not on an ordinary user's PATH). MissingSystemPackageError if none."""
    if sshd_path is not None:
        if not (os.path.isfile(sshd_path) and os.access(sshd_path, os.X_OK)):
            raise MissingSystemPackageError(
                f"user-mode hosts: sshd={sshd_path!r} is not an executable file; fix: give "
                f"the path of OpenSSH's sshd (apt-get install openssh-server: /usr/sbin/sshd)"
            )
        return os.path.abspath(sshd_path)
    search = path if path is not None else os.environ.get("PATH", "")
    found = shutil.which("sshd", path=search) or shutil.which("sshd", path=os.pathsep.join(dirs))
    if found is None:
        raise MissingSystemPackageError(
            f"user-mode hosts: no sshd on PATH or in {', '.join(dirs) or '(no other place)'}; fix: "
            f"apt-get install openssh-server (as root, once), or pass sshd='/path/to/sshd'"
        )
    return os.path.abspath(found)


def _listening_addresses() -> set[str]:
    """IPv4 addresses with a TCP listener bound to them (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":  # LISTEN
            raw = bytes.fromhex(local.split(":")[0])
            found.add(socket.inet_ntoa(raw[::-1]))
    return found


def free_addresses(n: int) -> list[str]:
    """``n`` addresses 127.0.0.2 and up that nothing listens on yet."""
    taken = _listening_addresses()
    free = [f"127.0.0.{k}" for k in range(2, 255) if f"127.0.0.{k}" not in taken]
    if len(free) < n:
        raise ConfigError(f"user-mode hosts: only {len(free)} free addresses in 127.0.0.2-254")
    return free[:n]


def free_port(address: str) -> int:
    """A TCP port free on ``address`` (the OS's choice)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def free_port_block(count: int, *, tries: int = 200) -> int:
    """A port ``p`` with ``p .. p + count - 1`` free on every address (one network stack:
    TF servers bind them all), for ``base_port``: below the ephemeral range, where no
    outgoing connection takes one before the servers start (`ddlkit.cluster.ports`)."""
    return ports.free_port_block(count, "", tries)


def check_plan(p: UserPlan) -> None:
    """Refuse a plan whose port is taken or whose files exist; nothing started."""
    for h in p.hosts:
        with socket.socket() as s:
            try:
                s.bind((h.address, h.port))
            except OSError as exc:
                raise ConfigError(
                    f"user-mode hosts: port {h.port} on {h.address} ({h.name}) is in use "
                    f"({exc.strerror}); fix: end the program holding it, or leave ports "
                    f"out to get free ones"
                ) from None
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise MissingSystemPackageError(f"no `{tool}`: apt-get install openssh-client")
    if p.directory.exists() and any(p.directory.iterdir()):
        raise ConfigError(f"user-mode hosts: {p.directory} is not empty; use an empty directory")


@dataclass(frozen=True)
class UserHosts:
    """A running user-mode cluster: the plan, each host's sshd, and what is stopped now."""

    plan: UserPlan
    procs: tuple[subprocess.Popen, ...]
    stopped: dict[int, list[int]] = field(default_factory=dict, compare=False)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.procs)

    def processes(self, index: int) -> list[int]:
        """Processes running on host ``index``: its sshd's descendants (sessions, workers),
        and any that outlived their session (``SSH_CONNECTION`` names this host)."""
        h = self.plan.hosts[index]
        found = set(descendants(self.procs[index].pid)) | set(came_through(h.address, h.port))
        return sorted(p for p in found if _alive(p))

    def stop_answering(self, index: int) -> list[int]:
        """SIGSTOP host ``index``'s sshd and everything under it; the pids stopped."""
        pids = [self.procs[index].pid, *self.processes(index)]
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        self.stopped.setdefault(index, []).extend(pids)
        return pids

    def answer_again(self, index: int) -> None:
        """SIGCONT what `stop_answering` stopped on host ``index``."""
        for pid in self.stopped.pop(index, []):
            _signal(pid, signal.SIGCONT)

    def close(self) -> None:
        """Continue what is stopped, end every host's processes and sshd, delete the files."""
        for index in list(self.stopped):
            self.answer_again(index)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = [pid for i in range(len(self.procs)) for pid in self.processes(i)]
            for pid in left:
                _signal(pid, sig)
            deadline = time.monotonic() + 5
            while left and time.monotonic() < deadline:
                left = [pid for pid in left if _alive(pid)]
                time.sleep(0.05)
        for proc in self.procs:
            sshd._stop(proc)
        shutil.rmtree(self.plan.directory, ignore_errors=True)


def start(p: UserPlan, *, timeout: float = 30.0) -> UserHosts:
    """Make the keys and config files, start one sshd per host, wait until each answers."""
    check_plan(p)
    p.directory.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        sshd.SshdKeys.generate(p.directory)
        if os.geteuid() == 0:
            os.makedirs(sshd.PRIVSEP_DIR, mode=0o755, exist_ok=True)
        host_pub = Path(f"{p.keys.host_key}.pub").read_text()
        p.known_hosts.write_text(p.known_hosts_text(host_pub))
        p.ssh_config.write_text(p.ssh_config_text())
        p.options_config.write_text(p.ssh_config_text(identity=False))
        for h in p.hosts:
            p.sshd_config(h).write_text(p.sshd_config_text(h))
            proc = subprocess.Popen(
                p.sshd_argv(h), stdin=subprocess.DEVNULL, start_new_session=True
            )
            procs.append(proc)
            sshd._wait_listening(h.address, h.port, proc, p.log(h), timeout)
    except BaseException:
        UserHosts(p, tuple(procs)).close()
        raise
    return UserHosts(p, tuple(procs))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc."""
    return [child for child, _ in procs.descendants(pid)]


def came_through(address: str, port: int) -> list[int]:
    """Processes whose ``SSH_CONNECTION`` (inherited from their sshd session) ends with
    ``address port``: started on that host, even if their session is gone."""
    tail = f" {address} {port}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        for var in environ.split(b"\0"):
            if var.startswith(b"SSH_CONNECTION=") and var.endswith(tail):
                found.append(int(entry))
                break
    return found


_alive = procs.alive  # one /proc check (ddlkit.procs)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def current_user() -> str:
    return getpass.getuser()
