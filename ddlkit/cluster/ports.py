"""Free TCP ports: the only part of :mod:`ddlkit.cluster` that opens sockets."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterator

from ddlkit.cluster.hosts import _is_int
from ddlkit.errors import ConfigError


def _sockaddr(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(
            f"cannot resolve host {host!r}: {exc.strerror}. Fix: use an address of this "
            "machine, e.g. 127.0.0.1."
        ) from None
    return family, sockaddr


def _pick_ports(counts: dict[str, int], tries: int = 200) -> dict[str, list[int]]:
    """``counts[host]`` free ports per host, in turn through :data:`PICKED_PORTS` from where
    the last pick on this machine stopped (:func:`_turn`), so processes picking at once get
    different ports though each releases its own before its server binds them; all held open
    together so none repeats. ConfigError after ``tries`` taken ports beyond them."""
    low, high = PICKED_PORTS
    picked: dict[str, list[int]] = {}
    with _turn(low, high) as last, contextlib.ExitStack() as held:
        for host, n in counts.items():
            family, sockaddr = _sockaddr(host, 0)
            picked[host] = []
            taken = 0
            while len(picked[host]) < n:
                last[0] = low + (last[0] + 1 - low) % (high - low)
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.bind((sockaddr[0], last[0], *sockaddr[2:]))
                except OSError as exc:
                    sock.close()
                    if exc.errno != errno.EADDRINUSE:
                        raise ConfigError(
                            f"cannot pick a free port on {host!r}: {exc.strerror}. Fix: use an "
                            "address of this machine (e.g. 127.0.0.1); for other machines give "
                            "fixed ports, e.g. ClusterSpec.from_hosts(..., base_port=2222)."
                        ) from None
                    taken += 1
                    if taken > tries + n:
                        raise ConfigError(
                            f"no {n} free ports between {low} and {high} on {host!r} after "
                            f"{taken} taken ones. Fix: end what holds them, or give fixed "
                            "ports (base_port=...)."
                        ) from None
                    continue
                held.enter_context(sock)
                picked[host].append(last[0])
    return picked


@contextlib.contextmanager
def _turn(low: int, high: int) -> Iterator[list[int]]:
    """``[the last port picked]`` on this machine by this user, read from a file in the
    temporary directory and written back, under its lock; a random start where that file
    cannot be opened (another user's, or no such directory), the picks then only bound-checked."""
    import fcntl
    import random
    import tempfile

    last = [random.randrange(low, high)]
    path = os.path.join(tempfile.gettempdir(), f"ddlkit-ports-{os.getuid()}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield last
        return
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read().strip()
        if text.isdigit() and low <= int(text) < high:
            last[0] = int(text)
        yield last
        f.seek(0)
        f.truncate()
        f.write(str(last[0]))


# TF servers on other hosts listen on BASE_PORT, BASE_PORT + 1, ... (dk.where.Hosts' default)
BASE_PORT = 29600

# Ports for servers on this machine: below Linux's ephemeral range (ip_local_port_range,
# 32768-60999 by default), which the kernel hands to outgoing connections and to port 0, and
# below zmq's random ports (49152-65535). A port picked there and bound later may be taken by
# then by any connection, or be the port a peer's client connects from to reach it (a TCP
# self-connect: the client then talks to itself, and the job hangs).
# Both ranges lie below 20000: from there up a Slurm job's workers take fixed ports by job id
# (ddlkit.environments.slurm), and a live Slurm worker binds them only when a cell makes the
# strategy, so a block or pick of this machine's there could take them first.
# Blocks (free_port_block) that servers bind minutes later (a live worker's TF server, created
# when a cell makes the strategy; the live workers' controller): not held meanwhile, so no
# one-off pick falls there.
SERVER_PORTS = (15000, 20000)
# One-off ports (free_ports) that servers bind within seconds.
PICKED_PORTS = (10000, 15000)


def free_port_block(count: int, host: str = "", tries: int = 200) -> int:
    """A port ``p`` with ``p .. p + count - 1`` free on ``host`` now (``""``: every address),
    all in :data:`SERVER_PORTS`; tried at random places, ConfigError after ``tries``."""
    import random

    low, high = SERVER_PORTS
    family, _ = _sockaddr(host or "0.0.0.0", 0)
    for _ in range(tries):
        first = random.randrange(low, high - count)
        try:
            with contextlib.ExitStack() as held:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket(family, socket.SOCK_STREAM))
                    sock.bind((host, port))
        except OSError:
            continue
        return first
    raise ConfigError(
        f"no {count} free consecutive ports between {low} and {high} on {host or 'this machine'} "
        f"after {tries} tries. Fix: end what holds them, or pass base_port= yourself."
    )


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that are free on ``host`` right now.

    Each is picked in turn in :data:`PICKED_PORTS` (see :func:`_pick_ports`) and bound;
    all are held until the last is picked, then released. Below the kernel's ephemeral
    range, no outgoing connection takes one meanwhile (nor connects a client to itself
    there), but another process may still bind one before the caller does, so start
    servers soon after.
    """
    if not _is_int(n) or n < 0:
        raise ConfigError(f"free_ports(n={n!r}): n must be an integer >= 0. Fix: e.g. n=2.")
    return _pick_ports({host: n})[host]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind TCP ``host:port`` now (tested by binding it)."""
    if not _is_int(port) or not 1 <= port <= 65535:
        raise ConfigError(f"port {port!r} is not a TCP port. Fix: use 1..65535, e.g. 2222.")
    family, sockaddr = _sockaddr(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so a port left in TIME_WAIT is free for them too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise ConfigError(
                f"cannot test port {port} on {host!r}: {exc.strerror}. Fix: use an address "
                "of this machine (e.g. 127.0.0.1) and a port >= 1024."
            ) from None
    return True
