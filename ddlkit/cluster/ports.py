"""Free TCP ports: the only part of :mod:`ddlkit.cluster` that opens sockets."""

from __future__ import annotations

import contextlib
import errno
import socket

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


def _pick_ports(counts: dict[str, int]) -> dict[str, list[int]]:
    """``counts[host]`` free ports per host, all held open together so none repeats."""
    picked: dict[str, list[int]] = {}
    with contextlib.ExitStack() as held:
        for host, n in counts.items():
            family, sockaddr = _sockaddr(host, 0)
            picked[host] = []
            for _ in range(n):
                sock = held.enter_context(socket.socket(family, socket.SOCK_STREAM))
                try:
                    sock.bind(sockaddr)
                except OSError as exc:
                    raise ConfigError(
                        f"cannot pick a free port on {host!r}: {exc.strerror}. Fix: use an "
                        "address of this machine (e.g. 127.0.0.1); for other machines give "
                        "fixed ports, e.g. ClusterSpec.from_hosts(..., base_port=2222)."
                    ) from None
                picked[host].append(sock.getsockname()[1])
    return picked


# TF servers on other hosts listen on BASE_PORT, BASE_PORT + 1, ... (dk.where.Hosts' default)
BASE_PORT = 29600

# Ports servers may keep for a while: below Linux's ephemeral range (ip_local_port_range,
# 32768-60999 by default), which the kernel hands to outgoing connections and to port 0,
# and below zmq's random ports (49152-65535): a port picked there and bound minutes later
# (a live worker's TF server, created when a cell makes the strategy) may be taken by then.
SERVER_PORTS = (20000, 32768)


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

    Each comes from binding port 0 (the kernel's choice); all are held until
    the last is picked, then released. Another process may still take one
    before the caller binds it, so start servers soon after.
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
