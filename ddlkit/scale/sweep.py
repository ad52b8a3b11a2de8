"""Efficiency and throughput against worker count, and where communication takes over.

c = dk.scale.curve(spec, hw, workers=dk.scale.powers_of_two(1024), algorithm="ring")
c                   # a table, every few worker counts
c.dominates_at      # the first N whose exposed communication >= compute (None: never)
c.plot(published=dk.scale.published.SETUPS)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import Hardware
from ddlkit.scale.models import ModelSpec
from ddlkit.scale.predict import Algorithm, Prediction, predict


def powers_of_two(top: int = 1024) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``top``."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"top={top!r} must be an int >= 1. Fix: e.g. powers_of_two(1024)")
    out, n = [], 1
    while n <= top:
        out.append(n)
        n *= 2
    return tuple(out)


@dataclass(frozen=True)
class Curve:
    """Predictions for one model, hardware and algorithm over several worker counts."""

    points: tuple[Prediction, ...]
    label: str = ""

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(p.workers for p in self.points)

    @property
    def efficiency(self) -> tuple[float, ...]:
        return tuple(p.efficiency for p in self.points)

    @property
    def throughput(self) -> tuple[float, ...]:
        return tuple(p.throughput for p in self.points)

    @property
    def dominates_at(self) -> int | None:
        """The first worker count whose exposed communication is at least its compute
        (efficiency <= 50%); None when no point reaches it."""
        for p in self.points:
            if p.exposed >= p.compute:
                return p.workers
        return None

    HEADERS = (
        "workers",
        "compute ms",
        "communication ms",
        "exposed ms",
        "step ms",
        "examples/s",
        "speed-up",
        "efficiency",
    )

    def rows(self) -> list[tuple]:
        return [
            (
                p.workers,
                f"{p.compute * 1e3:.1f}",
                f"{p.communication * 1e3:.1f}",
                f"{p.exposed * 1e3:.1f}",
                f"{p.step * 1e3:.1f}",
                f"{p.throughput:,.0f}",
                f"{p.speedup:.1f}",
                f"{p.efficiency:.1%}",
            )
            for p in self.points
        ]

    def caption(self) -> str:
        where = self.dominates_at
        tail = (
            f"communication >= compute from {where} workers"
            if where
            else "communication stays below compute at every point"
        )
        return f"{self.label}: {tail}"

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())

    def plot(self, axes=None, *, published: Iterable = ()):
        """Efficiency (left) and throughput (right, dotted: linear from one worker) against
        workers, log x; ``published``: :class:`~ddlkit.scale.published.Check` objects drawn
        as stars in the curve's colour."""
        import matplotlib.pyplot as plt

        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(11, 4))
        eff_ax, thr_ax = axes
        (line,) = eff_ax.plot(
            self.workers, [e * 100 for e in self.efficiency], "o-", label=self.label
        )
        thr_ax.plot(self.workers, self.throughput, "o-", color=line.get_color(), label=self.label)
        linear = [n * self.points[0].throughput for n in self.workers]
        thr_ax.plot(self.workers, linear, ":", color=line.get_color())
        for check in published:  # stars in the curve's colour, labelled with the figure
            s = check.setup
            eff_ax.plot(
                [s.workers],
                [s.published * 100],
                "*",
                color=line.get_color(),
                markeredgecolor="black",
                markersize=13,
            )
            eff_ax.annotate(
                f"{s.published:.0%} published",
                (s.workers, s.published * 100),
                fontsize=7,
                xytext=(6, -3),
                textcoords="offset points",
            )
        if self.dominates_at:
            eff_ax.axvline(self.dominates_at, color="red", ls="--", lw=1)
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("workers")
            ax.legend(fontsize=7)
        eff_ax.set_ylabel("scaling efficiency (%)")
        eff_ax.set_ylim(0, 105)
        thr_ax.set_yscale("log")
        thr_ax.set_ylabel("examples / s")
        return axes


def curve(
    model: ModelSpec,
    hardware: Hardware,
    workers: Sequence[int] = powers_of_two(1024),
    algorithm: str | Algorithm = "ring",
    *,
    label: str | None = None,
    **options,
) -> Curve:
    """:func:`~ddlkit.scale.predict.predict` at every worker count (pure)."""
    if not workers:
        raise ConfigError("workers is empty. Fix: e.g. workers=powers_of_two(1024)")
    points = tuple(predict(model, hardware, n, algorithm, **options) for n in workers)
    name = label or f"{model.name} on {hardware.accelerator.name}, {points[0].algorithm.label()}"
    return Curve(points, name)
