"""The published runs :mod:`ddlkit.scale.published` checks, each with its source (pure data).

Sources (every number below is read from them; efficiency = N-GPU images/s / (N x the
1-GPU images/s) where the source gives images/s):

- Horovod's README, first and second benchmark tables (horovod/horovod ``README.md``,
  commits d54e3a88 to 849ef0a6): tf_cnn_benchmarks, batch 64 per GPU, on "4 servers with 4
  Pascal GPUs each connected by RoCE-capable 25 Gbit/s network" (16 GPUs, TCP and RDMA rows
  "allreduce on GPU with NCCL") and "16 servers with 4 Pascal GPUs each connected by plain
  40 Gbit/s network" (64 GPUs, TCP). Each table starts with the "Baseline single-GPU (batch
  size=64)" images/s: the compute of these runs.
- Horovod's scaling charts on the same kind of servers: 128 GPUs (README of commit
  6bb6a2db: 90%, 90%, 79%) and 512 GPUs (docs/benchmarks.rst, from commit 8318a898: 90%,
  90%, 68%), over a "RoCE-capable 25 Gbit/s network" (RDMA assumed: the source does not say it
  was used). Their compute: the 25 Gbit/s table's single-GPU
  rates, the same servers assumed.
- TensorFlow's benchmarks page (tensorflow/docs ``site/en/r1/guide/performance/
  benchmarks.md``, "Details for Amazon EC2 Distributed (NVIDIA Tesla K80)", "Training
  synthetic data" and "Other Results" tables): 8 p2.8xlarge instances (8 K80 GPUs each, one
  10 Gbit/s network), ``variable_update=distributed_replicated`` (each instance sums its
  GPUs' gradients, then a synchronous parameter server; TF's performance guide) with the
  parameter servers on the worker instances: 8 of them, 6 for Inception V3, 4 for ResNet-50
  at batch 32 and ResNet-152. The 1-GPU row of the same tables is the compute.
- Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
  arXiv:1706.02677: ResNet-50, 32 per GPU, 32 Big Basin servers (8 P100, NVLink, 50 Gbit
  Ethernet), "~90% scaling efficiency when moving from 8 to 256 GPUs" (abstract); reduce
  inside the server, recursive halving/doubling between servers (Section 4). No single-GPU
  rate is published for it: FLOPs at half of peak.

Assumed where the sources are silent: Horovod's "Pascal GPUs" are P100 PCIe cards on PCIe
3.0 and NCCL 2 ran a flat ring over all GPUs.

:data:`SERIES` groups the runs of one model on the same servers at several sizes: Horovod's
16-GPU RDMA row with its 128- and 512-GPU charts. These are what a scaling model must follow in
trend, each size within :data:`ddlkit.scale.published.TREND_TOLERANCE`.
"""

from __future__ import annotations

from ddlkit.scale.published import Setup

HOROVOD_16 = "Horovod README (d54e3a88), first table: 4 servers x 4, 16 GPUs"
HOROVOD_64 = "Horovod README (d54e3a88), second table: 16 servers x 4, 64 GPUs"
HOROVOD_128 = "Horovod README (6bb6a2db), 128-GPU Benchmark"
HOROVOD_512 = "Horovod docs/benchmarks.rst, 512-GPU Benchmark"
TF_K80 = "TensorFlow benchmarks page, Amazon EC2 Distributed (K80), 64 GPUs"
GOYAL = "Goyal et al. 2017, arXiv:1706.02677, abstract and Section 4"

# images/s of one GPU at batch 64: the tables' "Baseline single-GPU (batch size=64)" rows
RATE_25G = {"inception_v3": 134.4, "resnet101": 119.4, "vgg16": 130.9}
RATE_40G = {"inception_v3": 148.8, "resnet101": 136.0, "vgg16": 149.6}
RATE_25G_SOURCE = "Horovod README (d54e3a88), 25 Gbit/s servers' single-GPU baseline"
RATE_40G_SOURCE = "Horovod README (d54e3a88), 40 Gbit/s servers' single-GPU baseline"

# where the model is far off, the assumption that would fail
VGG_OVERLAP = (
    "the timeline: VGG-16's dense layers hold 89% of its gradient bytes and are ready first, "
    "so most of them leave during the convolutions' backward pass"
)
TCP_LINE_RATE = (
    "one kernel-TCP connection at most 15 Gbit/s (TCP_STREAM), one figure for every machine "
    "(the same servers over RDMA: the row above)"
)
TCP40_LINE_RATE = "one kernel-TCP connection at most 15 Gbit/s, as with 25 Gbit/s"
NOT_COMMUNICATION = (
    "not communication: Inception V3 sends the fewest bytes of the three and lost the most; "
    "a model without communication misses it too, and the source does not say why"
)


def _eff(total: float, one: float, gpus: int) -> float:
    """Published efficiency from the source's images/s."""
    return total / (gpus * one)


def _horovod(tag: str, n: int, m: str, published: float, source: str, **kw) -> Setup:
    rate, rate_source = (RATE_40G, RATE_40G_SOURCE) if "40" in tag else (RATE_25G, RATE_25G_SOURCE)
    return Setup(
        f"horovod-{n}{tag}-{m}",
        m,
        64,
        "horovod-pascal",
        n,
        1,
        "ring",
        published,
        source,
        rate=rate[m],
        rate_source=rate_source,
        **kw,
    )


def _k80(m: str, batch: int, total: float, one: float, servers: int) -> Setup:
    return Setup(
        f"tf-64-k80-{m}-b{batch}",
        m,
        batch,
        "p2.8xlarge",
        64,
        1,
        "ps",
        _eff(total, one, 64),
        TF_K80,
        rate=one,
        rate_source="TensorFlow benchmarks page, the same table's 1-GPU row",
        servers=servers,
        node_sum=True,
    )


SETUPS = (
    _horovod("", 512, "inception_v3", 0.90, HOROVOD_512),
    _horovod("", 512, "resnet101", 0.90, HOROVOD_512),
    _horovod("", 512, "vgg16", 0.68, HOROVOD_512),
    _horovod("", 128, "inception_v3", 0.90, HOROVOD_128),
    _horovod("", 128, "resnet101", 0.90, HOROVOD_128),
    _horovod("", 128, "vgg16", 0.79, HOROVOD_128),
    _horovod("-rdma", 16, "inception_v3", _eff(2022.6, 134.4, 16), HOROVOD_16),
    _horovod("-rdma", 16, "resnet101", _eff(1746.2, 119.4, 16), HOROVOD_16),
    _horovod("-rdma", 16, "vgg16", _eff(1787.4, 130.9, 16), HOROVOD_16, known_miss=VGG_OVERLAP),
    _horovod("-tcp", 16, "inception_v3", _eff(1990.7, 134.4, 16), HOROVOD_16, inter="25GbE"),
    _horovod("-tcp", 16, "resnet101", _eff(1685.1, 119.4, 16), HOROVOD_16, inter="25GbE"),
    _horovod(
        "-tcp",
        16,
        "vgg16",
        _eff(1308.7, 130.9, 16),
        HOROVOD_16,
        inter="25GbE",
        known_miss=TCP_LINE_RATE,
    ),
    _horovod(
        "-tcp40",
        64,
        "inception_v3",
        _eff(7932.1, 148.8, 64),
        HOROVOD_64,
        inter="40GbE",
        known_miss=NOT_COMMUNICATION,
    ),
    _horovod("-tcp40", 64, "resnet101", _eff(7741.6, 136.0, 64), HOROVOD_64, inter="40GbE"),
    _horovod(
        "-tcp40",
        64,
        "vgg16",
        _eff(6084.2, 149.6, 64),
        HOROVOD_64,
        inter="40GbE",
        known_miss=TCP40_LINE_RATE,
    ),
    _k80("resnet50", 64, 2744, 52.4, 8),
    _k80("resnet50", 32, 2315, 48.4, 4),
    _k80("resnet152", 32, 981, 19.4, 4),
    _k80("inception_v3", 64, 1783, 29.7, 6),
    _k80("inception_v3", 32, 1608, 29.2, 6),
    Setup(
        "goyal-256-resnet50",
        "resnet50",
        32,
        "big-basin",
        256,
        8,
        "hierarchical",
        0.90,
        GOYAL,
        across="halving_doubling",
    ),
)

# the published series: one model on the same servers at several sizes
SERIES = {
    f"horovod-{m}": (f"horovod-16-rdma-{m}", f"horovod-128-{m}", f"horovod-512-{m}")
    for m in ("inception_v3", "resnet101", "vgg16")
}
