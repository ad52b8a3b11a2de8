"""Where a run's metrics collector listens and what its workers are told (pure but for
``address_towards``, which asks the kernel for a route)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlkit.errors import ConfigError
from ddlkit.launch import remote
from ddlkit.metrics.protocol import is_loopback

if TYPE_CHECKING:
    from ddlkit.launch.plan import LaunchConfig

WILDCARDS = ("0.0.0.0", "::")


def collector_address(config: LaunchConfig, collector_host: str | None) -> tuple[str, str | None]:
    """(address the collector binds, address workers are told, None: the same)."""
    remote_hosts = [h.name for h in config.hosts or ()] if config.remote else []
    on_loopback = all(is_loopback(h) for h in remote_hosts)  # user-mode hosts: 127.0.0.k
    if remote_hosts and not on_loopback and (collector_host is None or is_loopback(collector_host)):
        raise ConfigError(
            f"workers on {', '.join(remote_hosts)} cannot send live metrics to "
            f"{collector_host or '127.0.0.1'} on this machine. Fix: pass "
            f"collector_host='auto' (ddlkit launch --collector-host auto: this machine's "
            f"address on the hosts' network; a token is made for you) or an address of this "
            f"machine they reach, or live=False (--no-live)."
        )
    if collector_host is None:
        return "127.0.0.1", None
    if collector_host == "auto":
        return (remote.address_towards(remote_hosts), None) if remote_hosts else ("127.0.0.1", None)
    if collector_host in WILDCARDS:
        if not remote_hosts:
            return collector_host, "127.0.0.1"
        return collector_host, remote.address_towards(remote_hosts)
    return collector_host, None
