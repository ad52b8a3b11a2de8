"""Machines as they are built: accelerators, the links inside, and every network port (pure).

    dk.scale.node("DGX-H100")        # Hardware: 8 H100, NVLink 4, 8 ports of NDR InfiniBand
    dk.scale.nodes()                 # every preset machine as a table

A node preset is a :class:`~ddlkit.scale.hardware.Hardware` built from the vendor's
description of the machine. What matters for the network terms is how many ports a node
has: a DGX A100 or DGX H100 gives each of its 8 GPUs its own InfiniBand port ("rail"), a
DGX-1 has 4 EDR ports for its 8 GPUs, and a cloud VM of the same GPUs may have one NIC for all
eight. The model assumes every term that leaves a node uses all its ports at once, at most one
per GPU (one ring per rail, as NCCL spreads its rings over a node's NICs), so on a DGX A100 the
hierarchical and inter-node terms get eight times one port's bandwidth. Sources (checked
against the vendor's pages where a copy could be read; the DGX port counts are NVIDIA's user
guides' hardware overviews):

- DGX A100: 8 A100 SXM4 on NVSwitch (NVLink 3, 600 GB/s per GPU both ways), 8 single-port
  ConnectX-6 HDR 200 Gb/s InfiniBand for the compute fabric (NVIDIA DGX A100 User Guide,
  Hardware Overview; the two storage ports are not counted).
- DGX H100: 8 H100 SXM5 on NVSwitch (NVLink 4, 900 GB/s per GPU both ways), 8 ConnectX-7
  NDR 400 Gb/s ports for the compute fabric (NVIDIA DGX H100 User Guide, Hardware Overview).
- p3.16xlarge: 8 V100 joined by NVLink, one 25 Gbit/s network (AWS EC2 P3 instance table).
- p2.8xlarge: 8 K80 GPUs (four boards) on PCIe with peer to peer, one 10 Gbit/s network
  (AWS EC2 P2 instance table; Apache SINGA's benchmark page describes the same machine).
- horovod-pascal: Horovod's benchmark servers, "4 Pascal GPUs each connected by RoCE-capable
  25 Gbit/s network" (Horovod docs/benchmarks.rst); assumed where the source is silent: P100
  PCIe cards on PCIe 3.0, and RDMA over that network.
- big-basin: Facebook's Big Basin server of Goyal et al. 2017 (arXiv:1706.02677, Section 5):
  8 P100 joined by NVLink, 50 Gbit Ethernet.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import GB, Hardware, hardware


@dataclass(frozen=True)
class Node:
    """A preset machine: its hardware and where its description comes from."""

    name: str
    hardware: Hardware
    source: str

    def row(self) -> tuple:
        hw = self.hardware
        return (
            self.name,
            f"{hw.per_node} x {hw.accelerator.name}",
            hw.intra.name,
            f"{hw.nics} x {hw.inter.name}",
            f"{hw.node_link.bandwidth / GB:g}",
            self.source,
        )


NODES = {
    n.name: n
    for n in (
        Node(
            "DGX-A100",
            hardware("A100", per_node=8, intra="NVLink3", inter="IB-HDR", nics=8),
            "NVIDIA DGX A100 User Guide: 8 ConnectX-6 HDR ports",
        ),
        Node(
            "DGX-H100",
            hardware("H100", per_node=8, intra="NVLink4", inter="IB-NDR", nics=8),
            "NVIDIA DGX H100 User Guide: 8 ConnectX-7 NDR ports",
        ),
        Node(
            "p3.16xlarge",
            hardware("V100", per_node=8, intra="NVLink2", inter="25GbE"),
            "AWS EC2 P3: 25 Gbit/s, one network",
        ),
        Node(
            "p2.8xlarge",
            hardware("K80", per_node=8, intra="PCIe3", inter="10GbE"),
            "AWS EC2 P2: 10 Gbit/s, one network",
        ),
        Node(
            "horovod-pascal",
            hardware("P100-PCIe", per_node=4, intra="PCIe3", inter="RoCE-25"),
            "Horovod docs/benchmarks.rst (PCIe cards and RDMA assumed)",
        ),
        Node(
            "big-basin",
            hardware("P100", per_node=8, intra="NVLink1", inter="50GbE"),
            "Goyal et al. 2017, Section 5",
        ),
    )
}


def node(name: str) -> Hardware:
    """The preset machine ``name`` (see :data:`NODES`) as :class:`Hardware`."""
    if name not in NODES:
        raise ConfigError(f"unknown node preset {name!r}. Fix: use one of {', '.join(NODES)}")
    return NODES[name].hardware


@dataclass(frozen=True)
class Nodes:
    """Every preset machine as one table."""

    HEADERS = ("node", "accelerators", "inside", "network ports", "GB/s out of a node", "source")

    def rows(self) -> list[tuple]:
        return [n.row() for n in NODES.values()]

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), "machines as built")

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), "machines as built")


def nodes() -> Nodes:
    return Nodes()
