"""Failure drills on a real demo cluster (namespaced hosts with sshd): needs root."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
from harness.hosts import demo_hosts
from harness.procutil import alive, wait_until

from ddlkit import hosts
from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.hosts import demo, drills

_WHY = demo.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_WHY), reason=_WHY or "")]


@pytest.fixture(scope="module")
def cluster():
    with demo_hosts(2, check_left=False) as c:
        yield c


def test_a_new_key_is_refused_by_every_host(cluster, tmp_path):
    key = drills.new_key(tmp_path)
    assert (tmp_path / "stranger.pub").is_file()
    checked = hosts.check_hosts(cluster.addresses, dataclasses.replace(cluster.ssh, identity=key))
    assert not checked.ok and [r.host for r in checked.failures] == cluster.addresses
    assert all("authentication" in r.problem for r in checked.failures)
    with pytest.raises(DdlkitError, match="exists already"):
        drills.new_key(tmp_path)


def test_an_occupied_port_is_busy_on_that_host_only_and_freed_after(cluster):
    port = 29778
    with drills.occupy_port(cluster, 1, port) as pid:
        assert pid in cluster.processes(1)
        checked = hosts.check_hosts(cluster.addresses, cluster.ssh, ports=[port])
    assert [r.host for r in checked.failures] == [cluster.addresses[1]]
    assert str(port) in checked.failures[0].problem
    assert not alive(pid)
    assert hosts.check_hosts(cluster.addresses, cluster.ssh, ports=[port]).ok


def test_wait_idle_names_the_busy_host_then_returns_when_it_is_idle(cluster):
    assert drills.wait_idle(cluster, timeout=5) == [[], []]
    sleeper = subprocess.Popen(cluster.hosts[0].exec_argv(["sleep", "60"]))
    try:  # busy once the sleeper runs on the host (starting it there takes a moment)
        assert wait_until(lambda: cluster.processes(0), 10), "the sleeper never started"
        with pytest.raises(JobTimeoutError, match=cluster.addresses[0]):
            drills.wait_idle(cluster, timeout=1)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert drills.wait_idle(cluster, timeout=10) == [[], []]
