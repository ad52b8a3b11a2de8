"""The SSH client side: how ddlkit runs a command on a host (OpenSSH in BatchMode).

`ssh_argv` builds the argv; nothing here runs it. BatchMode means no prompt (password,
passphrase, unknown host key) can hang a notebook cell: ssh fails at once instead. The
remote command is built with ``shlex.join`` from an argv list, so no user string is ever
parsed by a shell as anything but one word.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError, DdlkitError

ENV_FIX = "install the kit's venv at the same path on every host (as horovodrun expects)"


class HostError(DdlkitError):
    """Hosts that cannot run a job: ``hosts`` names them; the message says why and the fix.

    ``problem``/``fix`` are the parts of a one-host error, ``reachable`` whether SSH got in.
    """

    def __init__(
        self,
        message: str,
        *,
        hosts: Sequence[str],
        problem: str = "",
        fix: str = "",
        reachable: bool = False,
    ) -> None:
        super().__init__(message)
        self.hosts = tuple(hosts)
        self.problem = problem or message
        self.fix = fix
        self.reachable = reachable


@dataclass(frozen=True)
class SshOptions:
    """How to reach the hosts: key, known-hosts file, user, port and time limits.

    ``identity``/``known_hosts`` of None leave OpenSSH's own defaults (``~/.ssh``);
    ``strict`` False accepts a host's key the first time (``accept-new``), never a changed one.
    ``alive_interval`` x ``alive_count`` seconds of silence end a session whose link died.
    ``port`` None passes no ``-p``: each host's port comes from ``config_file`` (a user-mode
    demo cluster's ``Host host1`` entries) or OpenSSH's default.
    """

    identity: str | None = None
    known_hosts: str | None = None
    user: str | None = None
    port: int | None = 22
    connect_timeout: int = 5
    strict: bool = True
    alive_interval: int = 2
    alive_count: int = 3
    config_file: str | None = None  # "/dev/null" ignores ~/.ssh/config

    def __post_init__(self) -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ConfigError(f"ssh: port={self.port}; use 1 to 65535, or None (ssh config's)")
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


def ssh_options_argv(options: SshOptions) -> list[str]:
    """The ssh options (everything between ``ssh`` and the host) that `SshOptions` stands for."""
    o = options
    cmd = ["-F", o.config_file] if o.config_file is not None else []
    cmd += [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={o.connect_timeout}",
        "-o", f"StrictHostKeyChecking={'yes' if o.strict else 'accept-new'}",
        "-o", f"ServerAliveInterval={o.alive_interval}",
        "-o", f"ServerAliveCountMax={o.alive_count}",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    if o.port is not None:
        cmd += ["-p", str(o.port)]
    if o.known_hosts is not None:
        cmd += ["-o", f"UserKnownHostsFile={o.known_hosts}"]
    if o.identity is not None:
        cmd += ["-o", "IdentitiesOnly=yes", "-i", o.identity]
    if o.user is not None:
        cmd += ["-l", o.user]
    return cmd


def ssh_argv(host: str, argv: Sequence[str], options: SshOptions = SshOptions()) -> list[str]:
    """``ssh -o BatchMode=yes ... -- host 'quoted argv'``: run ``argv`` on ``host``."""
    if not argv:
        raise ConfigError("ssh: an empty command; give the argv to run on the host")
    return ["ssh", *ssh_options_argv(options), "--", check_host(host), shlex.join(argv)]


def ssh_shim_text(real_ssh: str, options: SshOptions, python: str = sys.executable) -> str:
    """A Python script standing in for ``ssh``: the real one with ``options`` put first.

    For launchers that call ``ssh`` by name with their own options (horovodrun: host-key
    checking off, no BatchMode): OpenSSH keeps the first value of each ``-o`` option, so
    ours win. No shell is involved; the options are a Python literal.
    """
    opts = ssh_options_argv(options)
    return (
        f"#!{python}\n"
        "import os, sys\n"
        f"os.execv({real_ssh!r}, [{real_ssh!r}, *{opts!r}, *sys.argv[1:]])\n"
    )


def write_ssh_shim(directory: str | os.PathLike[str], options: SshOptions) -> Path:
    """Write ``directory/ssh`` (see `ssh_shim_text`); put ``directory`` first on PATH."""
    real = shutil.which("ssh")
    if real is None:
        raise ConfigError("ssh: no `ssh` on PATH; fix: apt-get install openssh-client")
    path = Path(directory) / "ssh"
    if Path(real).resolve() == path.resolve():
        raise ConfigError(f"ssh: {path} is already first on PATH; write the shim elsewhere")
    path.write_text(ssh_shim_text(real, options))
    path.chmod(0o755)
    return path


def classify_ssh_failure(host: str, returncode: int, stderr: str, program: str) -> tuple[str, str]:
    """(problem, fix) for a failed ssh run of ``program`` (255: ssh failed, 127: no program)."""
    err = stderr.strip()
    last = err.splitlines()[-1] if err else f"exit status {returncode}"
    if returncode == 255:  # ssh itself failed
        if "Permission denied" in err:
            return (
                f"SSH authentication failed on {host}: {last}",
                f"put your public key in {host}:~/.ssh/authorized_keys (ssh-copy-id {host}) "
                f"or pass SshOptions(identity=...) with the right key",
            )
        if "Host key verification failed" in err or "host key" in err.lower():
            return (
                f"{host}'s host key is unknown or changed: {last}",
                f"check the key, then add it: ssh-keyscan {host} >> ~/.ssh/known_hosts",
            )
        if "Could not resolve hostname" in err:
            return (f"{host} has no address: {last}", "check the host name or use its address")
        return (
            f"{host} is unreachable over SSH: {last}",
            f"check that {host} is up, its network link works and sshd listens on its port",
        )
    if returncode == 127 or "No such file or directory" in err or "not found" in err:
        return (
            f"no {program} on {host}: {last}",
            f"{ENV_FIX}, or give the path of the kit's Python there",
        )
    return (f"{program} failed on {host} (exit {returncode}): {last}", ENV_FIX)


def run_on(
    host: str, argv: Sequence[str], options: SshOptions | None = None, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` on ``host`` over SSH and return what it printed and its exit status.

    Raises `HostError` (naming the host, the problem and the fix) when ssh cannot get in
    (exit 255), the program is not there (127), or nothing finishes within ``timeout`` s
    (ssh is then killed). Other exit statuses are the program's own and are returned.
    """
    try:
        done = subprocess.run(
            ssh_argv(host, argv, options or SshOptions()),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:  # subprocess.run has killed ssh
        problem = f"{host} did not answer over SSH within {timeout:.0f} s"
        fix = f"check that {host} is up and its network link works"
        raise HostError(f"{problem}; fix: {fix}", hosts=[host], problem=problem, fix=fix) from None
    if done.returncode in (255, 127):
        problem, fix = classify_ssh_failure(host, done.returncode, done.stderr, argv[0])
        raise HostError(
            f"{problem}; fix: {fix}",
            hosts=[host],
            problem=problem,
            fix=fix,
            reachable=done.returncode != 255,
        )
    return done


# Runs on the host: makes the working directory (argv[1], '' for none); if argv[3] is "1",
# reads one JSON line of secret variables from stdin first (they never appear in an argv,
# where any user of either machine could read them); starts the command (argv[4:]) there
# with them in its own process group and ends that group when the SSH session's stdin
# closes (the launcher died, stopped the job, or the link is gone and sshd dropped the
# session), when nothing arrives on stdin for argv[2] seconds (0: no limit; the launcher's
# heartbeat stopped: a cut link that sshd does not notice), when it is signalled, or when
# the command exits.
WATCHDOG = """\
import json, os, select, signal, subprocess, sys, threading
cwd = sys.argv[1] or None
silence = float(sys.argv[2]) or None
env = dict(os.environ)
if sys.argv[3] == "1":
    line = b""
    while not line.endswith(b"\\n"):
        if not select.select([0], [], [], silence)[0] or not (byte := os.read(0, 1)):
            sys.exit("ddlkit watchdog: no variables arrived on stdin")
        line += byte
    env.update(json.loads(line))
if cwd:
    os.makedirs(cwd, exist_ok=True)
child = subprocess.Popen(
    sys.argv[4:], cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True
)
def end(sig=signal.SIGTERM):
    try:
        os.killpg(child.pid, sig)
        child.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
def watch():
    try:
        while select.select([0], [], [], silence)[0] and os.read(0, 4096):
            pass
    except OSError:
        pass
    end()
threading.Thread(target=watch, daemon=True).start()
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, lambda n, f: end(n))
code = child.wait()
try:
    os.killpg(child.pid, signal.SIGKILL)
except ProcessLookupError:
    pass
sys.exit(code if code >= 0 else 128 - code)
"""


def remote_argv(
    argv: Sequence[str],
    *,
    python: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    silence: float | None = None,
    stdin_env: bool = False,
) -> list[str]:
    """The command to give `ssh_argv`: ``argv`` in ``cwd`` with ``env`` added, under a watchdog.

    With ``stdin_env`` the watchdog first reads one line from stdin, `stdin_env_line`'s
    JSON of more variables (secrets such as a token: an argv is readable by every user).

    ssh forwards no environment, so variables go through ``env NAME=VALUE``; the watchdog
    (run by the host's ``python``) makes ``cwd`` on the host if it is missing, and ends the
    command's whole process group when the session's stdin closes, so keep the local ssh's
    stdin an open pipe while the command should run. With ``silence`` it also ends the
    command when nothing arrives on stdin for that many seconds: write a heartbeat byte
    more often than that.
    """
    if not argv:
        raise ConfigError("ssh: an empty command; give the argv to run on the host")
    pairs = []
    for name, value in (env or {}).items():
        if not (name.isascii() and name.replace("_", "a").isalnum() and not name[:1].isdigit()):
            raise ConfigError(f"ssh: environment name {name!r}; use letters, digits and _")
        pairs.append(f"{name}={value}")
    if silence is not None and not silence > 0:
        raise ConfigError(f"ssh: silence={silence!r}; use a number of seconds > 0, or None")
    limit = "0" if silence is None else repr(float(silence))
    flag = "1" if stdin_env else "0"
    return ["env", *pairs, python, "-c", WATCHDOG, cwd or "", limit, flag, *argv]


def stdin_env_line(env: dict[str, str]) -> bytes:
    """The first line to write to a ``stdin_env`` watchdog's stdin: ``env`` as JSON."""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError("ssh: variables sent on stdin must be str to str")
    return json.dumps(env).encode() + b"\n"
