"""One real 2-node Ray cluster on loopback for every Ray test that runs a job.

A head on 127.0.0.2 and a worker node on 127.0.0.3 (``ray start --head`` and ``ray start
--address``, through ``dk.ray.local_cluster``), one CPU each. The tests that use it live in
test_ray_runs.py, and they share this one cluster; it is stopped when that file's tests are
done (a module fixture: an idle cluster's daemons kept taking CPU from every later test of
its pytest-xdist worker), and nothing of it may be left.
A worker node on a namespaced host (root) is test_ray_hosts.py's own cluster.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    from ddlkit.procs import alive
    from ddlkit.ray import local_cluster

    cluster = local_cluster(nodes=2, cpus_per_node=1)
    try:
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.close()
        assert not cluster.running
        left = [p for p in pids if alive(p)]
        assert not left, f"Ray processes left after close(): {left}"
