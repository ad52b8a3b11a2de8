"""Spark with its workers on other hosts: a standalone cluster whose workers run in network
namespaces, so the executors reach the driver and the collector only through this machine's
address on their network, as on a real cluster (root; `ddlkit.hosts.netns`).

This is the path `ddlkit launch --engine spark --master spark://HOST:PORT --collector-host auto`
takes: the collector listens on this machine's address towards the master, with a token, and
the driver advertises that address too (`ddlkit.spark.driver.driver_host_conf`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit.hosts import netns
from ddlkit.launch import run as run_mod
from ddlkit.metrics.protocol import is_loopback
from ddlkit.spark import local_cluster
from ddlkit.where import Spark

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
STEPS = ["--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "32"]
_WHY = netns.unavailable(try_it=True)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_WHY), reason=_WHY or "")]


def test_executors_on_other_hosts_stream_to_a_collector_they_reach(data_env, tmp_path):
    with netns.namespaced_hosts(2) as hosts:
        cluster = local_cluster(workers=2, hosts=hosts, work_dir=tmp_path / "spark")
        with cluster:
            gateway = hosts[0].gateway
            assert cluster.master_url.startswith(f"spark://{gateway}:")
            assert all(netns.pids_in(h) for h in hosts)  # a worker daemon in each namespace
            run = run_mod.start(
                LAUNCH / "train_multi_worker.py",
                strategy="multi_worker",
                workers=2,
                args=STEPS,
                where=Spark(cluster.master_url, collector_host="auto"),
                runs_dir=tmp_path / "runs",
            )
            assert run.collector.host == gateway and not is_loopback(gateway)
            result = run.wait(timeout=300)
            driver = run.tail("spark-driver", 40)
            assert result.ok, driver
            # each task ran on a host of its own, and its steps came back over the bridge
            ran_on = {line.rsplit("on ", 1)[1].rstrip(")") for line in driver.splitlines()
                      if ": finished in " in line}  # fmt: skip
            assert ran_on == {h.address for h in hosts}, driver
            for name in ("worker-0", "worker-1"):
                assert [r.kind for r in run.records(name)].count("step") == 4, name
            reports = run.results()
            assert (
                reports["worker-0"]["weights_checksum"] == reports["worker-1"]["weights_checksum"]
            )
        assert not cluster.running
        assert not any(netns.pids_in(h) for h in hosts)  # the workers and executors ended
