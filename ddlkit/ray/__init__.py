"""Ray as a home for distributed training: a local Ray cluster, and runs of the kit's
scripts as Ray actors (``dk.launch.start(..., where=dk.where.Ray(ADDRESS))``).

- :func:`local_cluster`: a real head and worker nodes on loopback addresses
  (:mod:`ddlkit.ray.cluster`);
- :mod:`ddlkit.ray.submit`: the checks and the driver process of a run;
  :mod:`ddlkit.ray.driver`: that process (a placement group, one actor per worker);
- the actor's side of the worker contract: `ddlkit.environments.ray.Ray`.

Importing this package does not import Ray: only the driver and the actors do.
"""

from __future__ import annotations

from ddlkit.ray.cluster import LocalCluster, local_cluster

__all__ = ["LocalCluster", "local_cluster"]
