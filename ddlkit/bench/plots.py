"""A strategy benchmark at a glance: throughput, scaling efficiency, time to accuracy.

Each function takes a :class:`~ddlkit.bench.results.BenchResults` (``load_results``) and
returns a matplotlib Figure (Jupyter shows it once), or draws into ``ax`` when given one.
Cases that were skipped or failed are written on the chart, not dropped silently.
A chart shows the cases of one architecture (``arch``, default the file's first: the CNN);
a benchmark with ``--resnet`` draws the small ResNet's in charts of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlkit.bench.config import describe
from ddlkit.bench.results import BenchResults, CaseSummary

# Horovod's README: 128 servers with 4 Pascal GPUs each, 25 Gbit/s RoCE network.
HOROVOD_PUBLISHED = 0.90
HOROVOD_LABEL = "Horovod's published 90% (Inception V3, ResNet-101; 512 GPUs, 25 Gbit/s RoCE)"
STRATEGY_COLOURS = tuple(f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown"))
WORKER_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def _axes(ax: Any, size: tuple[float, float]):
    if ax is not None:
        return ax.figure, ax
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size, layout="constrained")
    plt.close(fig)  # shown by Jupyter's display of the returned figure, once
    return fig, ax


def _short(name: str) -> str:
    return name.replace("parameter_server", "param_server")


def _unmeasured_notes(cases: list[CaseSummary]) -> str:
    notes = []
    for c in cases:
        if c.skipped:
            notes.append(f"{c.name}: skipped")
        elif c.error:
            notes.append(f"{c.name}: failed")
        elif c.throughput is None:
            notes.append(f"{c.name}: not run")
    return "; ".join(notes)


def _one_arch(res: BenchResults, arch: str | None) -> tuple[BenchResults, str]:
    """The results of `arch` (default the first), and a title suffix naming the model
    when the file holds more than one."""
    arch = arch or res.archs[0]
    one = res.of_arch(arch)
    if len(res.archs) == 1:
        return one, ""
    return one, f" ({describe(one.cases[0].model, arch)})"


def _note(ax: Any, text: str) -> None:
    if text:
        ax.text(
            0.01, 0.98, text, transform=ax.transAxes, va="top", ha="left", fontsize=8, color="0.3"
        )


def throughput(res: BenchResults, ax: Any = None, *, arch: str | None = None):
    """Examples/s per strategy (groups) and worker count (colours), median of the repeats
    with min-max whiskers, and one device without a strategy as a dashed line."""
    fig, ax = _axes(ax, (9, 4.2))
    res, about = _one_arch(res, arch)
    strategies = res.strategies
    counts = res.worker_counts
    width = 0.8 / max(len(counts), 1)
    for k, n in enumerate(counts):
        xs, heights, low, high = [], [], [], []
        for g, strategy in enumerate(strategies):
            group = [c.workers for c in res.cases if c.strategy == strategy]
            case = next((c for c in res.measured if (c.strategy, c.workers) == (strategy, n)), None)
            if case is None:
                continue
            slot = group.index(n) - (len(group) - 1) / 2  # bars centred on their group
            xs.append(g + slot * width)
            rate = case.throughput
            heights.append(rate.median)
            low.append(rate.median - rate.min)
            high.append(rate.max - rate.median)
        if not xs:
            continue
        bars = ax.bar(
            xs,
            heights,
            width * 0.95,
            yerr=[low, high],
            capsize=3,
            color=WORKER_COLOURS[k % len(WORKER_COLOURS)],
            label=f"{n} worker{'s' if n > 1 else ''}",
        )
        ax.bar_label(bars, fmt="{:,.0f}", label_type="center", fontsize=8, color="white")
    single = res.single
    if single is not None:
        ax.axhline(
            single.throughput.median,
            color="0.3",
            linestyle="--",
            linewidth=1,
            label="one device, no strategy (single-x1)",
        )
    ax.set_xticks(range(len(strategies)), [_short(s) for s in strategies])
    ax.set_ylabel("examples / s (all workers)")
    ax.set_title(f"throughput{about}: median of repeats, whiskers min-max")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.legend(loc="upper right", fontsize=8, ncols=3)
    _note(ax, _unmeasured_notes(list(res.cases)))
    return fig


def efficiency(res: BenchResults, ax: Any = None, *, arch: str | None = None):
    """Scaling efficiency of every multi-worker case: against the same strategy with one
    worker, and against one device without a strategy, with the 100% and 90% lines and,
    where measured, the ceiling of N independent processes that never communicate."""
    fig, ax = _axes(ax, (9, 4.2))
    res, about = _one_arch(res, arch)
    multi = [c for c in res.cases if c.workers > 1]
    # a case without an x1 of its own (e.g. the ResNet's multi_worker-x2) still has its bar
    # against single-x1
    scaled = [c for c in multi if c.ok and (c.efficiency, c.efficiency_vs_single) != (None, None)]
    xs = list(range(len(scaled)))
    own = [c for c in scaled if c.efficiency is not None]
    bars = ax.bar(
        [xs[scaled.index(c)] - 0.2 for c in own],
        [c.efficiency * 100 for c in own],
        0.38,
        color="tab:green",
        label="vs the same strategy with 1 worker",
    )
    ax.bar_label(bars, fmt="{:.0f}%", fontsize=8, padding=2)
    against_single = [c for c in scaled if c.efficiency_vs_single is not None]
    if against_single:
        bars = ax.bar(
            [xs[scaled.index(c)] + 0.2 for c in against_single],
            [c.efficiency_vs_single * 100 for c in against_single],
            0.38,
            color="tab:gray",
            label="vs one device, no strategy (single-x1)",
        )
        ax.bar_label(bars, fmt="{:.0f}%", fontsize=8, padding=2)
    ax.axhline(100, color="black", linestyle="--", linewidth=1, label="linear scaling (100%)")
    ax.axhline(HOROVOD_PUBLISHED * 100, color="tab:red", linestyle=":", label=HOROVOD_LABEL)
    for c in scaled:
        if c.strategy == "independent":  # N processes that never communicate
            ax.axhline(
                c.efficiency * 100,
                color="tab:blue",
                linestyle="-.",
                linewidth=1,
                label=f"this machine's ceiling: {c.name} (no communication)",
            )
    ax.set_xticks(xs, [_short(c.name) for c in scaled])
    ax.set_ylabel("efficiency: speed-up / workers (%)")
    ax.set_title(f"scaling efficiency{about}")
    top = max([110.0] + [p.get_height() for p in ax.patches])
    ax.set_ylim(0, top * 1.3)
    ax.legend(loc="upper right", fontsize=8)
    _note(ax, _unmeasured_notes([c for c in multi if not c.ok]))
    return fig


NO_EVALS = (
    "no held-out evaluations in this benchmark, so no time to accuracy.\n"
    "Fix: run `ddlkit bench --eval-every 20` (quick and full benchmarks evaluate by default)"
)


def time_to_accuracy(res: BenchResults, ax: Any = None, *, arch: str | None = None):
    """Time to accuracy: the held-out curves where the runs' directories hold them (one
    line per run, colour by strategy, dashed with 1 worker, the target as a line and each
    case's median time to it as an x), else each case's median seconds to the target as
    a bar with min-max whiskers, and why a case has none."""
    fig, ax = _axes(ax, (9, 4.2))
    res, _ = _one_arch(res, arch)
    if res.has_evals:
        _curves(ax, res)
    elif any(c.eval_every for c in res.cases) or res.has_target_times:
        _target_bars(ax, res)
    else:
        ax.set_title("time to accuracy")
        ax.text(0.5, 0.5, NO_EVALS, transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def _curves(ax: Any, res: BenchResults) -> None:
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("time to accuracy: held-out accuracy during training")
    colour = {s: STRATEGY_COLOURS[i % len(STRATEGY_COLOURS)] for i, s in enumerate(res.strategies)}
    for c in res.cases:
        for i, curve in enumerate(c.evals):
            ax.plot(
                [p.seconds for p in curve],
                [p.accuracy for p in curve],
                "o-" if c.workers > 1 else "o--",
                markersize=3,
                color=colour[c.strategy],
                alpha=1.0 if i == 0 else 0.35,
                label=c.name if i == 0 else None,
            )
        if c.evals and c.time_to_target is not None and res.target_accuracy is not None:
            ax.plot(
                [c.time_to_target.median],
                [res.target_accuracy],
                "x",
                markersize=9,
                color=colour[c.strategy],
            )
    if res.target_accuracy is not None:
        ax.axhline(
            res.target_accuracy,
            color="0.3",
            linestyle=":",
            label=f"target {res.target_accuracy:.2f}",
        )
    ax.legend(loc="lower right", fontsize=8)


def _target_bars(ax: Any, res: BenchResults) -> None:
    target = "the target" if res.target_accuracy is None else f"{res.target_accuracy:.2f}"
    ax.set_title(f"time to {target} held-out accuracy: median of runs, whiskers min-max")
    ax.set_xlabel("training seconds (evaluation excluded)")
    cases = [c for c in res.cases if c.ok]
    ys = list(range(len(cases)))
    reached = [(y, c) for y, c in zip(ys, cases, strict=True) if c.time_to_target is not None]
    if reached:
        t = [c.time_to_target for _, c in reached]
        bars = ax.barh(
            [y for y, _ in reached],
            [s.median for s in t],
            xerr=[[s.median - s.min for s in t], [s.max - s.median for s in t]],
            height=0.6,
            capsize=3,
            color="tab:purple",
            label=f"seconds to {target}",
        )
        ax.bar_label(bars, fmt="{:.1f} s", label_type="center", fontsize=8, color="white")
    for y, c in zip(ys, cases, strict=True):
        if c.time_to_target is None:
            ax.text(
                0.01,
                y,
                c.target_text(),
                transform=ax.get_yaxis_transform(),
                fontsize=8,
                va="center",
                color="0.3",
            )
    ax.set_yticks(ys, [_short(c.name) for c in cases])
    ax.set_ylim(len(cases) - 0.5, -0.5)  # first case on top, no row cut off
    right = max([1.0] + [c.time_to_target.max for _, c in reached])
    ax.set_xlim(0, right * 1.25)


def save_png(res: BenchResults, path: str | Path) -> Path:
    """:func:`throughput` and :func:`efficiency` side by side in one PNG (``bench.png``),
    one row per architecture."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend alone

    archs = res.archs
    fig = Figure(figsize=(18, 4.6 * len(archs)), layout="constrained")
    axes = fig.subplots(len(archs), 2, squeeze=False)
    for (ax_rate, ax_eff), arch in zip(axes, archs, strict=True):
        throughput(res, ax_rate, arch=arch)
        efficiency(res, ax_eff, arch=arch)
    fig.suptitle(res.caption())
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
