"""Published data-parallel scaling results, and what the model predicts for each (pure).

    dk.scale.published.check()        # predicted vs published efficiency, one table

Each setup is described by public specifications only (accelerator, GPUs per server,
links, model size, batch per GPU, the algorithm the paper says it ran) and predicted with
the model's one set of assumptions (:data:`ddlkit.scale.hardware.SUSTAINED_SHARE` = 0.5
of peak, overlap 0.5, 64 MiB fusion buffers, fp32 gradients, line-rate bandwidth); no
setup has a correction factor of its own. Efficiency is measured against the published
baseline: 1 GPU for Horovod's runs, one 8-GPU server for Goyal et al.

Sources:

- Horovod, 128 servers x 4 Pascal GPUs, RoCE-capable 25 Gbit/s: 90% (Inception V3),
  90% (ResNet-101), 68% (VGG-16). Horovod documentation, docs/benchmarks.rst ("512-GPU
  Benchmark") and README; the system is described in Sergeev & Del Balso 2018,
  "Horovod: fast and easy distributed deep learning in TensorFlow", arXiv:1802.05799.
  tf_cnn_benchmarks with ``--batch_size 64`` per GPU (the same page's command).
- Horovod, 32 servers x 4 Pascal GPUs, same network: 90%, 90%, 79% (Horovod's README and
  docs/benchmarks.md of October 2017, "128-GPU Benchmark").
- Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
  arXiv:1706.02677: ResNet-50, 32 per GPU, 32 Big Basin servers of 8 P100 (NVLink) with
  50 Gbit Ethernet; "~90% scaling efficiency when moving from 8 to 256 GPUs" (abstract);
  all-reduce within a server, recursive halving/doubling between servers, then a
  broadcast within the server (Section 4, Communication).

Assumed where the source is silent: Horovod's "Pascal GPUs" in 4-GPU servers are P100
PCIe cards joined by PCIe 3.0; NCCL 2 of 2017 ran a flat ring over all GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import hardware
from ddlkit.scale.models import model
from ddlkit.scale.predict import DEFAULT_OVERLAP, predict

TOLERANCE = 0.10  # 10 percentage points of efficiency

HOROVOD_512 = "Horovod docs/benchmarks.rst, 512-GPU Benchmark (Sergeev & Del Balso 2018)"
HOROVOD_128 = "Horovod README / docs/benchmarks.md (Oct 2017), 128-GPU Benchmark"
GOYAL = "Goyal et al. 2017, arXiv:1706.02677, abstract and Section 4"

VGG_MISS = (
    "compute from FLOPs at one sustained rate fails: VGG-16's large 3x3 convolutions "
    "run at about twice ResNet's FLOP rate in cuDNN (jcjohnson/cnn-benchmarks, GTX 1080: "
    "VGG-16 does 2x ResNet-101's FLOPs in the same 233-235 ms), so the model's VGG-16 step "
    "is too long and communication's share too small"
)


@dataclass(frozen=True)
class Setup:
    """A published run, in public specifications, and its published efficiency."""

    key: str
    model: str
    batch: int
    accelerator: str
    per_node: int
    intra: str
    inter: str
    workers: int
    base: int  # the workers the published efficiency is measured against
    algorithm: str
    across: str
    published: float
    source: str
    known_miss: str = ""  # which assumption fails, where the model misses

    def __post_init__(self) -> None:
        if not 0 < self.published <= 1:
            raise ConfigError(
                f"setup {self.key!r}: published={self.published!r} is not an efficiency in "
                f"(0, 1]. Fix: e.g. published=0.9 for 90%"
            )
        if not 1 <= self.base <= self.workers:
            raise ConfigError(
                f"setup {self.key!r}: base={self.base}, workers={self.workers}: need "
                f"1 <= base <= workers. Fix: base = the workers the paper compares with"
            )

    def efficiency(self, *, overlap: float = DEFAULT_OVERLAP, share: float | None = None) -> float:
        """Predicted efficiency against the same baseline as the published one
        (``share``: sustained / peak FLOP/s instead of the presets')."""
        hw = hardware(self.accelerator, per_node=self.per_node, intra=self.intra, inter=self.inter)
        if share is not None:
            chip = hw.accelerator
            hw = hw.replace(accelerator=replace(chip, sustained_flops=share * chip.peak_flops))
        spec = model(self.model, batch=self.batch)
        options = {"across": self.across, "overlap": overlap}
        run = predict(spec, hw, self.workers, self.algorithm, **options)
        base = predict(spec, hw, self.base, self.algorithm, **options)
        return run.throughput / base.throughput * self.base / self.workers


def _horovod(n: int, m: str, published: float, source: str, miss: str = "") -> Setup:
    return Setup(
        f"horovod-{n}-{m}",
        m,
        64,
        "P100-PCIe",
        4,
        "PCIe3",
        "RoCE-25",
        n,
        1,
        "ring",
        "ring",
        published,
        source,
        miss,
    )


SETUPS = (
    _horovod(512, "inception_v3", 0.90, HOROVOD_512),
    _horovod(512, "resnet101", 0.90, HOROVOD_512),
    _horovod(512, "vgg16", 0.68, HOROVOD_512, VGG_MISS),
    _horovod(128, "inception_v3", 0.90, HOROVOD_128),
    _horovod(128, "resnet101", 0.90, HOROVOD_128),
    _horovod(128, "vgg16", 0.79, HOROVOD_128, VGG_MISS),
    Setup(
        "goyal-256-resnet50",
        "resnet50",
        32,
        "P100",
        8,
        "NVLink1",
        "50GbE",
        256,
        8,
        "hierarchical",
        "halving_doubling",
        0.90,
        GOYAL,
    ),
)


@dataclass(frozen=True)
class Check:
    setup: Setup
    predicted: float

    @property
    def difference(self) -> float:
        return self.predicted - self.setup.published

    @property
    def within(self) -> bool:
        return abs(self.difference) <= TOLERANCE


@dataclass(frozen=True)
class Checks:
    """Predicted against published efficiency for every setup in :data:`SETUPS`."""

    checks: tuple[Check, ...]

    def __iter__(self):
        return iter(self.checks)

    def __getitem__(self, key: str) -> Check:
        for c in self.checks:
            if c.setup.key == key:
                return c
        raise KeyError(f"no published setup {key!r}; known: {[c.setup.key for c in self]}")

    HEADERS = (
        "setup",
        "GPUs",
        "network",
        "published",
        "predicted",
        "difference",
        f"within {TOLERANCE:.0%}",
        "where it misses, the assumption that fails",
        "source",
    )

    def rows(self) -> list[tuple]:
        return [
            (
                c.setup.key,
                f"{c.setup.workers} ({c.setup.per_node}/server)",
                c.setup.inter,
                f"{c.setup.published:.0%}",
                f"{c.predicted:.1%}",
                f"{c.difference * 100:+.1f} pp",
                "yes" if c.within else "no",
                "" if c.within else c.setup.known_miss,
                c.setup.source,
            )
            for c in self
        ]

    def caption(self) -> str:
        hits = sum(c.within for c in self)
        return (
            f"{hits} of {len(self.checks)} published efficiencies predicted within "
            f"{TOLERANCE * 100:.0f} points, one set of assumptions for all"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def check(setups: tuple[Setup, ...] = SETUPS) -> Checks:
    """Predict every setup (pure)."""
    return Checks(tuple(Check(s, s.efficiency()) for s in setups))


@dataclass(frozen=True)
class Sensitivity:
    """Predicted efficiency of every setup as the two assumptions change."""

    grid: tuple[tuple[float, float], ...]  # (share, overlap)
    table: tuple[tuple[Setup, tuple[float, ...]], ...]

    def hits(self) -> tuple[int, ...]:
        """Setups within the tolerance, for each (share, overlap)."""
        return tuple(
            sum(abs(effs[i] - s.published) <= TOLERANCE for s, effs in self.table)
            for i in range(len(self.grid))
        )

    def _repr_html_(self) -> str:
        heads = ("setup", "published") + tuple(f"share {a:g}, overlap {o:g}" for a, o in self.grid)
        rows = [
            (s.key, f"{s.published:.0%}", *(f"{e:.0%}" for e in effs)) for s, effs in self.table
        ]
        rows.append(("within 10 points", "", *self.hits()))
        return html_table(heads, rows, "predicted efficiency as the assumptions change")


def sensitivity(
    shares: tuple[float, ...] = (0.4, 0.5, 0.6),
    overlaps: tuple[float, ...] = (0.0, 0.5, 1.0),
    setups: tuple[Setup, ...] = SETUPS,
) -> Sensitivity:
    """Every setup under every (sustained share, overlap) pair (pure)."""
    grid = tuple((a, o) for a in shares for o in overlaps)
    table = tuple((s, tuple(s.efficiency(overlap=o, share=a) for a, o in grid)) for s in setups)
    return Sensitivity(grid, table)
