"""Hardware for the scaling model: accelerators, links and the nodes they make (pure).

    dk.scale.hardware("P100-PCIe", per_node=4, intra="PCIe3", inter="RoCE-25")
    dk.scale.hardware("A100", per_node=8, intra="NVLink3", inter="IB-HDR", nics=8)
    dk.scale.gpu("V100")                          # one preset accelerator
    dk.scale.network("IB-HDR")                    # one preset link
    replace(dk.scale.gpu("A100"), sustained_flops=80e12)   # edit a preset: a new object

Every preset is public specification, not measurement:

- accelerators: peak FP32 FLOP/s and memory from NVIDIA's data sheets (Tesla P100, V100,
  A100, H100 SXM); the ``-mixed`` presets use the dense FP16/BF16 tensor-core peak.
  ``sustained_flops`` = :data:`SUSTAINED_SHARE` x peak, one stated assumption for every
  preset: a convolutional network's training step in cuDNN runs at roughly half of peak.
  (A check, not a fit: Goyal et al. 2017, arXiv:1706.02677, Section 4, give 120 ms for
  ResNet-50's backward pass of 32 images on one P100: 2 x 7.7 GFLOP x 32 / 0.12 s =
  4.1 TFLOP/s, 39% of 10.6. Notebook 09 shows the published checks for 0.4-0.6.)
- links: bandwidth is the line rate per direction (Gb/s / 8); latency is a typical
  one-way small-message latency of the transport (RDMA and NVLink a few microseconds,
  kernel TCP tens of microseconds). Bandwidths are upper bounds: real all-reduce buses
  reach 80-95% of them. An NVLink preset is the sum of all of one GPU's links, as if one
  ring edge could use them all: NCCL gets there only with several rings over the links,
  so inside a server the presets are optimistic.
- nodes: ``nics`` is how many network ports of the ``inter`` link a node has (a DGX A100
  has 8 HDR ports, one per GPU; a cloud VM usually one). The model assumes every term that
  crosses the network uses the node's aggregate bandwidth, ``nics x`` the link's, with at most
  one port per accelerator (:attr:`Hardware.node_link`): one ring per port, as NCCL spreads its
  rings over a node's NICs; a library that drives one port at a time gets less. Whole machines
  as built are in :mod:`ddlkit.scale.nodes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError

SUSTAINED_SHARE = 0.5  # sustained / peak FLOP/s, the same for every accelerator preset
GB = 1e9


def _positive(value: float, what: str, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{what}={value!r} is not a finite number. Fix: {fix}")
    if value <= 0:
        raise ConfigError(f"{what}={value!r} must be > 0. Fix: {fix}")
    return float(value)


@dataclass(frozen=True)
class Link:
    """A link: bandwidth in bytes/s per direction, latency in seconds per message."""

    name: str
    bandwidth: float
    latency: float
    note: str = ""

    def __post_init__(self) -> None:
        _positive(self.bandwidth, f"link {self.name!r} bandwidth", "give bytes/s, e.g. 3.125e9")
        if not isinstance(self.latency, int | float) or not 0 <= self.latency < math.inf:
            raise ConfigError(
                f"link {self.name!r} latency={self.latency!r} must be >= 0 seconds. "
                f"Fix: e.g. latency=5e-6"
            )

    def time(self, nbytes: float) -> float:
        """One message of ``nbytes``: ``latency + nbytes / bandwidth``."""
        return self.latency + nbytes / self.bandwidth

    def row(self) -> tuple:
        return (self.name, f"{self.bandwidth / GB:g}", f"{self.latency * 1e6:g}", self.note)


@dataclass(frozen=True)
class Accelerator:
    """One device: sustained FLOP/s of a training step, memory in bytes, peak for reference."""

    name: str
    sustained_flops: float
    memory_bytes: float
    peak_flops: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        _positive(self.sustained_flops, f"{self.name} sustained_flops", "give FLOP/s, e.g. 5e12")
        _positive(self.memory_bytes, f"{self.name} memory_bytes", "give bytes, e.g. 16e9")

    def row(self) -> tuple:
        peak = None if self.peak_flops is None else f"{self.peak_flops / 1e12:g}"
        return (
            self.name,
            f"{self.sustained_flops / 1e12:.3g}",
            peak,
            f"{self.memory_bytes / GB:g}",
            self.note,
        )


def _gpu(name: str, peak_tflops: float, memory_gb: float, note: str) -> Accelerator:
    peak = peak_tflops * 1e12
    return Accelerator(name, SUSTAINED_SHARE * peak, memory_gb * GB, peak, note)


GPUS = {
    g.name: g
    for g in (
        _gpu("K80", 4.37, 12, "one GK210 of a Tesla K80 board (8.73 with GPU Boost), FP32"),
        _gpu("P100-PCIe", 9.3, 16, "Tesla P100 PCIe data sheet, FP32"),
        _gpu("P100", 10.6, 16, "Tesla P100 SXM2 (NVLink) data sheet, FP32"),
        _gpu("V100", 15.7, 32, "Tesla V100 SXM2 data sheet, FP32"),
        _gpu("V100-mixed", 125, 32, "Tesla V100 SXM2, tensor cores FP16"),
        _gpu("A100", 19.5, 80, "A100 SXM4 data sheet, FP32"),
        _gpu("A100-mixed", 312, 80, "A100 SXM4, tensor cores FP16/BF16 dense"),
        _gpu("H100", 67, 80, "H100 SXM5 data sheet, FP32"),
        _gpu("H100-mixed", 989, 80, "H100 SXM5, tensor cores FP16/BF16 dense"),
    )
}

NETWORKS = {
    n.name: n
    for n in (
        Link("1GbE", 1e9 / 8, 50e-6, "Ethernet, kernel TCP"),
        Link("10GbE", 10e9 / 8, 50e-6, "Ethernet, kernel TCP"),
        Link("25GbE", 25e9 / 8, 30e-6, "Ethernet, kernel TCP"),
        Link("40GbE", 40e9 / 8, 30e-6, "Ethernet, kernel TCP"),
        Link("50GbE", 50e9 / 8, 30e-6, "Ethernet, kernel TCP"),
        Link("100GbE", 100e9 / 8, 20e-6, "Ethernet, kernel TCP"),
        Link("400GbE", 400e9 / 8, 20e-6, "Ethernet, kernel TCP (with RDMA: a few us)"),
        Link("RoCE-25", 25e9 / 8, 5e-6, "25 Gb/s Ethernet with RDMA (RoCE)"),
        Link("RoCE-100", 100e9 / 8, 3e-6, "100 Gb/s Ethernet with RDMA (RoCE)"),
        Link("IB-EDR", 100e9 / 8, 1e-6, "InfiniBand EDR 4x, 100 Gb/s"),
        Link("IB-HDR", 200e9 / 8, 1e-6, "InfiniBand HDR 4x, 200 Gb/s"),
        Link("IB-NDR", 400e9 / 8, 1e-6, "InfiniBand NDR 4x, 400 Gb/s"),
        Link("PCIe3", 15.75e9, 5e-6, "PCIe 3.0 x16, GPU to GPU through the host"),
        Link("PCIe4", 31.5e9, 5e-6, "PCIe 4.0 x16"),
        Link("NVLink1", 80e9, 3e-6, "P100: 4 NVLink 1 links x 20 GB/s per direction"),
        Link("NVLink2", 150e9, 3e-6, "V100: 6 NVLink 2 links x 25 GB/s per direction"),
        Link("NVLink3", 300e9, 3e-6, "A100: 12 NVLink 3 links x 25 GB/s per direction"),
        Link("NVLink4", 450e9, 3e-6, "H100: 18 NVLink 4 links x 25 GB/s per direction"),
    )
}


def gpu(name: str) -> Accelerator:
    """The preset accelerator ``name`` (see :data:`GPUS`)."""
    if name not in GPUS:
        raise ConfigError(f"unknown accelerator preset {name!r}. Fix: use one of {', '.join(GPUS)}")
    return GPUS[name]


def network(name: str) -> Link:
    """The preset link ``name`` (see :data:`NETWORKS`)."""
    if name not in NETWORKS:
        raise ConfigError(f"unknown network preset {name!r}. Fix: use one of {', '.join(NETWORKS)}")
    return NETWORKS[name]


@dataclass(frozen=True)
class Hardware:
    """Identical nodes of ``per_node`` accelerators: ``intra`` joins them, ``inter`` the
    nodes, through ``nics`` network ports per node."""

    accelerator: Accelerator
    per_node: int
    intra: Link
    inter: Link
    nics: int = 1

    def __post_init__(self) -> None:
        for what, example in (("per_node", 4), ("nics", 1)):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{what}={value!r} must be an int >= 1. Fix: e.g. {what}={example}"
                )

    def nodes(self, workers: int) -> int:
        """Nodes that ``workers`` accelerators fill (the last one may be partly used)."""
        return -(-workers // self.per_node)

    @property
    def ports(self) -> int:
        """Network ports a node's accelerators can use at once: one each at most."""
        return min(self.nics, self.per_node)

    @property
    def node_link(self) -> Link:
        """The node's way out: ``inter`` with the bandwidth of all its usable ports."""
        if self.ports == 1:
            return self.inter
        return replace(
            self.inter,
            name=f"{self.ports} x {self.inter.name}",
            bandwidth=self.ports * self.inter.bandwidth,
        )

    def replace(self, **changes) -> Hardware:
        """A copy with fields changed (the presets stay as they are)."""
        return replace(self, **changes)

    HEADERS = ("part", "what", "value")

    def rows(self) -> list[tuple]:
        a = self.accelerator
        return [
            ("accelerator", a.name, f"{a.sustained_flops / 1e12:.3g} TFLOP/s sustained"),
            ("", "memory", f"{a.memory_bytes / GB:g} GB"),
            ("node", "accelerators per node", self.per_node),
            ("intra-node", self.intra.name, _link_text(self.intra)),
            ("inter-node", self.inter.name, _link_text(self.inter)),
            ("", "network ports per node", f"{self.nics} ({_link_text(self.node_link)} in all)"),
        ]

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), "hardware of the scaling model")

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows())


def _link_text(link: Link) -> str:
    return f"{link.bandwidth / GB:g} GB/s, {link.latency * 1e6:g} us"


def _pick(value, lookup):
    return lookup(value) if isinstance(value, str) else value


def hardware(
    accelerator: str | Accelerator,
    *,
    per_node: int = 1,
    intra: str | Link = "PCIe3",
    inter: str | Link = "25GbE",
    nics: int = 1,
) -> Hardware:
    """Nodes of ``per_node`` accelerators with ``nics`` ports of ``inter``; presets by name
    or your own objects."""
    return Hardware(
        _pick(accelerator, gpu),
        per_node,
        _pick(intra, network),
        _pick(inter, network),
        nics,
    )


@dataclass(frozen=True)
class Presets:
    """All presets as two tables (accelerators, links)."""

    def _repr_html_(self) -> str:
        gpus = html_table(
            ("accelerator", "sustained TFLOP/s", "peak TFLOP/s", "memory GB", "source"),
            [g.row() for g in GPUS.values()],
            f"sustained = {SUSTAINED_SHARE} x peak for every preset",
        )
        links = html_table(
            ("link", "GB/s per direction", "latency us", "what"),
            [n.row() for n in NETWORKS.values()],
            "line rates; latencies typical of the transport",
        )
        return gpus + links


def presets() -> Presets:
    return Presets()
