"""Pictures of a pipeline: Gantt charts of timelines, and the bubble against the theory.

Each function returns a matplotlib Figure (Jupyter shows it once) and draws
only what it is given: measured timelines from :class:`~ddlkit.parallel.Pipeline`
or ideal ones from :func:`~ddlkit.parallel.schedule.simulate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddlkit.errors import ConfigError
from ddlkit.parallel.schedule import Timeline, theoretical_bubble

COLORS = {"F": "#4C72B0", "B": "#DD8452", "U": "#8C8C8C"}
NAMES = {"F": "forward", "B": "backward", "U": "update"}


def bars(timeline: Timeline, scale: float = 1000.0) -> list[tuple[int, float, float, str, str]]:
    """``(stage, start, width, kind, label)`` of each task, times in ms from the step start (pure).

    ``start`` counts from the first task of the step, so timelines compare side by side.
    """
    t0 = min(t.start for t in timeline.timings)
    return [
        (
            t.task.stage,
            (t.start - t0) * scale,
            t.seconds * scale,
            t.task.kind,
            "" if t.task.kind == "U" else str(t.task.micro_batch),
        )
        for t in timeline.timings
    ]


def draw_timeline(ax: Any, timeline: Timeline, title: str | None = None) -> None:
    """Draw ``timeline`` on the matplotlib axes ``ax``: one row per stage, stage 0 on top."""
    rows = bars(timeline)
    span = timeline.makespan * 1000
    for stage, start, width, kind, label in rows:
        ax.barh(stage, width, left=start, height=0.7, color=COLORS[kind], edgecolor="white")
        if label and width > span / 60:
            ax.text(
                start + width / 2, stage, label, ha="center", va="center", color="white", fontsize=8
            )
    ax.set_yticks(range(timeline.stages), [f"stage {s}" for s in range(timeline.stages)])
    ax.set_ylim(timeline.stages - 0.5, -0.5)
    ax.set_xlabel("ms since the step began")
    kind = "measured" if timeline.measured else "ideal"
    ax.set_title(
        title
        or f"M={timeline.micro_batches}, {kind}: step {span:.0f} ms, bubble "
        f"{timeline.bubble:.0%} (theory {timeline.theoretical_bubble:.0%})",
        fontsize=10,
    )


def plot_timelines(
    timelines: Sequence[Timeline], titles: Sequence[str] | None = None, *, share_time: bool = True
):
    """One Gantt chart per timeline, stacked; ``share_time`` uses one time axis for all."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not timelines:
        raise ConfigError("no timelines to draw. Fix: pass e.g. [pipe.step(x, y).timeline].")
    if titles is not None and len(titles) != len(timelines):
        raise ConfigError(f"{len(titles)} titles for {len(timelines)} timelines. Fix: one each.")
    fig, axes = plt.subplots(
        len(timelines),
        1,
        figsize=(9, 0.6 + 1.1 * sum(t.stages for t in timelines) / 1.4),
        sharex=share_time,
        squeeze=False,
    )
    for i, (ax, timeline) in enumerate(zip(axes[:, 0], timelines, strict=True)):
        draw_timeline(ax, timeline, None if titles is None else titles[i])
    handles = [Patch(color=COLORS[k], label=NAMES[k]) for k in ("F", "B", "U")]
    axes[0, 0].legend(
        handles=handles,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.12),
        fontsize=8,
        ncol=3,
        frameon=False,
    )
    fig.tight_layout()
    plt.close(fig)  # shown by Jupyter's display of the returned figure, once
    return fig


def plot_timeline(timeline: Timeline, title: str | None = None):
    """One Gantt chart."""
    return plot_timelines([timeline], None if title is None else [title])


def plot_bubble(
    stages: int,
    micro_batches: Sequence[int],
    measured: Sequence[float],
    examples_per_sec: Sequence[float] | None = None,
):
    """Measured bubble share against ``(S-1)/(M+S-1)``, and throughput, against M."""
    import matplotlib.pyplot as plt

    if len(measured) != len(micro_batches) or not micro_batches:
        raise ConfigError(
            f"{len(measured)} measured values for {len(micro_batches)} micro-batch counts. "
            f"Fix: one value per count."
        )
    panels = 1 if examples_per_sec is None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.4), squeeze=False)
    ax = axes[0, 0]
    dense = range(1, max(micro_batches) + 1)
    ax.plot(
        list(dense),
        [theoretical_bubble(stages, m) for m in dense],
        "--",
        color="gray",
        label=f"theory (S-1)/(M+S-1), S={stages}",
    )
    ax.plot(micro_batches, measured, "o-", color=COLORS["F"], label="measured")
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("idle share of the step (bubble)")
    ax.set_ylim(0, max(0.6, max(measured) * 1.1))
    ax.set_xticks(list(micro_batches))
    ax.legend(fontsize=8)
    ax.set_title("The bubble shrinks as M grows", fontsize=10)
    if examples_per_sec is not None:
        ax = axes[0, 1]
        ax.plot(micro_batches, examples_per_sec, "o-", color=COLORS["B"])
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel("examples / s")
        ax.set_ylim(0, max(examples_per_sec) * 1.15)
        ax.set_xticks(list(micro_batches))
        ax.set_title("Throughput (same mini-batch, measured)", fontsize=10)
    fig.tight_layout()
    plt.close(fig)
    return fig
