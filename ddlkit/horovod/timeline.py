"""Read and draw a Horovod timeline (``HOROVOD_TIMELINE`` / ``horovodrun --timeline-filename``).

Horovod's rank 0 writes a Chrome-trace JSON file: one "process" per tensor (a
gradient, or a fused group of them), and for each collective operation nested
activities: ``NEGOTIATE_ALLREDUCE`` (waiting until every rank has the tensor
ready), then ``ALLREDUCE`` with its phases (``MEMCPY_IN_FUSION_BUFFER``, the Gloo
allreduce itself, ``MEMCPY_OUT_FUSION_BUFFER``). The file is written while the job
runs, so it may end without its closing bracket; :func:`load_timeline` accepts that.

::

    tl = ddlkit.horovod.load_timeline("timeline.json")
    tl.summary()       # time per activity, summed over tensors
    tl.plot()          # one row per tensor, one colour per activity
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ddlkit._tables import html_table
from ddlkit.errors import ConfigError


@dataclass(frozen=True)
class Span:
    """One activity of one tensor: ``start``/``end`` in microseconds, ``depth`` of nesting."""

    tensor: str
    name: str
    start: float
    end: float
    depth: int

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Timeline:
    """The spans of a timeline file, in start order."""

    path: str
    spans: tuple[Span, ...]

    @property
    def tensors(self) -> list[str]:
        """Tensor names in order of first activity."""
        return list(dict.fromkeys(s.tensor for s in self.spans))

    @property
    def activities(self) -> list[str]:
        return list(dict.fromkeys(s.name for s in self.spans))

    def totals(self) -> dict[str, tuple[int, float]]:
        """Activity -> (how many spans, total milliseconds), summed over tensors."""
        out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for s in self.spans:
            out[s.name][0] += 1
            out[s.name][1] += s.duration / 1e3
        return {k: (int(v[0]), v[1]) for k, v in out.items()}

    def per_step(self, name: str = "ALLREDUCE", skip: int = 0) -> tuple[float, int]:
        """Wall milliseconds per training step during which some tensor was in `name`.

        A tensor's i-th `name` span belongs to step i + 1 (each gradient is reduced once
        a step); spans of the first `skip` steps (warm-up) are left out, and overlapping
        spans of different tensors (fused or concurrent) count once. Returns
        ``(ms per step, steps counted)``; ``(0.0, 0)`` when there is nothing after `skip`.
        """
        by_tensor: dict[str, list[Span]] = defaultdict(list)
        for s in self.spans:
            if s.name == name:
                by_tensor[s.tensor].append(s)
        kept = [s for v in by_tensor.values() for s in sorted(v, key=lambda x: x.start)[skip:]]
        steps = max((len(v) for v in by_tensor.values()), default=0) - skip
        if steps <= 0 or not kept:
            return 0.0, 0
        return _union_us(kept) / 1e3 / steps, steps

    def summary(self):
        """A table of :meth:`totals` (for a notebook)."""
        rows = [(name, n, f"{ms:.1f}") for name, (n, ms) in self.totals().items()]
        caption = f"{len(self.tensors)} tensors, {len(self.spans)} spans: {self.path}"
        return _Html(html_table(("activity", "spans", "total ms"), rows, caption=caption))

    def plot(self, max_tensors: int = 12, last_ms: float | None = None, ax=None):
        """A Gantt chart: a row per tensor (the first ``max_tensors``), a colour per activity.

        ``last_ms``: draw only the last milliseconds of the timeline (a few steps).
        """
        import matplotlib.pyplot as plt

        if not self.spans:
            raise ConfigError(
                f"the timeline {self.path} has no activities. Fix: train for a few steps with "
                f"HOROVOD_TIMELINE set, and read the file of rank 0."
            )
        spans = self.spans
        if last_ms is not None:
            end = max(s.end for s in spans)
            spans = tuple(s for s in spans if s.end >= end - last_ms * 1e3)
        tensors = list(dict.fromkeys(s.tensor for s in spans))[:max_tensors]
        colours = {name: plt.cm.tab10(i % 10) for i, name in enumerate(self.activities)}
        if ax is None:
            _, ax = plt.subplots(figsize=(10, 0.45 * len(tensors) + 1.5))
        t0 = min(s.start for s in self.spans)
        for row, tensor in enumerate(tensors):
            for s in spans:
                if s.tensor != tensor:
                    continue
                height = 0.8 / (1 + s.depth)
                ax.broken_barh(
                    [((s.start - t0) / 1e3, max(s.duration / 1e3, 1e-3))],
                    (row - height / 2, height),
                    color=colours[s.name],
                )
        ax.set_yticks(range(len(tensors)))
        ax.set_yticklabels([_short(t) for t in tensors], fontsize=8)
        ax.invert_yaxis()
        if last_ms is not None:
            end_ms = (max(s.end for s in spans) - t0) / 1e3
            ax.set_xlim(end_ms - last_ms, end_ms)
        ax.set_xlabel("time (ms)")
        ax.set_title("Horovod timeline (rank 0)")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        ax.legend(handles, list(colours), fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
        return ax


def _union_us(spans: list[Span]) -> float:
    """Microseconds covered by at least one of `spans` (pure)."""
    total, end = 0.0, None
    start = 0.0
    for s in sorted(spans, key=lambda x: x.start):
        if end is None or s.start > end:
            if end is not None:
                total += end - start
            start, end = s.start, s.end
        else:
            end = max(end, s.end)
    return total + (end - start if end is not None else 0.0)


class _Html:
    def __init__(self, html: str) -> None:
        self.html = html

    def _repr_html_(self) -> str:
        return self.html


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def parse_events(text: str) -> list[dict]:
    """The events of a Chrome-trace JSON array, closed or not (pure)."""
    body = text.strip()
    if not body:
        return []
    if not body.startswith("["):
        data = json.loads(body)
        return list(data.get("traceEvents", [])) if isinstance(data, dict) else []
    body = body.rstrip().rstrip(",")
    if not body.endswith("]"):
        body += "]"
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        # cut mid-event while the job was writing: keep the complete lines
        lines = [ln.rstrip().rstrip(",") for ln in body[1:-1].splitlines() if ln.strip()]
        return [json.loads(ln) for ln in lines if ln.startswith("{") and ln.endswith("}")]


def spans_from_events(events: list[dict]) -> list[Span]:
    """Pair begin/end events per tensor into spans (pure).

    Complete ("X") events with a duration count too; Horovod's zero-length ones mark
    when each rank reported a tensor ready and are left out.
    """
    names: dict[object, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e.get("pid")] = str((e.get("args") or {}).get("name", e.get("pid")))
    stacks: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
    spans = []
    for e in events:
        ph, key = e.get("ph"), (e.get("pid"), e.get("tid"))
        tensor = names.get(e.get("pid"), str(e.get("pid")))
        if ph == "B":
            stacks[key].append((str(e.get("name", "")), float(e["ts"])))
        elif ph == "E" and stacks[key]:
            name, start = stacks[key].pop()
            spans.append(Span(tensor, name, start, float(e["ts"]), len(stacks[key])))
        elif ph == "X" and float(e.get("dur", 0)) > 0:  # dur 0: "rank N ready" marks
            start = float(e["ts"])
            spans.append(
                Span(tensor, str(e.get("name", "")), start, start + float(e.get("dur", 0)), 0)
            )
    return sorted(spans, key=lambda s: (s.start, s.depth))


def load_timeline(path: str | Path) -> Timeline:
    """Read a Horovod timeline file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"no timeline at {path}. Fix: run horovodrun with --timeline-filename {path} "
            f"(or HOROVOD_TIMELINE={path} in the ranks' environment) and train a few steps."
        )
    return Timeline(str(path), tuple(spans_from_events(parse_events(path.read_text()))))
