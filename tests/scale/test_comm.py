"""ddlkit.scale.comm: each formula against a case computed by hand."""

from __future__ import annotations

import pytest

from ddlkit.errors import ConfigError
from ddlkit.scale import comm
from ddlkit.scale.hardware import Link

GB = Link("1 GB/s, 1 ms", 1e9, 1e-3)
FAST = Link("10 GB/s, 0", 10e9, 0.0)


def test_ring_is_2_n_minus_1_latencies_per_buffer_plus_2_n_minus_1_over_n_bytes():
    # n=4, 1 GB, 2 buffers: 2*3*1ms*2 = 12 ms; 2*3/4 * 1 GB / 1 GB/s = 1.5 s
    assert comm.ring(1e9, 4, GB, buffers=2) == pytest.approx(0.012 + 1.5)
    assert comm.ring(1e9, 1, GB) == 0.0  # one worker: nothing to reduce


def test_halving_doubling_has_log_latency_and_ring_bytes():
    # n=8: 2*log2(8)=6 steps of 1 ms; bytes 2*7/8 GB -> 1.75 s
    assert comm.halving_doubling(1e9, 8, GB) == pytest.approx(0.006 + 1.75)
    # n=5 rounds log2 up to 3
    assert comm.halving_doubling(1e9, 5, GB) == pytest.approx(0.006 + 1.6)


def test_the_double_binary_tree_moves_2s_through_every_node_a_single_tree_3s():
    # 8 workers: 2 log2(8) = 6 steps of 1 ms per buffer, 3 buffers; 2 S / B
    assert comm.tree(1e9, 8, GB, buffers=3) == pytest.approx(2 * 3 * 1e-3 * 3 + 2.0)
    # one tree: an inner node takes in 2 S and sends S up, then takes S and sends 2 S
    assert comm.binary_tree(1e9, 8, GB) == pytest.approx(0.006 + 3.0)
    assert comm.binary_tree(1e9, 2, GB) == pytest.approx(0.002 + 1.0)  # root and one leaf
    # at scale the double tree costs the ring's bandwidth (n/(n-1) of it), not more
    assert comm.tree(1e9, 1024, FAST) == pytest.approx(comm.ring(1e9, 1024, FAST) * 1024 / 1023)


def test_hierarchical_is_a_ring_inside_the_node_plus_an_all_reduce_across_nodes():
    # g=4 on 10 GB/s without latency: 2*3/4 * 1 GB / 10 GB/s = 0.15 s
    # m=8 nodes on 1 GB/s ring: 2*7*1 ms + 2*7/8 s = 0.014 + 1.75
    assert comm.hierarchical(1e9, 4, 8, FAST, GB) == pytest.approx(0.15 + 0.014 + 1.75)
    hd = comm.hierarchical(1e9, 4, 8, FAST, GB, across="halving_doubling")
    assert hd == pytest.approx(0.15 + 0.006 + 1.75)


def test_a_flat_ring_across_nodes_is_paced_by_the_network_inside_one_node_by_the_bus():
    assert comm.flat(1e9, 4, 4, FAST, GB) == pytest.approx(comm.ring(1e9, 4, FAST))
    assert comm.flat(1e9, 8, 4, FAST, GB) == pytest.approx(comm.ring(1e9, 8, GB))


def test_a_parameter_server_fed_by_node_sums_takes_one_push_per_node():
    # 4 GPUs a node on 10 GB/s (no latency): ring inside 2*3/4 * 1 GB / 10 GB/s = 0.15 s;
    # 8 nodes, 4 servers: a server takes 8 * 1 GB / 4 = 2 GB each way on 1 GB/s
    t = comm.ps_node_summed(1e9, 4, 8, 4, FAST, GB)
    assert t == pytest.approx(0.15 + 2 * (1e-3 + 2.0))
    # as many servers as nodes: a node's own push (1 GB) is the busier side
    assert comm.ps_node_summed(1e9, 4, 8, 8, FAST, GB) == pytest.approx(0.15 + 2 * 1.001)


def test_parameter_server_push_and_pull_through_the_busier_link():
    # 8 workers, 4 per node, 2 servers: worker node 4 S, server 8 S / 2 = 4 S; 1 GB each
    assert comm.parameter_server(1e9, 8, 2, 4, GB) == pytest.approx(2 * (1e-3 + 4.0))
    # 16 workers, 1 per node, 1 server: the server receives 16 S
    assert comm.parameter_server(1e9, 16, 1, 1, GB) == pytest.approx(2 * (1e-3 + 16.0))
    assert comm.ps_capacity(1e9, 4, GB) == pytest.approx(4.0)  # updates/s


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_worker_counts_below_one_or_not_ints_are_refused(n):
    with pytest.raises(ConfigError, match="workers"):
        comm.ring(1e6, n, GB)


def test_unknown_algorithm_across_nodes_is_refused():
    with pytest.raises(ConfigError, match="across='star'"):
        comm.hierarchical(1e6, 2, 2, GB, GB, across="star")
