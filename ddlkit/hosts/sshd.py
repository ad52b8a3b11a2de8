"""An sshd per namespaced host, with keys made for the occasion (for tests and notebooks).

`SshdKeys.generate(dir)` makes a host key and a client key with ``ssh-keygen``;
`sshd_config` is the config text (key-only login, listening on the host's address only);
`running_sshd(hosts, dir)` starts one ``sshd -D`` inside each host's namespace, waits until
each accepts connections, and stops them on exit. ``SshdCluster.options`` is the
`SshOptions` that reaches them (strict host-key checking against a known-hosts file).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError, MissingSystemPackageError
from ddlkit.hosts.netns import NetnsHost
from ddlkit.hosts.ssh import SshOptions

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path
PRIVSEP_DIR = "/run/sshd"  # Debian's sshd refuses to start without it (systemd makes it)


def keygen_argv(path: str | Path, comment: str) -> list[str]:
    """``ssh-keygen`` making an ed25519 key pair without passphrase at ``path``(.pub)."""
    return ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]


@dataclass(frozen=True)
class SshdKeys:
    host_key: Path
    client_key: Path
    authorized_keys: Path

    @classmethod
    def generate(cls, directory: Path) -> SshdKeys:
        keys = cls(
            host_key=directory / "host_ed25519",
            client_key=directory / "client_ed25519",
            authorized_keys=directory / "authorized_keys",
        )
        pairs = ((keys.host_key, "ddlkit-host"), (keys.client_key, "ddlkit-client"))
        for path, _ in pairs:
            if path.exists():
                raise ConfigError(f"sshd keys: {path} exists; use an empty directory")
        for path, comment in pairs:
            subprocess.run(
                keygen_argv(path, comment),
                check=True,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=30,
            )
        shutil.copyfile(f"{keys.client_key}.pub", keys.authorized_keys)
        keys.authorized_keys.chmod(0o600)
        return keys


def sshd_config(address: str, port: int, keys: SshdKeys, pid_file: Path) -> str:
    """sshd_config text: listen on ``address`` only, public-key login with our key, no password."""
    return "\n".join(
        [
            f"ListenAddress {address}",
            f"Port {port}",
            f"HostKey {keys.host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {keys.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            # the key files live in a temp dir whose parents we do not control
            "StrictModes no",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            # drop a session whose client went silent (link cut): its stdin closes
            "ClientAliveInterval 2",
            "ClientAliveCountMax 3",
            "LogLevel INFO",
            "",
        ]
    )


def sshd_argv(host: NetnsHost, config: Path, log: Path) -> list[str]:
    """sshd in the foreground (-D) inside the host's namespace, logging to ``log``."""
    return host.exec_argv([SSHD, "-D", "-f", str(config), "-E", str(log)])


def known_hosts_line(address: str, port: int, keys: SshdKeys) -> str:
    key = Path(f"{keys.host_key}.pub").read_text().split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    return f"{name} {' '.join(key)}\n"


@dataclass(frozen=True)
class SshdCluster:
    """Namespaced hosts each running sshd, and the `SshOptions` that reach them."""

    hosts: tuple[NetnsHost, ...]
    options: SshOptions
    pids: tuple[int, ...]
    directory: Path

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]


def unavailable() -> str:
    """Why sshd cannot run here ('' when it can)."""
    if not os.access(SSHD, os.X_OK):
        return f"no {SSHD}: apt-get install openssh-server"
    for tool, pkg in (("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            return f"no `{tool}`: apt-get install {pkg}"
    return ""


def _wait_listening(address: str, port: int, proc: subprocess.Popen, log: Path, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(
                f"sshd on {address} exited ({proc.returncode}): "
                f"{log.read_text().strip() if log.exists() else ''}"
            )
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise ConfigError(f"sshd on {address}:{port} did not accept connections within {timeout:.0f} s")


@contextmanager
def running_sshd(
    hosts: Sequence[NetnsHost], directory: str | Path, *, port: int = 22, timeout: float = 30.0
) -> Iterator[SshdCluster]:
    """One sshd per host (keys and configs in ``directory``); all stopped on exit."""
    why = unavailable()
    if why:
        raise MissingSystemPackageError(why)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    keys = SshdKeys.generate(d)
    os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    known = d / "known_hosts"
    known.write_text("".join(known_hosts_line(h.address, port, keys) for h in hosts))
    with ExitStack() as stack:
        procs = []
        for h in hosts:
            config = d / f"sshd_config.{h.name}"
            config.write_text(sshd_config(h.address, port, keys, d / f"sshd.{h.name}.pid"))
            log = d / f"sshd.{h.name}.log"
            proc = subprocess.Popen(
                sshd_argv(h, config, log), stdin=subprocess.DEVNULL, start_new_session=True
            )
            stack.callback(_stop, proc)
            procs.append(proc)
            _wait_listening(h.address, port, proc, log, timeout)
        yield SshdCluster(
            hosts=tuple(hosts),
            options=SshOptions(
                identity=str(keys.client_key),
                known_hosts=str(known),
                port=port,
                config_file="/dev/null",
            ),
            pids=tuple(p.pid for p in procs),
            directory=d,
        )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
