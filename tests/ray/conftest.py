"""One real 2-node Ray cluster for every Ray test that runs a job.

A head (``ray start --head``) and a worker node (``ray start --address``) through
``dk.ray.local_cluster``, one CPU each. As root the worker node runs on a namespaced host
(``ddlkit.hosts.netns``, as notebook 06 makes them) and the head on this machine's address on
that host's network, so actors reach the head, each other and the collector only over that
network; elsewhere the node is a second loopback address (127.0.0.3 beside the head's
127.0.0.2). The tests that use it live in test_ray_runs.py: `make test` runs each test file
on one pytest-xdist worker, so they share this one cluster. It is stopped at the end of the
session, and nothing of it may be left.
"""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    from ddlkit.hosts import netns
    from ddlkit.procs import alive
    from ddlkit.ray import local_cluster

    with contextlib.ExitStack() as stack:
        hosts = (
            () if netns.unavailable(try_it=True) else stack.enter_context(netns.namespaced_hosts(1))
        )
        cluster = local_cluster(nodes=2, cpus_per_node=1, hosts=hosts)
        try:
            yield cluster
        finally:
            pids = cluster.pids()
            cluster.close()
            assert not cluster.running
            left = [p for p in pids if alive(p)]
            assert not left, f"Ray processes left after close(): {left}"
