"""Ray as an environment: actors of one placement group start the workers, each learns who
it is from the driver that placed them.

Ray places the actors (``creates_processes_externally``). The driver asks for one placement
group of N one-CPU bundles and waits until Ray has reserved all of them at once: a placement
group is reserved atomically, all bundles or none (Ray's "Placement Groups" page:
"atomically reserve groups of resources across multiple nodes ... gang scheduling"; the
group's creator owns it: ``ray.util.placement_group``'s ``lifetime`` docstring), which an
all-reduce needs, since every worker of a collective waits for all its
peers; a job whose workers started as CPUs came free would hold the first ones idle, waiting
on a peer that may never be scheduled, until TensorFlow's own timeout. Then one actor on each
bundle reports its node's address and a free port, the driver builds every worker's TF_CONFIG
through `ddlkit.cluster.ClusterSpec` (the builder every launch path uses) and hands it back
with the worker contract of :mod:`ddlkit.contract`. The pure part is :class:`Ray` from plain
data; the actor side is ``ddlkit.ray.driver``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ddlkit._tables import html_table
from ddlkit.cluster import ClusterSpec, Task
from ddlkit.environments.base import Environment
from ddlkit.errors import ConfigError

INSIDE_FIX = "Fix: run it through dk.launch.start(..., where=dk.where.Ray(address))."


class Ray(Environment):
    """One actor of a placement group: its rank, every actor's ``host:port``, its TF_CONFIG."""

    name = "ray"
    creates_processes_externally = True

    def __init__(self, rank: int, addresses: Sequence[str]) -> None:
        addresses = tuple(addresses)
        if not 0 <= rank < len(addresses):
            raise ConfigError(
                f"Ray worker rank {rank} is outside the placement group's {len(addresses)} "
                f"bundles. " + INSIDE_FIX
            )
        for address in addresses:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"Ray actor address {address!r} is not host:port. " + INSIDE_FIX)
        self.rank = rank
        self.addresses = addresses
        self.host = addresses[rank].rpartition(":")[0]

    def world_size(self) -> int:
        return len(self.addresses)

    def global_rank(self) -> int:
        return self.rank

    def cluster(self) -> ClusterSpec:
        """Every actor a ``worker`` (MultiWorkerMirroredStrategy; worker 0 is its chief),
        in bundle order, as Ray Train's TensorFlow backend lists its workers."""
        tasks = []
        for i, address in enumerate(self.addresses):
            host, _, port = address.rpartition(":")
            tasks.append(Task("worker", i, host, int(port)))
        return ClusterSpec(tuple(tasks))

    def _repr_html_(self) -> str:
        rows = [
            (i, a, "this actor" if i == self.rank else "") for i, a in enumerate(self.addresses)
        ]
        return html_table(("rank", "TF server", ""), rows)
