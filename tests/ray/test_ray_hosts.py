"""Ray with its worker node on another host: the head on this machine's address on a
namespaced host's network, the node inside the namespace (root; `ddlkit.hosts.netns`, as
notebook 06 makes hosts), so actors reach the head, each other and the collector only over
that network, as on a real cluster. ``collector_host="auto"`` makes the collector listen on
this machine's address towards the head, with a token.

Horovod across such hosts is not run: horovod.ray picks the network interfaces every node has
by name, and `lo` is the only one a namespaced host shares with this machine, so its Gloo
ranks connected to 127.0.0.1 and failed ("gloo::IoException ... connect [127.0.0.1]").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit.hosts import netns
from ddlkit.launch import run as run_mod
from ddlkit.metrics.protocol import is_loopback
from ddlkit.ray import local_cluster
from ddlkit.where import Ray

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "train_multi_worker.py"
STEPS = ["--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "32"]
_WHY = netns.unavailable(try_it=True)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_WHY), reason=_WHY or "")]


def test_actors_on_another_host_stream_to_a_collector_they_reach(data_env, tmp_path):
    with netns.namespaced_hosts(1) as hosts:
        with local_cluster(nodes=2, cpus_per_node=1, hosts=hosts) as cluster:
            gateway = hosts[0].gateway
            assert cluster.address.startswith(f"{gateway}:")
            assert cluster.info.nodes == (gateway, hosts[0].address)
            assert netns.pids_in(hosts[0])  # the worker node's daemons run in the namespace
            run = run_mod.start(
                SCRIPT,
                strategy="multi_worker",
                workers=2,
                args=STEPS,
                where=Ray(cluster.address, placement="STRICT_SPREAD", collector_host="auto"),
                runs_dir=tmp_path / "runs",
            )
            assert run.collector.host == gateway and not is_loopback(gateway)
            result = run.wait(timeout=300)
            driver = run.tail("ray-driver", 40)
            assert result.ok, driver
            ran_on = {line.rsplit("on node ", 1)[1].rstrip(")") for line in driver.splitlines()
                      if ": finished in " in line}  # fmt: skip
            assert ran_on == {gateway, hosts[0].address}, driver
            for name in ("worker-0", "worker-1"):
                assert [r.kind for r in run.records(name)].count("step") == 4, name
            reports = run.results()
            assert (
                reports["worker-0"]["weights_checksum"] == reports["worker-1"]["weights_checksum"]
            )
        assert not cluster.running
        assert not netns.pids_in(hosts[0])  # the node's daemons and actors ended
