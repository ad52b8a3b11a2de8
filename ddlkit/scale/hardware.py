"""Hardware for the scaling model: accelerators, links and the nodes they make (pure).

    dk.scale.hardware("P100-PCIe", per_node=4, intra="PCIe3", inter="RoCE-25")
    dk.scale.hardware("A100", per_node=8, intra="NVLink3", inter="IB-HDR", nics=8)
    dk.scale.gpu("V100")                          # one preset accelerator
    dk.scale.network("IB-HDR")                    # one preset link
    replace(dk.scale.gpu("A100"), sustained_flops=80e12)   # edit a preset: a new object
    dk.scale.cluster("A100", gpus_per_node=8, intra="NVLink3", nics_per_node=4, nic_gbps=200)

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
  kernel TCP tens of microseconds). Bandwidths are upper bounds: the step's timeline
  (:mod:`ddlkit.scale.timeline`) moves an all-reduce's bytes at :data:`BANDWIDTH_SHARE` of
  them, an assumption (real all-reduce buses reach 80-95% of line rate), and a kernel-TCP
  preset's ``stream`` caps one connection at :data:`TCP_STREAM`, an assumption too: NCCL's
  socket transport moves a connection through one socket and one CPU thread unless
  ``NCCL_SOCKET_NTHREADS`` and ``NCCL_NSOCKS_PERTHREAD`` say otherwise (NCCL's
  environment-variable documentation), and Horovod's TCP rows are only matched with about
  15 Gbit/s a connection. An NVLink preset is the sum of all of one GPU's links, as if one
  ring edge could use them all: NCCL gets there only with several rings over the links,
  so inside a server the presets are optimistic.
- jitter: :data:`STEP_JITTER`, how much one worker's compute varies from step to step
  (standard deviation / mean), an assumption for every machine; a synchronous step waits for
  the slowest of its workers (:func:`ddlkit.scale.predict.expected_max`).
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
# Assumptions of the step's timeline (ddlkit.scale.timeline), one value for every machine. They
# are the model's free figures: each was picked within its plausible range (0.8-0.9 of line rate,
# 2-3% jitter, 10-20 Gbit/s a TCP connection) with the published runs in view, and
# dk.scale.sensitivity shows how far each moves a prediction.
BANDWIDTH_SHARE = 0.85  # an all-reduce's bytes move at this share of a link's line rate
TCP_STREAM = 15e9 / 8  # bytes/s one kernel-TCP connection reaches (one socket, one core)
STEP_JITTER = 0.03  # a worker's compute time varies by this share (standard deviation)
GB = 1e9


def _positive(value: float, what: str, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{what}={value!r} is not a finite number. Fix: {fix}")
    if value <= 0:
        raise ConfigError(f"{what}={value!r} must be > 0. Fix: {fix}")
    return float(value)


@dataclass(frozen=True)
class Link:
    """A link: bandwidth in bytes/s per direction, latency in seconds per message; ``stream``:
    the most one connection carries (kernel TCP), ``None`` for line rate (RDMA, NVLink)."""

    name: str
    bandwidth: float
    latency: float
    note: str = ""
    stream: float | None = None

    def __post_init__(self) -> None:
        _positive(self.bandwidth, f"link {self.name!r} bandwidth", "give bytes/s, e.g. 3.125e9")
        if self.stream is not None:
            _positive(self.stream, f"link {self.name!r} stream", "give bytes/s, or None")
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
        Link("1GbE", 1e9 / 8, 50e-6, "Ethernet, kernel TCP", TCP_STREAM),
        Link("10GbE", 10e9 / 8, 50e-6, "Ethernet, kernel TCP", TCP_STREAM),
        Link("25GbE", 25e9 / 8, 30e-6, "Ethernet, kernel TCP", TCP_STREAM),
        Link("40GbE", 40e9 / 8, 30e-6, "Ethernet, kernel TCP", TCP_STREAM),
        Link("50GbE", 50e9 / 8, 30e-6, "Ethernet, kernel TCP", TCP_STREAM),
        Link("100GbE", 100e9 / 8, 20e-6, "Ethernet, kernel TCP", TCP_STREAM),
        Link("400GbE", 400e9 / 8, 20e-6, "Ethernet, kernel TCP (with RDMA: a few us)", TCP_STREAM),
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
    nodes, through ``nics`` network ports per node. ``jitter``: how much one worker's compute
    time varies from step to step (standard deviation / mean); a synchronous step waits for
    the slowest of its workers."""

    accelerator: Accelerator
    per_node: int
    intra: Link
    inter: Link
    nics: int = 1
    jitter: float = STEP_JITTER

    def __post_init__(self) -> None:
        for what, example in (("per_node", 4), ("nics", 1)):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{what}={value!r} must be an int >= 1. Fix: e.g. {what}={example}"
                )
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter < 1
        ):
            raise ConfigError(
                f"jitter={self.jitter!r} must be a share in [0, 1). Fix: e.g. jitter=0.03"
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
            ("step", "compute jitter", f"{self.jitter:.0%} (standard deviation / mean)"),
        ]

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), "hardware of the scaling model")

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows())


def _link_text(link: Link) -> str:
    out = f"{link.bandwidth / GB:g} GB/s, {link.latency * 1e6:g} us"
    if link.stream is not None:
        out += f", one connection at most {link.stream / GB:g} GB/s"
    return out


def _pick(value, lookup):
    return lookup(value) if isinstance(value, str) else value


def hardware(
    accelerator: str | Accelerator,
    *,
    per_node: int = 1,
    intra: str | Link = "PCIe3",
    inter: str | Link = "25GbE",
    nics: int = 1,
    jitter: float = STEP_JITTER,
) -> Hardware:
    """Nodes of ``per_node`` accelerators with ``nics`` ports of ``inter``; presets by name
    or your own objects (:func:`cluster` builds the network from a port's speed)."""
    return Hardware(
        _pick(accelerator, gpu),
        per_node,
        _pick(intra, network),
        _pick(inter, network),
        nics,
        jitter,
    )


NIC_LATENCY = {"rdma": 3e-6, "tcp": 30e-6}  # s a message: the presets' RoCE-100 and 25-50GbE


def _count(value, what: str, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}={value!r} must be an int >= 1. Fix: e.g. {what}={example}")
    return value


def cluster(
    gpu: str | Accelerator,
    *,
    gpus_per_node: int,
    intra: str | Link,
    nics_per_node: int = 1,
    nic_gbps: float | None = None,
    transport: str = "rdma",
    network: str | Link | None = None,
    jitter: float = STEP_JITTER,
) -> Hardware:
    """A cluster you describe: ``gpus_per_node`` of ``gpu`` joined by ``intra``, and
    ``nics_per_node`` network ports of ``nic_gbps`` Gbit/s each over ``transport`` ("rdma":
    InfiniBand or RoCE, a few microseconds a message, line rate; "tcp": kernel sockets, tens of
    microseconds, one connection at most :data:`TCP_STREAM`), or of a preset ``network``.

        dk.scale.cluster("A100", gpus_per_node=8, intra="NVLink3", nics_per_node=4, nic_gbps=200)

    Returns the :class:`Hardware` that :func:`~ddlkit.scale.predict` and
    :func:`~ddlkit.scale.curve` take. Wrong input is one ConfigError naming it and the fix.
    """
    chip = gpu if isinstance(gpu, Accelerator) else _preset_gpu(gpu)
    per_node = _count(gpus_per_node, "gpus_per_node", 8)
    ports = _count(nics_per_node, "nics_per_node", 4)
    inside = intra if isinstance(intra, Link) else _preset_network(intra)
    if (nic_gbps is None) == (network is None):
        raise ConfigError(
            f"give the network one way: nic_gbps={nic_gbps!r}, network={network!r}. "
            f"Fix: nic_gbps=200 (with transport='rdma' or 'tcp'), or network='IB-HDR'"
        )
    if network is not None:
        out = network if isinstance(network, Link) else _preset_network(network)
    else:
        if transport not in NIC_LATENCY:
            raise ConfigError(
                f"transport={transport!r} is not 'rdma' or 'tcp'. Fix: transport='rdma' for "
                f"InfiniBand or RoCE, 'tcp' for plain Ethernet"
            )
        gbps = _positive(nic_gbps, "nic_gbps", "the speed of one port in Gbit/s, e.g. 200")
        out = Link(
            f"{gbps:g}G-{transport}",
            gbps * 1e9 / 8,
            NIC_LATENCY[transport],
            f"{gbps:g} Gbit/s, {transport.upper()} (described with dk.scale.cluster)",
            TCP_STREAM if transport == "tcp" else None,
        )
    return Hardware(chip, per_node, inside, out, ports, jitter)


_preset_gpu, _preset_network = gpu, network


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
