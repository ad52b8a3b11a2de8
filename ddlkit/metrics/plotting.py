"""Drawing a run: loss and accuracy against step, throughput against wall time.

:class:`RunFigure` owns one matplotlib figure on the Agg canvas (no pyplot,
no GUI backend, no ipympl) and updates its lines in place, so the live
dashboard can redraw it cheaply; :func:`plot_run` draws a finished run with
the same code.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path

from ddlkit.errors import ConfigError
from ddlkit.metrics.records import Record
from ddlkit.metrics.series import RunData, Snapshot, downsample
from ddlkit.metrics.store import load_run

PANELS = (
    # (column on y, column on x, title, x label)
    ("loss", "step", "loss", "step"),
    ("accuracy", "step", "accuracy", "step"),
    ("examples_per_sec", "wall_time", "examples/sec", "seconds since start"),
)
MAX_POINTS = 400


class RunFigure:
    """A 1x3 figure with one line per worker in each panel, updated in place.

    ``title`` goes above the panels (None: no title, e.g. when a widget shows it).

    With ``blit=True`` (the live dashboard) axis limits only grow, in steps
    with headroom, and the axes, ticks and labels are drawn once per limit
    change and cached: a redraw then only paints the lines onto the cached
    background, which keeps it cheap while records stream in. :meth:`finish`
    switches to a normal, tightly autoscaled figure.
    """

    def __init__(
        self, title: str | None, *, max_points: int = MAX_POINTS, dpi: int = 80, blit: bool = False
    ) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self.max_points = max_points
        self.blit = blit
        self.figure = Figure(figsize=(12, 3.4), dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        top = 0.8 if title else 0.88
        self.figure.subplots_adjust(left=0.06, right=0.99, bottom=0.17, top=top, wspace=0.25)
        if title:
            self.figure.suptitle(title, fontsize=12)
        self.axes = list(self.figure.subplots(1, 3))
        self._empty = []
        for ax, (_, x_name, name, xlabel) in zip(self.axes, PANELS, strict=True):
            ax.set_title(name, fontsize=10)
            ax.set_xlabel(xlabel, fontsize=9)
            ax.tick_params(labelsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(5, integer=x_name == "step"))
            ax.yaxis.set_major_locator(MaxNLocator(5))
            ax.grid(True, alpha=0.3)
            self._empty.append(
                ax.text(
                    0.5,
                    0.5,
                    "",
                    transform=ax.transAxes,
                    ha="center",
                    va="center",
                    color="0.5",
                    fontsize=9,
                )
            )
        self.lines: dict[str, list] = {}
        self._limits: list[tuple[float, float, float, float] | None] = [None] * len(PANELS)
        self._background = None

    def update(self, data: Snapshot, total_steps: int | None = None) -> None:
        """Point every worker's lines at its data in ``data`` (downsampled)."""
        for name, (color, columns) in data.workers.items():
            if name not in self.lines:
                self.lines[name] = [
                    ax.plot([], [], color=color, lw=1.4, label=name, animated=self.blit)[0]
                    for ax in self.axes
                ]
                self.axes[0].legend(loc="upper right", fontsize=8)
                self._background = None
            for line, (y_name, x_name, _, _) in zip(self.lines[name], PANELS, strict=True):
                x = columns[x_name]
                if x_name == "wall_time" and data.t0 is not None:
                    x = x - data.t0
                line.set_data(*downsample(x, columns[y_name], self.max_points))
        for index, ax in enumerate(self.axes):
            lines = [lines[index] for lines in self.lines.values()]
            has_data = any(not _all_nan(line.get_ydata()) for line in lines)
            waiting = "waiting for records" if not self.lines else f"no {PANELS[index][2]} reported"
            text = "" if has_data else waiting
            if self._empty[index].get_text() != text:
                self._empty[index].set_text(text)
                self._background = None
            if not self.blit:
                ax.relim()
                ax.autoscale_view()
            elif has_data:
                limit = _grown_limits(
                    self._limits[index], lines, total_steps if index < 2 else None
                )
                if limit != self._limits[index]:
                    self._limits[index] = limit
                    ax.set_xlim(limit[0], limit[1])
                    ax.set_ylim(limit[2], limit[3])
                    self._background = None

    def finish(self) -> None:
        """Stop blitting: every artist drawn normally, limits fitted to the data."""
        self.blit = False
        for lines in self.lines.values():
            for line in lines:
                line.set_animated(False)
        for ax in self.axes:
            ax.set_autoscale_on(True)  # set_xlim/set_ylim while blitting turned it off
            ax.relim()
            ax.autoscale_view()
        self._background = None

    def render(self) -> None:
        """Draw into the canvas buffer (lines only, when the cached background is valid)."""
        if not self.blit:
            self.canvas.draw()
            return
        if self._background is None:
            self.canvas.draw()  # everything but the (animated) lines
            self._background = self.canvas.copy_from_bbox(self.figure.bbox)
        else:
            self.canvas.restore_region(self._background)
        for index, ax in enumerate(self.axes):
            for lines in self.lines.values():
                ax.draw_artist(lines[index])

    def png(self) -> bytes:
        from PIL import Image

        self.render()
        width, height = self.canvas.get_width_height()
        image = Image.frombuffer(
            "RGBA", (width, height), self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1
        )
        buffer = io.BytesIO()
        image.save(buffer, format="png", compress_level=1)
        return buffer.getvalue()

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png())
        return path


def _grown_limits(current, lines, x_max_hint: int | None):
    """Limits holding all of ``lines``' data: ``current`` if it does, else grown with headroom."""
    import numpy as np

    xs = [np.asarray(line.get_xdata(), dtype=float) for line in lines]
    ys = [np.asarray(line.get_ydata(), dtype=float) for line in lines]
    x = np.concatenate(xs) if xs else np.array([])
    y = np.concatenate(ys) if ys else np.array([])
    y = y[np.isfinite(y)]
    if not x.size or not y.size:
        return current
    x_lo, x_hi, y_lo, y_hi = float(x.min()), float(x.max()), float(y.min()), float(y.max())
    if current is not None and (
        current[0] <= x_lo and x_hi <= current[1] and current[2] <= y_lo and y_hi <= current[3]
    ):
        return current
    if x_max_hint and x_hi <= x_max_hint:
        new_x_hi = float(x_max_hint)
    else:
        new_x_hi = x_hi + max(0.5 * (x_hi - min(x_lo, 0.0)), 1.0)
    pad = 0.1 * (y_hi - y_lo) or 0.1 * abs(y_hi) or 0.1
    new = (min(x_lo, 0.0), new_x_hi, y_lo - pad, y_hi + pad)
    if current is not None:  # only grow, so the background stays valid longest
        new = (
            min(new[0], current[0]),
            max(new[1], current[1]),
            min(new[2], current[2]),
            max(new[3], current[3]),
        )
    return new


def _all_nan(values) -> bool:
    import numpy as np

    array = np.asarray(values, dtype=float)
    return bool(array.size == 0 or np.isnan(array).all())


def plot_run(
    run: str | os.PathLike | Iterable[Record],
    title: str | None = None,
    *,
    max_points: int = 2000,
):
    """Draw a run (a run directory or records) and return the matplotlib Figure.

    The figure is not attached to pyplot; save it with ``fig.savefig(path)``.
    """
    if isinstance(run, str | os.PathLike):
        records = load_run(run)
        title = title or Path(run).name
        where = str(run)
    else:
        records = list(run)
        where = "the records given"
    if not records:
        raise ConfigError(
            f"there are no metric records to plot in {where}. "
            f"Fix: pass a run whose workers reported metrics (KerasReporter or Reporter)."
        )
    data = RunData()
    data.extend(records)
    figure = RunFigure(title or "run", max_points=max_points, dpi=100)
    figure.update(data.snapshot())
    figure.finish()
    return figure.figure
