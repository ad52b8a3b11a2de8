"""A worker on another host, reached over SSH: a local ``ssh`` process runs it there.

The command, the environment set on the host, the secrets on stdin and the heartbeat are
:mod:`ddlkit.launch.remote`'s; this class is what the launcher asks of such a worker.
Its cwd and script are on the host (preflight, `ddlkit.hosts.check_hosts`, checks them);
it is never pinned to this machine's cores.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlkit.environments.base import Environment, Popen
from ddlkit.errors import ConfigError
from ddlkit.hosts.ssh import SshOptions
from ddlkit.launch.remote import remote_env, ssh_command, stdin_line
from ddlkit.launch.spec import WorkerSpec


@dataclass(frozen=True, repr=False)
class Ssh(Environment):
    host: str
    ssh: SshOptions | None = None

    name = "ssh"
    heartbeat = True

    def worker_env(
        self, worker: WorkerSpec, run_dir: Path | str, base: Mapping[str, str]
    ) -> dict[str, str]:
        """What is set on the host (not the local ssh's own environment)."""
        return remote_env(worker, run_dir, base)

    def popen(self, worker: WorkerSpec, env: Mapping[str, str], base: Mapping[str, str]) -> Popen:
        # The secrets go first on stdin, while the pipe is empty (a short line).
        return Popen(
            tuple(ssh_command(worker, env)), worker.log_path.parent, dict(base), stdin_line(env)
        )

    def check_startable(self, worker: WorkerSpec, env: Mapping[str, str]) -> None:
        if shutil.which("ssh", path=os.environ.get("PATH", os.defpath)) is None:
            raise ConfigError(
                f"worker {worker.name!r} runs on {self.host} over SSH, but there is no `ssh` "
                f"here. Fix: apt-get install openssh-client."
            )

    def soft_stop_closes_stdin(self) -> bool:
        """Closing ssh's stdin makes the host's watchdog end the worker (then ssh exits)."""
        return True

    def exit_meaning(self, code: int) -> tuple[str, str] | None:
        if code != 255:
            return None
        return (
            f"lost its SSH session to {self.host} (ssh exit 255: the link or the host "
            f"went down, sshd stopped, or the program itself exited 255)",
            f"Fix: check that {self.host} is up and reachable (dk.hosts.check_hosts "
            f"names the problem)",
        )

    def port_busy_fix(self) -> str:
        return (
            f"The log says a port was busy on {self.host}: another process took it "
            f"after the preflight check. Fix: end the process holding it there, or "
            f"launch with another base_port (--base-port)"
        )
