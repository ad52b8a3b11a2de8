"""While a peer pod is Pending: wait for its DNS name, bounded, then one clear error.

A core Job starts each pod as soon as the scheduler finds room for it, one at a time, so a
job of 4 pods on room for 3 runs 3 while the fourth stays Pending. TensorFlow's
coordination service would hold those 3 in "Waiting for 1/4 tasks to connect" for its
default registration timeout of one hour (``kDefaultClusterRegisterTimeout`` in
``xla/tsl/distributed_runtime/coordination/coordination_service_agent.cc``; the
MultiWorkerMirroredStrategy leaves ``cluster_register_timeout_in_ms`` at 0, which means that
default), holding their CPUs and GPUs.

A Pending pod has no address, so the headless Service gives its name no DNS record (the
Service publishes not-ready pods, but only those that have an IP). So ``ddlkit.k8s exec``
first waits until every peer's name resolves, for ``--peer-wait`` seconds, and otherwise
exits with :class:`PeersPendingError` naming the pods still without an address and what to
do. Kueue, JobSet or Volcano admit a job's pods together or not at all (gang scheduling);
this wait is what a core Job gets instead.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Sequence

from ddlkit.errors import DdlkitError

DEFAULT_PEER_WAIT = 600.0  # seconds; an image pull on a cold node can take minutes
POLL = 1.0


class PeersPendingError(DdlkitError):
    """Some peer pods never got an address within the wait (Pending: not scheduled)."""

    def __init__(self, me: str, pending: Sequence[str], waited: float) -> None:
        self.me = me
        self.pending = list(pending)
        self.waited = waited
        pods = ", ".join(h.split(".")[0] for h in self.pending)
        super().__init__(
            f"{me} waited {waited:.0f} s for pod(s) {pods} to get an address, and they have "
            f"none: they are Pending (not scheduled, or their image is still pulling). A "
            f"core Job starts pods as resources allow; Kueue, JobSet or Volcano start a "
            f"job's pods together. Fix: `kubectl describe pod {self.pending[0].split('.')[0]}` "
            f"says why it waits; free or add the CPUs, memory or GPUs it asks for, or raise "
            f"--peer-wait."
        )


def resolves(host: str) -> bool:
    """Whether ``host`` has an address now (``getaddrinfo``: DNS, or ``/etc/hosts``)."""
    try:
        return bool(socket.getaddrinfo(host, None))
    except (socket.gaierror, UnicodeError):
        return False


def wait_for_peers(
    me: str,
    peers: Iterable[str],
    timeout: float = DEFAULT_PEER_WAIT,
    *,
    resolve: Callable[[str], bool] = resolves,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = POLL,
) -> float:
    """Return the seconds waited once every name in ``peers`` resolves.

    Raises :class:`PeersPendingError` (naming the ones that did not) after ``timeout``
    seconds; ``timeout <= 0`` checks once.
    """
    pending = list(dict.fromkeys(peers))
    start = clock()
    while True:
        pending = [h for h in pending if not resolve(h)]
        waited = clock() - start
        if not pending:
            return waited
        if waited >= timeout:
            raise PeersPendingError(me, pending, waited)
        sleep(min(poll, max(timeout - waited, 0.0)))
