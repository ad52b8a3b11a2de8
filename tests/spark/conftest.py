"""One real 2-worker Spark standalone cluster on loopback for every Spark test.

The tests that use it live in test_spark_runs.py: `make test` runs each test file on one
pytest-xdist worker, so they share this one cluster; it is stopped at the end of the
session.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    from ddlkit.spark import local_cluster

    cluster = local_cluster(
        workers=2, cores_per_worker=1, work_dir=tmp_path_factory.mktemp("spark")
    )
    yield cluster
    cluster.close()
    assert not cluster.running
