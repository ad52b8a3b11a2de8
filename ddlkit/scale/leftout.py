"""What the model leaves out, and how far each can move a prediction: computed, not guessed.

    s = dk.scale.sensitivity(dk.scale.model("vgg16"), hw, 512)
    s                      # a table: each left-out effect at its two ends, and the efficiency
    s.low, s.high          # the range of the efficiency over all of them

The timeline (:mod:`ddlkit.scale.timeline`) computes the overlap from when each gradient is
ready, but not how well the all-reduce runs beside the backward pass (its kernels and copies
take the GPU's memory bandwidth and its PCIe link); it takes one jitter for every worker, and
the network at one achieved share of its line rate, as if no other job or flow shared it. Each
row re-predicts with one of these at an end of its plausible range:

- **overlap**: none (every gradient ready only at the end of the backward pass, as
  MultiWorkerMirroredStrategy's one pack after it) and perfect (every gradient ready at its
  start, the ideal pipeline);
- **stragglers**: no jitter, and twice :data:`~ddlkit.scale.hardware.STEP_JITTER`;
- **congestion**: the network between nodes at half its achieved bandwidth (each link shared
  with one other flow), and at its full line rate;
- **Horovod's cycle**: 1 ms, the default of Horovod 0.28 (``BackgroundThreadLoop`` in
  ``horovod/common/operations.cc``), instead of the 5 ms of the published runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddlkit._tables import html_table, text_table
from ddlkit.scale.hardware import BANDWIDTH_SHARE, Hardware
from ddlkit.scale.models import ModelSpec
from ddlkit.scale.predict import Algorithm, Prediction, algorithm_of, predict

CONGESTED = 0.5  # share of the achieved bandwidth left to one flow on a shared link


@dataclass(frozen=True)
class Variant:
    effect: str
    how: str
    prediction: Prediction


@dataclass(frozen=True)
class Sensitivity:
    """The model's prediction, and each left-out effect at the ends of its range."""

    base: Prediction
    variants: tuple[Variant, ...]

    @property
    def low(self) -> float:
        return min(v.prediction.efficiency for v in self.variants)

    @property
    def high(self) -> float:
        return max(v.prediction.efficiency for v in self.variants)

    def moves(self, effect: str) -> tuple[float, float]:
        """The lowest and highest efficiency of one effect's rows."""
        effs = [v.prediction.efficiency for v in self.variants if v.effect == effect]
        if not effs:
            known = sorted({v.effect for v in self.variants})
            raise KeyError(f"no effect {effect!r}; known: {known}")
        return min(effs), max(effs)

    HEADERS = ("left out", "re-predicted with", "efficiency", "change (points)")

    def rows(self) -> list[tuple]:
        base = self.base.efficiency
        rows = [("(the model)", "as it stands", f"{base:.1%}", "")]
        for v in self.variants:
            e = v.prediction.efficiency
            rows.append((v.effect, v.how, f"{e:.1%}", f"{(e - base) * 100:+.1f}"))
        return rows

    def caption(self) -> str:
        p = self.base
        return (
            f"{p.model.name} on {p.workers} x {p.hardware.accelerator.name}: "
            f"{self.base.efficiency:.0%} predicted, {self.low:.0%} to {self.high:.0%} "
            f"as the left-out effects go"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def _ready_at(model: ModelSpec, share: float) -> ModelSpec:
    """The same gradients, all ready at ``share`` of the backward pass."""
    return replace(model, gradients=tuple((share, b, t) for _, b, t in model.profile()))


def _network(hardware: Hardware, factor: float, stream: bool = True) -> Hardware:
    """The network between nodes ``factor`` times as fast (its TCP connection too, if
    ``stream``)."""
    link = hardware.inter
    stream = link.stream * factor if stream and link.stream is not None else link.stream
    return hardware.replace(inter=replace(link, bandwidth=link.bandwidth * factor, stream=stream))


def sensitivity(
    model: ModelSpec,
    hardware: Hardware,
    workers: int,
    algorithm: str | Algorithm = "ring",
    **options,
) -> Sensitivity:
    """Re-predict ``workers`` with each left-out effect at both ends (pure)."""
    algo = algorithm_of(algorithm, **options)
    if not algo.timeline:
        algo = replace(algo, overlap=None)

    def run(m=model, hw=hardware, a=algo) -> Prediction:
        return predict(m, hw, workers, a)

    jitter = hardware.jitter
    variants = (
        Variant("overlap", "none: every gradient ready at the end", run(m=_ready_at(model, 1.0))),
        Variant("overlap", "perfect: every gradient ready at the start", run(_ready_at(model, 0))),
        Variant("stragglers", "no jitter", run(hw=hardware.replace(jitter=0.0))),
        Variant(
            "stragglers",
            f"jitter {2 * jitter:.0%} (twice)",
            run(hw=hardware.replace(jitter=min(0.99, 2 * jitter))),
        ),
        Variant(
            "congestion",
            f"network at {CONGESTED:.0%} of its achieved bandwidth",
            run(hw=_network(hardware, CONGESTED)),
        ),
        Variant(
            "congestion",
            "network at line rate",
            run(hw=_network(hardware, 1 / BANDWIDTH_SHARE, stream=False)),
        ),
        Variant("Horovod's cycle", "1 ms (Horovod 0.28)", run(a=replace(algo, cycle_time=1e-3))),
    )
    return Sensitivity(run(), variants)
