"""The course's recorded measurements (``notebooks/data/``), as named quantities.

Every figure a lesson or a page of ``docs/`` quotes from a recording is one of these quantities,
read from its file by the same readers the notebooks use (:mod:`ddlkit.bench.results` for the
benchmark, :class:`ddlkit.horovod.timing.AllreduceTiming` for the all-reduce fits). A notebook
prints the ones it talks about::

    dk.recorded.show("bench.horovod-x2", "allreduce.horovod")   # names or name prefixes

and ``tests/notebooks/test_claims.py`` checks every quote of one in prose (the claims in
``notebooks/data/claims/``) against its value, so prose cannot drift from its file.

Names: ``bench.<case>.<field>`` (fields: ``examples_per_sec`` and its ``_min``/``_max`` over
the repeats, ``step_ms``, ``vs_single``, ``vs_ceiling``, ``vs_reference``, ``speedup``,
``efficiency``, ``comm_share``, ``comm_ms``), ``bench.overhead.*``, ``bench.load.*``,
``bench.wall_seconds``; ``allreduce.<strategy>.latency_ms`` and ``.bandwidth_gbs`` (the fit
``t = a + n / B``) and ``.ms_<size>`` (the median at one size, e.g. ``ms_1KiB``);
``runtime.<notebook>.minutes`` (a lesson run top to bottom at its default sizes,
``benchmarks/time_notebooks.py``; only runs that passed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.settings import REPO_ROOT

DATA = REPO_ROOT / "notebooks" / "data"
BENCH = "bench-full.json"
TIMES = "notebook-times.json"  # benchmarks/time_notebooks.py
# the all-reduce fits, by the strategy (and transport) each one timed: Horovod as the horovod
# strategy runs it here (MPI), Horovod over Gloo, and MultiWorkerMirrored's gRPC collectives
ALLREDUCE = {
    "horovod": "allreduce-horovod.json",
    "horovod_gloo": "allreduce-horovod-gloo.json",
    "multi_worker": "allreduce-mwms.json",
}

_WHO = {"horovod": "Horovod", "horovod_gloo": "Horovod", "multi_worker": "MultiWorkerMirrored"}
_CASE_FIELDS = {
    # field: (what, unit, how to read it from a CaseSummary)
    "examples_per_sec": ("examples/s, all workers, median of the repeats", "examples/s"),
    "examples_per_sec_min": ("the slowest repeat's examples/s", "examples/s"),
    "examples_per_sec_max": ("the fastest repeat's examples/s", "examples/s"),
    "step_ms": ("step time, median of the repeats", "ms"),
    "vs_single": ("examples/s over single-x1's", "ratio"),
    "vs_ceiling": ("examples/s over independent-xN's (no communication)", "ratio"),
    "vs_reference": ("examples/s over the bare tf-keras loop's", "ratio"),
    "speedup": ("examples/s over the same strategy's x1", "ratio"),
    "efficiency": ("speed-up over workers", "ratio"),
    # what these count is the case's own `how` (a timed allreduce, or all the strategy adds to
    # a step), so _bench_quantities appends it: two cases' shares may not be measured alike
    "comm_share": ("share of a step", "ratio"),
    "comm_ms": ("milliseconds of a step", "ms"),
}
_COMM_FIELDS = ("comm_share", "comm_ms")


@dataclass(frozen=True)
class Quantity:
    """One recorded number: its name, value, unit, what it is and the file it comes from."""

    name: str
    value: float
    unit: str
    what: str
    file: str

    def text(self) -> str:
        """The value as a lesson would print it."""
        v = self.value
        if self.unit == "examples/s":
            return f"{v:,.0f} examples/s"
        if self.unit == "ratio":
            return f"{v:.2f}"
        if self.unit == "ms":
            return f"{v:.2f} ms"
        if self.unit == "GB/s":
            return f"{v:.2f} GB/s"
        if self.unit == "minutes":
            return f"{v:.1f} minutes"
        return f"{v:g} {self.unit}".strip()


def _case_values(case) -> dict[str, float | None]:
    rate, step = case.throughput, case.step_time
    return {
        "examples_per_sec": rate and rate.median,
        "examples_per_sec_min": rate and rate.min,
        "examples_per_sec_max": rate and rate.max,
        "step_ms": step and step.median * 1e3,
        "vs_single": case.vs_single,
        "vs_ceiling": case.vs_ceiling,
        "vs_reference": case.vs_reference,
        "speedup": case.speedup if case.workers > 1 else None,
        "efficiency": case.efficiency if case.workers > 1 else None,
        "comm_share": case.comm_share,
        "comm_ms": case.comm_ms,
    }


def _bench_quantities(path: Path) -> list[Quantity]:
    from ddlkit.bench.results import load_results
    from ddlkit.bench.schema import read

    res = load_results(path, curves=False)
    out = []
    for case in res.measured:
        for field, value in _case_values(case).items():
            if value is None:
                continue
            what, unit = _CASE_FIELDS[field]
            if field in _COMM_FIELDS:
                what = f"{what}, {case.comm_how or 'how not recorded'}"
            out.append(Quantity(f"bench.{case.name}.{field}", float(value), unit, what, path.name))
    if res.overhead_ratio is not None:
        ratios = res.overhead_ratios
        what = "examples/s through the kit over by hand"
        for key, value in (
            ("median", res.overhead_ratio),
            ("min", min(ratios)),
            ("max", max(ratios)),
        ):
            out.append(
                Quantity(f"bench.overhead.{key}", value, "ratio", f"{what}, {key}", path.name)
            )
    doc, _ = read(path)
    details = dict(doc.machine.details)
    for when in ("start", "end"):
        loads = details.get(f"load_{when}")
        if loads:
            for minutes, value in zip((1, 5, 15), loads, strict=False):
                what = f"{minutes}-minute load average at the benchmark's {when}"
                name = f"bench.load.{when}_{minutes}min"
                out.append(Quantity(name, float(value), "", what, path.name))
    wall = "the benchmark's wall time"
    out.append(Quantity("bench.wall_seconds", res.wall_seconds, "s", wall, path.name))
    return out


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def _allreduce_quantities(strategy: str, path: Path) -> list[Quantity]:
    from ddlkit.horovod.timing import AllreduceTiming

    timing = AllreduceTiming.from_dict(json.loads(path.read_text()))
    latency, bandwidth = timing.fit()
    who = f"{_WHO[strategy]}'s all-reduce over {timing.ranks} processes ({timing.transport})"
    out = [
        Quantity(
            f"allreduce.{strategy}.latency_ms", latency * 1e3, "ms", f"{who}: fit's a", path.name
        ),
    ]
    if math.isfinite(bandwidth):
        what = f"{who}: fit's B"
        out.append(
            Quantity(
                f"allreduce.{strategy}.bandwidth_gbs", bandwidth / 1e9, "GB/s", what, path.name
            )
        )
    for p in timing.points:
        what = f"{who}: median time of one {_size(p.nbytes)} all-reduce"
        out.append(
            Quantity(
                f"allreduce.{strategy}.ms_{_size(p.nbytes)}", p.seconds * 1e3, "ms", what, path.name
            )
        )
    return out


def quantities(data_dir: str | Path | None = None) -> dict[str, Quantity]:
    """Every recorded quantity, by name, from the files in ``data_dir`` (the course's)."""
    data = Path(data_dir) if data_dir is not None else DATA
    found: list[Quantity] = []
    if (data / BENCH).exists():
        found += _bench_quantities(data / BENCH)
    for strategy, name in ALLREDUCE.items():
        if (data / name).exists():
            found += _allreduce_quantities(strategy, data / name)
    if (data / TIMES).exists():
        found += _runtime_quantities(data / TIMES)
    return {q.name: q for q in found}


def _runtime_quantities(path: Path) -> list[Quantity]:
    doc = json.loads(path.read_text())
    machine = doc.get("machine", {})
    where = f"{machine.get('cores', '?')} cores of {machine.get('cpu', 'an unrecorded CPU')}"
    return [
        Quantity(
            f"runtime.{stem}.minutes",
            run["seconds"] / 60,
            "minutes",
            f"notebook {stem} top to bottom at its default sizes, {where}",
            path.name,
        )
        for stem, run in sorted(doc.get("notebooks", {}).items())
        if run.get("ok")
    ]


def get(name: str, data_dir: str | Path | None = None) -> Quantity:
    """One quantity by its full name; a wrong name lists the closest ones."""
    known = quantities(data_dir)
    if name in known:
        return known[name]
    stem = name.rsplit(".", 1)[0]
    near = [n for n in known if n.startswith(stem)] or sorted(known)[:10]
    raise ConfigError(f"no recorded quantity {name!r}. Fix: use one of {', '.join(near)}")


@dataclass(frozen=True)
class Shown:
    """Recorded quantities as a table: name, value, what it is, and its file."""

    rows: tuple[Quantity, ...]

    def _cells(self) -> list[tuple[str, str, str, str]]:
        return [(q.name, q.text(), q.what, q.file) for q in self.rows]

    def _repr_html_(self) -> str:
        return html_table(("quantity", "value", "what", "file"), self._cells(), "recorded")

    def __str__(self) -> str:
        return text_table(("quantity", "value", "what", "file"), self._cells())


def show(*names: str, data_dir: str | Path | None = None) -> Shown:
    """The quantities whose names equal or start with any of ``names`` (all with none)."""
    known = quantities(data_dir)
    picked = [q for n, q in known.items() if not names or any(_under(n, p) for p in names)]
    missing = [p for p in names if not any(_under(n, p) for n in known)]
    if missing:
        raise ConfigError(
            f"no recorded quantity named or starting with {', '.join(map(repr, missing))}. "
            f"Fix: use a name from dk.recorded.show() (all of them)"
        )
    return Shown(tuple(picked))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".") or name.startswith(prefix + "_")


def names(prefixes: Iterable[str] = ()) -> list[str]:
    """Every quantity's name (under ``prefixes`` when given), sorted."""
    known = quantities()
    return sorted(n for n in known if not prefixes or any(_under(n, p) for p in prefixes))
