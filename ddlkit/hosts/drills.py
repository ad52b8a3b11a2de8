"""Failure drills on a demo cluster: the faults notebook 06 makes on purpose.

- `new_key`: an SSH key pair no host has authorised (an authentication failure);
- `occupy_port`: a program holding a TCP port on one host (a blocked port; on user-mode
  hosts, which share one network stack, it is blocked on every host);
- `wait_idle`: wait until nothing but sshd runs on any host (after a failure).

Each drill undoes itself: the key is a file in a directory you give, the port holder ends
with its ``with`` block, and waiting changes nothing.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.hosts.demo import DemoCluster
from ddlkit.hosts.sshd import keygen_argv

__all__ = ["new_key", "occupy_port", "wait_idle"]

# The port holder: listen on every address of the host, then wait for stdin to close.
_HOLD = "import socket, sys; s = socket.create_server(('', int(sys.argv[1]))); sys.stdin.read()"


def new_key(directory: str | Path, name: str = "stranger") -> str:
    """Make an ed25519 key pair ``directory/name`` (no passphrase); the private key's path."""
    path = Path(directory) / name
    if path.exists():
        raise DdlkitError(f"{path} exists already. Fix: pick another name or directory.")
    subprocess.run(keygen_argv(path, name), check=True, capture_output=True, timeout=30)
    return str(path)


@contextmanager
def occupy_port(
    demo: DemoCluster, index: int, port: int, *, timeout: float = 30.0
) -> Iterator[int]:
    """Hold TCP ``port`` on host ``index`` of ``demo`` for the ``with`` block; yields the pid."""
    host = demo.hosts[index]
    holder = subprocess.Popen(
        host.exec_argv([sys.executable, "-c", _HOLD, str(port)]),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if holder.poll() is not None:
                raise DdlkitError(
                    f"could not hold port {port} on {host.address}: "
                    f"{holder.stderr.read().strip()}. Fix: pick a free port."
                )
            try:
                socket.create_connection((host.address, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise JobTimeoutError(
                        f"port {port} on {host.address} did not open within {timeout:.0f} s"
                    ) from None
                time.sleep(0.1)
        yield holder.pid
    finally:
        holder.stdin.close()  # the holder ends when its stdin closes
        try:
            holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stderr.close()


def wait_idle(demo: DemoCluster, *, timeout: float = 60.0) -> list[list[int]]:
    """Wait until no host runs anything but its sshd; each host's other pids (all empty).

    Raises JobTimeoutError naming the host and its processes after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = [demo.processes(i) for i in range(len(demo.hosts))]
        if not any(left):
            return left
        if time.monotonic() >= deadline:
            busy = {demo.addresses[i]: pids for i, pids in enumerate(left) if pids}
            look = "`ps -fp PID`" if demo.kind == "user" else "`ip netns pids <namespace>`"
            raise JobTimeoutError(
                f"processes still running after {timeout:.0f} s: {busy}. Fix: look at them "
                f"with {look}; demo_cluster's exit stops them."
            )
        time.sleep(0.2)
