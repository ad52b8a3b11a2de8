"""Workers on other hosts: the local ``ssh`` command that runs one there (pure data).

A remote worker is a local ``ssh`` process (started, signalled and reaped like any other
worker by :mod:`ddlkit.launch.process`) running the worker's argv on its host under the
watchdog of :func:`ddlkit.hosts.ssh.remote_argv`:

- the worker's environment (TF_CONFIG, ``DDLKIT_*``, Keras and thread variables) is set on
  the host with ``env NAME=VALUE``; ssh forwards none of the launcher's environment, so the
  kit's own settings (`FORWARDED`) are passed on explicitly. Secrets (the collector's
  token) are not in that argv, which any user of either machine can read: they go as the
  first line on ssh's stdin (`stdin_line`);
- its working directory (the same path as on this machine) is made on the host;
- its output comes back over SSH into the worker's log file here;
- ssh's stdin stays an open pipe: when it closes (the job stopped or killed the local ssh,
  the launcher died, the link dropped), the watchdog ends the worker's process group there;
- the job writes a heartbeat byte to it every `HEARTBEAT_INTERVAL` s: after `SILENCE` s
  without one (a cut link that the host's sshd does not notice; Debian's sshd has no
  ClientAlive by default) the watchdog ends the worker too.

Remote workers are not pinned to cores: TensorFlow sizes its own thread pools there.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlkit.errors import ConfigError
from ddlkit.hosts.ssh import remote_argv, ssh_argv, stdin_env_line
from ddlkit.launch.spec import WorkerSpec, is_secret, worker_env

HEARTBEAT_INTERVAL = 2.0  # seconds between the job's heartbeat bytes to a remote worker
SILENCE = 30.0  # seconds without one after which the host's watchdog ends the worker

# The launcher's settings that workers read too (ddlkit.settings, ddlkit.data).
FORWARDED = (
    "DDLKIT_FAST",
    "DDLKIT_HOME",
    "DDLKIT_OFFLINE",
    "DDLKIT_PLOTS",
    "DDLKIT_RUNS",
    "DDLKIT_FASHION_MNIST_DIR",
    "TF_CPP_MIN_LOG_LEVEL",
)


def remote_env(worker: WorkerSpec, run_dir: Path | str, base: Mapping[str, str]) -> dict[str, str]:
    """What is set on the host: the forwarded settings, the worker's env, the launcher's vars."""
    forwarded = {k: base[k] for k in FORWARDED if k in base}
    return {**forwarded, **worker_env(worker, run_dir, base={})}


def ssh_command(worker: WorkerSpec, env: Mapping[str, str]) -> list[str]:
    """The local argv that runs ``worker`` on its host with ``env`` (see the module docstring).

    The watchdog runs with the worker's own Python (its argv[0]), so the host needs nothing
    but that Python at the same path.
    """
    if worker.host is None:
        raise ConfigError(f"worker {worker.name!r} has no host; it runs on this machine")
    return ssh_argv(
        worker.host,
        remote_argv(
            worker.argv,
            python=worker.argv[0],
            env={k: v for k, v in env.items() if not is_secret(k)},
            cwd=str(worker.cwd),
            silence=SILENCE,
            stdin_env=True,
        ),
        worker.ssh,
    )


def stdin_line(env: Mapping[str, str]) -> bytes:
    """The first line written to the worker's ssh: its secret variables, as JSON."""
    return stdin_env_line({k: v for k, v in env.items() if is_secret(k)})


def address_towards(hosts: Sequence[str]) -> str:
    """This machine's address on the network that reaches ``hosts`` (the first one's route).

    A UDP socket "connected" to the host makes the kernel choose the source address it
    would use; no packet is sent.
    """
    addresses = set()
    for host in hosts:
        try:
            target = socket.gethostbyname(host)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                addresses.add(s.getsockname()[0])
        except OSError as exc:
            raise ConfigError(
                f"collector_host='auto': no route from this machine to {host} ({exc}). "
                f"Fix: check the host name, or pass collector_host=<this machine's address "
                f"that the hosts reach>."
            ) from None
    if len(addresses) != 1:
        raise ConfigError(
            f"collector_host='auto': this machine reaches {', '.join(hosts)} from several "
            f"addresses ({', '.join(sorted(addresses))}). Fix: pass collector_host=<the one "
            f"every host reaches>, or '0.0.0.0' (all addresses) with a token."
        )
    return addresses.pop()
