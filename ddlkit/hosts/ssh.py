"""The SSH client side: how ddlkit runs a command on a host (OpenSSH in BatchMode).

`ssh_argv` builds the argv; nothing here runs it. BatchMode means no prompt (password,
passphrase, unknown host key) can hang a notebook cell: ssh fails at once instead. The
remote command is built with ``shlex.join`` from an argv list, so no user string is ever
parsed by a shell as anything but one word.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ddlkit.errors import ConfigError


@dataclass(frozen=True)
class SshOptions:
    """How to reach the hosts: key, known-hosts file, user, port and time limits.

    ``identity``/``known_hosts`` of None leave OpenSSH's own defaults (``~/.ssh``);
    ``strict`` False accepts a host's key the first time (``accept-new``), never a changed one.
    ``alive_interval`` x ``alive_count`` seconds of silence end a session whose link died.
    """

    identity: str | None = None
    known_hosts: str | None = None
    user: str | None = None
    port: int = 22
    connect_timeout: int = 5
    strict: bool = True
    alive_interval: int = 2
    alive_count: int = 3
    config_file: str | None = None  # "/dev/null" ignores ~/.ssh/config

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"ssh: port={self.port}; use 1 to 65535")
        for name in ("connect_timeout", "alive_interval", "alive_count"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ssh: {name}={getattr(self, name)}; use a whole number >= 1")


def check_host(host: str) -> str:
    """A host name or address that ssh cannot mistake for an option; returned unchanged."""
    if not host or host.startswith("-") or any(c.isspace() for c in host) or "@" in host:
        raise ConfigError(
            f"ssh: host {host!r} is not a host name or address; "
            f"give the user in SshOptions(user=...), not in the host"
        )
    return host


def ssh_argv(host: str, argv: Sequence[str], options: SshOptions = SshOptions()) -> list[str]:
    """``ssh -o BatchMode=yes ... -- host 'quoted argv'``: run ``argv`` on ``host``."""
    if not argv:
        raise ConfigError("ssh: an empty command; give the argv to run on the host")
    o = options
    cmd = ["ssh"]
    if o.config_file is not None:
        cmd += ["-F", o.config_file]
    cmd += [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={o.connect_timeout}",
        "-o", f"StrictHostKeyChecking={'yes' if o.strict else 'accept-new'}",
        "-o", f"ServerAliveInterval={o.alive_interval}",
        "-o", f"ServerAliveCountMax={o.alive_count}",
        "-o", "LogLevel=ERROR",
        "-p", str(o.port),
    ]  # fmt: skip
    if o.known_hosts is not None:
        cmd += ["-o", f"UserKnownHostsFile={o.known_hosts}"]
    if o.identity is not None:
        cmd += ["-o", "IdentitiesOnly=yes", "-i", o.identity]
    if o.user is not None:
        cmd += ["-l", o.user]
    return [*cmd, "--", check_host(host), shlex.join(argv)]
