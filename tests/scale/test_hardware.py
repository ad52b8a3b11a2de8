"""ddlkit.scale.hardware and .nodes: network ports per node, presets as built."""

from __future__ import annotations

import pytest

from ddlkit.scale import NODES, Link, ModelSpec, comm, hardware, network, node, nodes, predict

SPEC = ModelSpec("hand", 1e6, 1e9, 10)  # 4 MB of gradients


def test_a_node_leaves_through_all_its_ports_at_most_one_per_accelerator():
    one = hardware("A100", per_node=8, intra="NVLink3", inter="IB-HDR")
    eight = hardware("A100", per_node=8, intra="NVLink3", inter="IB-HDR", nics=8)
    assert one.node_link.bandwidth == network("IB-HDR").bandwidth == 25e9
    assert eight.node_link.bandwidth == 8 * 25e9
    assert eight.node_link.latency == network("IB-HDR").latency  # more ports, same latency
    assert hardware("V100", per_node=2, nics=4).ports == 2  # a GPU drives one port at a time


def test_the_hierarchical_inter_node_stage_uses_the_node_s_aggregate_bandwidth():
    bus, net = Link("bus", 1e11, 0.0), Link("net", 1e9, 0.0)
    from ddlkit.scale import Accelerator, Hardware

    chip = Accelerator("x", 1e12, 1e9)
    one, four = Hardware(chip, 4, bus, net, nics=1), Hardware(chip, 4, bus, net, nics=4)
    p1 = predict(SPEC, one, 16, "hierarchical", overlap=0.0)
    p4 = predict(SPEC, four, 16, "hierarchical", overlap=0.0)
    inside = comm.ring(4e6, 4, bus)
    # 4 nodes: 2*3/4 * 4 MB through 1 port (1 GB/s) or through 4 (4 GB/s)
    assert p1.communication == pytest.approx(inside + 1.5 * 4e6 / 1e9)
    assert p4.communication == pytest.approx(inside + 1.5 * 4e6 / 4e9)
    # a flat ring across nodes runs one ring per port, each on its share of the bytes
    flat = predict(SPEC, four, 16, "ring", overlap=0.0)
    assert flat.communication == pytest.approx(2 * 15 / 16 * 4e6 / 4e9)


def test_node_presets_are_the_machines_as_built():
    a100, h100 = node("DGX-A100"), node("DGX-H100")
    assert (a100.per_node, a100.nics, a100.inter.name) == (8, 8, "IB-HDR")
    assert (h100.per_node, h100.nics, h100.inter.name) == (8, 8, "IB-NDR")
    assert a100.node_link.bandwidth == 8 * 200e9 / 8  # 8 x 200 Gbit/s
    assert h100.node_link.bandwidth == 8 * 400e9 / 8  # 8 x 400 Gbit/s
    assert node("p3.16xlarge").nics == node("p2.8xlarge").nics == 1  # cloud VMs: one NIC
    assert network("400GbE").bandwidth == network("IB-NDR").bandwidth == 50e9
    assert "<table>" in nodes()._repr_html_() and "DGX-H100" in str(nodes())
    assert all(n.source for n in NODES.values())


def test_eight_ports_cut_the_hierarchical_bandwidth_term_across_nodes_eightfold():
    spec = ModelSpec("big", 1e9, 1e9, 8)  # 4 GB in 60 fused buffers of 64 MiB
    dgx = node("DGX-H100")
    vm = dgx.replace(nics=1)
    t8 = predict(spec, dgx, 64, "hierarchical", overlap=0.0).communication
    t1 = predict(spec, vm, 64, "hierarchical", overlap=0.0).communication
    inside, k = comm.ring(4e9, 8, dgx.intra, 60), 60
    latency = 2 * 7 * dgx.inter.latency * k  # 8 nodes: 14 messages a buffer either way
    assert t1 - inside == pytest.approx(latency + 1.75 * 4e9 / 50e9)
    assert t8 - inside == pytest.approx(latency + 1.75 * 4e9 / 400e9)


def test_a_cluster_you_describe_is_hardware_that_predict_and_curve_take():
    from ddlkit.scale import TCP_STREAM, cluster, curve, model

    mine = cluster("A100", gpus_per_node=8, intra="NVLink3", nics_per_node=4, nic_gbps=200)
    assert (mine.per_node, mine.nics, mine.intra.name) == (8, 4, "NVLink3")
    assert mine.inter.bandwidth == 200e9 / 8 and mine.inter.stream is None
    assert mine.node_link.bandwidth == 4 * 200e9 / 8
    assert mine.accelerator.name == "A100"
    tcp = cluster("V100", gpus_per_node=8, intra="NVLink2", nic_gbps=100, transport="tcp")
    assert tcp.inter.stream == TCP_STREAM and tcp.inter.latency > mine.inter.latency
    spec = model("resnet50", batch=64)
    assert predict(spec, mine, 256).efficiency > predict(spec, tcp, 256).efficiency
    assert len(curve(spec, mine, [1, 8, 64]).points) == 3
    same = cluster("A100", gpus_per_node=8, intra="NVLink3", nics_per_node=8, network="IB-HDR")
    assert same.node_link == node("DGX-A100").node_link


@pytest.mark.parametrize(
    "kwargs, cause",
    [
        (dict(gpus_per_node=0), "gpus_per_node=0"),
        (dict(gpus_per_node=8.0), "gpus_per_node=8.0"),
        (dict(nics_per_node=0), "nics_per_node=0"),
        (dict(nic_gbps=-1), "nic_gbps=-1"),
        (dict(nic_gbps=None), "give the network one way"),
        (dict(network="IB-HDR"), "give the network one way"),
        (dict(transport="udp"), "transport='udp'"),
        (dict(intra="NVLink9"), "unknown network preset 'NVLink9'"),
        (dict(gpu="Z100"), "unknown accelerator preset 'Z100'"),
        (dict(jitter=1.5), "jitter=1.5"),
    ],
)
def test_a_wrong_cluster_is_one_error_naming_the_cause_and_the_fix(kwargs, cause):
    from ddlkit.errors import ConfigError
    from ddlkit.scale import cluster

    args = dict(gpu="A100", gpus_per_node=8, intra="NVLink3", nics_per_node=4, nic_gbps=200)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=cause.replace("(", r"\(")) as err:
        cluster(args.pop("gpu"), **args)
    assert "Fix:" in str(err.value)
