"""The live training dashboard: every worker's curves, a status table, a progress bar.

::

    dash = Dashboard("MWMS on 2 workers").follow(collector, status_fn=job.status)
    ...                     # workers train; the cell output updates by itself
    dash.finish()

or fed in-process (what :func:`ddlkit.metrics.live_plot` does)::

    dash = Dashboard("Baseline", total_steps=1407).show()
    dash.add(record)  ...   dash.finish()

Two modes, from :func:`ddlkit.settings.plot_mode` unless given:

- ``"live"`` (a Jupyter kernel): an ipywidgets tree (title, progress bar,
  figure as a PNG in an ``ipywidgets.Image``, status table). A daemon thread
  refreshes it every ``interval`` s: the table and bar each time, the figure
  when records arrived, at most once per ``min_redraw`` s. Needs no ipympl
  and no frontend extension (ipywidgets 8 works in JupyterLab 4 as is).
- ``"static"`` (nbval, papermill, plain python, or ``DDLKIT_PLOTS=static``):
  no widget; one printed line per epoch record; :meth:`finish` shows one
  final figure (displayed in a Jupyter kernel, else saved to ``save_path``,
  ``<run_dir>/dashboard.png`` or ``runs/dashboard-<timestamp>.png``).
"""

from __future__ import annotations

import collections
import html
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ddlkit import settings
from ddlkit.errors import ConfigError
from ddlkit.metrics import status as status_mod
from ddlkit.metrics.plotting import RunFigure
from ddlkit.metrics.records import Record
from ddlkit.metrics.series import RunData

StatusFn = Callable[[], status_mod.ProcessStatus]


def _kernel_shell():
    """The IPython shell if this runs in a Jupyter kernel, else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if shell is not None and hasattr(shell, "kernel") else None


class Dashboard:
    """Shows a run's workers while they train; see the module docstring."""

    def __init__(
        self,
        title: str = "Training",
        workers: Iterable[str] | None = None,
        total_steps: int | None = None,
        *,
        mode: str | None = None,
        run_dir: str | os.PathLike | None = None,
        save_path: str | os.PathLike | None = None,
        interval: float = 0.5,
        min_redraw: float = 0.5,
        max_points: int = 400,
        idle_stop: float = 60.0,
    ) -> None:
        mode = mode or settings.plot_mode()
        if mode not in ("live", "static"):
            raise ConfigError(
                f"dashboard mode {mode!r} is unknown. Fix: use 'live' or 'static' "
                f"(or set DDLKIT_PLOTS)."
            )
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise ConfigError(
                f"total_steps must be a positive int or None, got {total_steps!r}. "
                f"Fix: pass epochs * steps_per_epoch."
            )
        if interval <= 0 or min_redraw < 0:
            raise ConfigError(
                f"interval must be > 0 and min_redraw >= 0, got {interval} and {min_redraw}."
            )
        self.title = title
        self.mode = mode
        self.total_steps = total_steps
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.save_path = None if save_path is None else Path(save_path)
        self.interval = interval
        self.min_redraw = min_redraw
        self.max_points = max_points
        self.idle_stop = idle_stop
        self._shown = False
        self.data = RunData(workers or ())
        self.finished = False
        self.saved_path: Path | None = None
        self.redraw_seconds: collections.deque[float] = collections.deque(maxlen=200)
        self.errors: list[str] = []
        self._lock = threading.RLock()  # serialises refresh/draw/finish
        self._data_lock = threading.Lock()  # guards data and _seen; held only briefly
        self._seen: dict[str, float] = {}
        self._figure: RunFigure | None = None
        self._drawn_version = -1
        self._last_draw = 0.0
        self._widgets: dict[str, Any] | None = None
        self._shown_in: object = None
        self._collector = None
        self._collector_version = 0
        self._status_fn: StatusFn | None = None
        self._process_status: dict = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = time.monotonic()

    # -- feeding --------------------------------------------------------------------
    def add(self, record: Record) -> None:
        """Take one record (thread-safe, cheap: drawing happens on refresh)."""
        with self._data_lock:
            self.data.add(record)
            self._seen[record.worker] = time.monotonic()
            restart = self._shown and self._thread is None and not self.finished
            if self.mode == "static" and record.kind == "epoch":
                worker = self.data.workers[record.worker]
                total = self.total_steps or worker.total_steps
                print(status_mod.epoch_line(record, worker.epochs_total, total), flush=True)
        if restart:
            self._start_thread()

    def extend(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)

    def follow(self, collector, status_fn: StatusFn | None = None, *, show: bool = True):
        """Take records from ``collector`` (and process states from ``status_fn``,
        a callable returning ``{worker: {"state": str, "exit_code": int | None}}``)
        on a background thread; shows the dashboard unless ``show=False``."""
        with self._lock:
            self._collector = collector
            self._status_fn = status_fn
            if self.run_dir is None and getattr(collector, "run_dir", None) is not None:
                self.run_dir = Path(collector.run_dir)
        if show:
            self.show()
        self._start_thread()
        return self

    # -- display ----------------------------------------------------------------------
    @property
    def widget(self):
        """The ipywidgets tree (built on first use)."""
        with self._lock:
            if self._widgets is None:
                self._widgets = self._build_widgets()
                self._update_widgets(force_draw=True)
            return self._widgets["root"]

    @property
    def figure(self):
        """The matplotlib Figure the dashboard draws (built on first use)."""
        return self._run_figure().figure

    def show(self):
        """Display the dashboard in the current cell (live mode) and keep it fresh."""
        if self.mode == "live":
            from IPython.display import display

            display(self.widget)
            self._shown = True
            shell = _kernel_shell()
            self._shown_in = getattr(shell, "execution_count", None)
            self._start_thread()
        return self

    def _ipython_display_(self) -> None:
        shell = _kernel_shell()
        count = getattr(shell, "execution_count", None)
        if self.mode == "live" and self._shown_in is not None and self._shown_in == count:
            return  # already shown by follow()/show() in this very cell
        if self.mode == "live":
            self.show()
        else:
            print(repr(self))

    def __repr__(self) -> str:
        return (
            f"Dashboard({self.title!r}, mode={self.mode}, workers={list(self.data.workers)}, "
            f"records={self.data.version}{', finished' if self.finished else ''})"
        )

    # -- refreshing -------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Pull new records and process states, update the widgets (one step of the thread)."""
        with self._lock:
            if self._collector is not None:
                records, self._collector_version = self._collector.records_since(
                    self._collector_version
                )
                self.extend(records)
            if self._status_fn is not None:
                try:
                    self._process_status = dict(self._status_fn())
                except Exception as exc:  # the launcher's problem must not stop the display
                    self._note_error(f"status_fn failed: {type(exc).__name__}: {exc}")
            if self.mode == "live" and self._widgets is not None:
                self._update_widgets(force_draw=force)

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None or self.finished:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name=f"ddlkit-dashboard-{self.title}", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as exc:  # keep refreshing; show what went wrong
                self._note_error(f"refresh failed: {type(exc).__name__}: {exc}")
            if self._idle():
                break
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None

    def _idle(self) -> bool:
        """Nothing more can arrive for a while: the collector is closed, or (fed in-process,
        e.g. a training run that was interrupted) no record came for ``idle_stop`` s. The
        thread then stops; a new record from :meth:`add` starts it again."""
        if self._collector is not None:
            return bool(getattr(self._collector, "closed", False))
        with self._data_lock:
            last = max(self._seen.values(), default=self._started)
        return time.monotonic() - last > self.idle_stop

    def _note_error(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)
            if self._widgets is not None:
                self._widgets["errors"].value = self._errors_html()

    def _errors_html(self) -> str:
        return "<br>".join(f"<span style='color:#b00'>{html.escape(e)}</span>" for e in self.errors)

    def _run_figure(self) -> RunFigure:
        if self._figure is None:
            live = self.mode == "live"  # the widget shows the title above the figure
            self._figure = RunFigure(
                None if live else self.title, max_points=self.max_points, blit=live
            )
        return self._figure

    def redraw(self) -> bytes:
        """Update the figure from the data and return it as PNG bytes (timed)."""
        with self._lock:
            start = time.perf_counter()
            with self._data_lock:
                snapshot = self.data.snapshot()
                total = self.total_steps or self.data.total_steps()
            figure = self._run_figure()
            figure.update(snapshot, total)
            png = figure.png()
            self._drawn_version = snapshot.version
            self._last_draw = time.monotonic()
            self.redraw_seconds.append(time.perf_counter() - start)
            return png

    # -- widgets ----------------------------------------------------------------------
    def _build_widgets(self) -> dict[str, Any]:
        import ipywidgets as w

        title = w.HTML(f"<b style='font-size:14px'>{html.escape(self.title)}</b>")
        bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="50%"))
        label = w.HTML("waiting for the first record")
        image = w.Image(format="png", layout=w.Layout(width="100%", max_width="960px"))
        table = w.HTML("")
        errors = w.HTML(self._errors_html())
        root = w.VBox(
            [title, w.HBox([bar, label]), image, table, errors],
            layout=w.Layout(width="100%"),
        )
        root.add_class("ddlkit-dashboard")
        image.add_class("ddlkit-dashboard-figure")
        table.add_class("ddlkit-dashboard-status")
        bar.add_class("ddlkit-dashboard-progress")
        return {
            "root": root,
            "bar": bar,
            "label": label,
            "image": image,
            "table": table,
            "errors": errors,
        }

    def _update_widgets(self, force_draw: bool) -> None:
        widgets = self._widgets
        assert widgets is not None
        data = self.data
        now = time.monotonic()
        with self._data_lock:
            total = self.total_steps or data.total_steps()
            done = data.steps_done()
            elapsed = None
            if data.t0 is not None:
                latest = [w.latest.wall_time for w in data.workers.values() if w.latest]
                elapsed = max(latest) - data.t0 if latest else None
            text = status_mod.progress_text(data, total, elapsed)
            ages = {name: now - seen for name, seen in self._seen.items()}
            rows = status_mod.status_rows(data, self._process_status, ages)
            stale = data.version != self._drawn_version
        bar = widgets["bar"]
        if total:
            bar.max = total
            bar.value = min(done, total)
        else:
            bar.max, bar.value = 1, 0
        failed = any(
            str(s.get("state", "")).startswith("failed") for s in self._process_status.values()
        )
        bar.bar_style = "danger" if failed else ("success" if self.finished else "info")
        if widgets["label"].value != text:
            widgets["label"].value = text
        table = status_mod.status_html(rows)
        if widgets["table"].value != table:
            widgets["table"].value = table
        if force_draw or (stale and now - self._last_draw >= self.min_redraw):
            widgets["image"].value = self.redraw()

    # -- the end ----------------------------------------------------------------------
    def finish(self, path: str | os.PathLike | None = None) -> Path | None:
        """Stop refreshing and leave the final figure.

        Live mode: the widget keeps the final figure and table. Static mode: the
        figure is displayed in a Jupyter kernel, otherwise saved (to ``path``,
        ``save_path``, ``<run_dir>/dashboard.png`` or ``runs/dashboard-<time>.png``)
        and the path printed. Returns the saved path, if any.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        with self._lock:
            if self.finished and path is None:
                return self.saved_path
            self.finished = True
            self._thread = None
            self._run_figure().finish()  # the final figure: complete and tightly fitted
            if self.mode == "live":
                self.refresh(force=True)
                if path is not None or self.save_path is not None:
                    self.saved_path = self._run_figure().save(Path(path or self.save_path))
                return self.saved_path
            self.refresh()
            png = self.redraw()
            target = path or self.save_path
            if _kernel_shell() is not None and target is None:
                from IPython.display import Image, display

                display(Image(data=png, format="png"))
                return None
            if target is None:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                target = (
                    self.run_dir / "dashboard.png"
                    if self.run_dir is not None
                    else settings.runs_dir() / f"dashboard-{stamp}.png"
                )
            target = Path(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(png)
            self.saved_path = target
            print(f"Saved the training plot to {target}", flush=True)
            return target

    def close(self) -> Path | None:
        """Same as :meth:`finish`."""
        return self.finish()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
