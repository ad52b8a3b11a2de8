"""Published data-parallel scaling results, and what the model predicts for each (pure).

One concern, kept whole (about 440 lines): the model held to published runs, run by run
(:func:`check`), series by series (:func:`trends`) and against the models that cannot scale
(:func:`scorecard`); the run list itself is :mod:`ddlkit.scale.runs`.

    dk.scale.published.check()        # predicted vs published efficiency, one table
    dk.scale.published.scorecard()    # the same runs against a model that ignores communication

Each run is described by its machine (a preset of :mod:`ddlkit.scale.nodes`, the network it
ran over), its model and batch per GPU, the algorithm the source says it ran, and, where
the source publishes it, the images/s of **one** GPU of that machine on that model and batch:
the run's compute is then ``batch / rate``, measured, not a FLOP count. Runs without a
published single-GPU rate take the FLOP count at
:data:`ddlkit.scale.hardware.SUSTAINED_SHARE` of peak. Every run is predicted with the same
assumptions (the step's timeline of :mod:`ddlkit.scale.timeline`: Horovod's 5 ms cycle and
64 MiB fusion buffers, NCCL's latency model, 85% of line rate, one kernel-TCP connection at
most 15 Gbit/s, a parameter server's pull never hidden; 3% compute jitter; fp32 gradients);
no run has a correction of its own. Efficiency is against the published baseline (1 GPU, or
one 8-GPU server for Goyal et al.). The run list and its sources are in
:mod:`ddlkit.scale.runs`.

Two tolerances: :data:`TOLERANCE` (10 points) for one run, :data:`TREND_TOLERANCE` (5 points)
for every size of a series (:func:`series`: Horovod's three models at 16, 128 and 512 GPUs).
:func:`scorecard` puts beside this model the one-page formula (overlap 0.5), a model whose
communication is that of two servers whatever the size (flat in N), a model without
communication (100% for every run) and full overlap, so a reader sees which checks can fail:
at 10 points, a model flat in N passes nearly every run; at 5 points it fails most.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddlkit._tables import html_table, text_table
from ddlkit.bench.ratio import TRAIN_FLOPS_FACTOR
from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import SUSTAINED_SHARE, Hardware, network
from ddlkit.scale.models import ModelSpec, model
from ddlkit.scale.nodes import node
from ddlkit.scale.predict import DEFAULT_OVERLAP, KINDS, ONE_PAGE_OVERLAP, Algorithm, predict
from ddlkit.scale.sweep import Curve, curve

TOLERANCE = 0.10  # 10 percentage points of efficiency, one run
TREND_TOLERANCE = 0.05  # 5 points, every size of a series


@dataclass(frozen=True)
class Setup:
    """A published run, in public specifications, and its published efficiency."""

    key: str
    model: str
    batch: int
    node: str | Hardware  # a ddlkit.scale.nodes preset, or your own Hardware
    workers: int
    base: int  # the workers the published efficiency is measured against
    algorithm: str
    published: float
    source: str
    inter: str | None = None  # the network, where the run did not use the node's own
    rate: float | None = None  # images/s of one GPU at this batch, published
    rate_source: str = ""
    across: str = "ring"  # hierarchical: between nodes
    servers: int = 1  # ps
    node_sum: bool = False  # ps: gradients summed in the node before the push
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
        if self.algorithm not in KINDS:
            raise ConfigError(
                f"setup {self.key!r}: algorithm={self.algorithm!r}. Fix: one of {', '.join(KINDS)}"
            )
        if self.rate is not None and not self.rate > 0:
            raise ConfigError(
                f"setup {self.key!r}: rate={self.rate!r} must be images/s > 0 or None. "
                f"Fix: the source's single-GPU images/s, or None to count FLOPs"
            )
        self.machine(), model(self.model)  # unknown presets fail here, naming the fix

    @property
    def compute_from(self) -> str:
        if self.rate is None:
            return f"FLOPs at {SUSTAINED_SHARE:g} of peak"
        return f"1 GPU: {self.rate:g} images/s"

    def spec(self) -> ModelSpec:
        return model(self.model, batch=self.batch)

    def machine(self) -> Hardware:
        """The node as described (a preset by name, or the Hardware given)."""
        return self.node if isinstance(self.node, Hardware) else node(self.node)

    def hardware(self, *, share: float | None = None) -> Hardware:
        """The run's machine; its accelerator runs this model at the published single-GPU
        rate where there is one, else at ``share`` (default: the presets') of peak."""
        hw = self.machine()
        if self.inter is not None:
            hw = hw.replace(inter=network(self.inter))
        chip = hw.accelerator
        if self.rate is not None:
            flops = TRAIN_FLOPS_FACTOR * self.spec().forward_flops * self.rate
            chip = replace(chip, sustained_flops=flops, note=f"{self.model}: {self.rate_source}")
        elif share is not None:
            chip = replace(chip, sustained_flops=share * chip.peak_flops)
        return hw.replace(accelerator=chip)

    def algo(self, overlap: float | None = DEFAULT_OVERLAP) -> Algorithm:
        options = {"across": self.across, "overlap": overlap}
        if self.algorithm in ("ps", "async_ps"):
            options["servers"] = self.servers
        if self.node_sum:
            options["node_sum"] = True
        return Algorithm(self.algorithm, **options)

    def efficiency(
        self, *, overlap: float | None = DEFAULT_OVERLAP, share: float | None = None
    ) -> float:
        """Predicted efficiency against the same baseline as the published one."""
        hw, spec, algo = self.hardware(share=share), self.spec(), self.algo(overlap)
        run = predict(spec, hw, self.workers, algo)
        # one GPU trains alone (a parameter server beside it is in its own memory)
        base = predict(spec, hw, self.base, algo if self.base > 1 else Algorithm("ring"))
        return run.throughput / base.throughput * self.base / self.workers

    def curve(self, workers, **options) -> Curve:
        """This run's machine and model over ``workers``, labelled with the run's key."""
        return curve(self.spec(), self.hardware(), workers, self.algo(), label=self.key, **options)


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
    """Predicted against published efficiency for every setup."""

    checks: tuple[Check, ...]

    def __iter__(self):
        return iter(self.checks)

    def __len__(self) -> int:
        return len(self.checks)

    def __getitem__(self, key: str) -> Check:
        for c in self.checks:
            if c.setup.key == key:
                return c
        raise KeyError(f"no published setup {key!r}; known: {[c.setup.key for c in self]}")

    @property
    def hits(self) -> int:
        return sum(c.within for c in self)

    def hits_within(self, tolerance: float) -> int:
        """Runs predicted within ``tolerance`` (a share: 0.05 is 5 points)."""
        return sum(abs(c.difference) <= tolerance + 1e-12 for c in self)

    HEADERS = (
        "run",
        "GPUs",
        "network",
        "compute from",
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
                f"{c.setup.workers} ({c.setup.machine().per_node}/server)",
                c.setup.inter or c.setup.machine().inter.name,
                c.setup.compute_from,
                f"{c.setup.published:.1%}",
                f"{c.predicted:.1%}",
                f"{c.difference * 100:+.1f} pp",
                "yes" if c.within else "no",
                "" if c.within else c.setup.known_miss,
                c.setup.source,
            )
            for c in self
        ]

    def caption(self) -> str:
        return (
            f"{self.hits} of {len(self)} published efficiencies predicted within "
            f"{TOLERANCE * 100:.0f} points, one set of assumptions for all"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def _setups(setups):
    if setups is None:
        from ddlkit.scale.runs import SETUPS

        return SETUPS
    return tuple(setups)


def check(setups=None, *, overlap: float | None = DEFAULT_OVERLAP) -> Checks:
    """Predict every setup (pure); default: :data:`ddlkit.scale.runs.SETUPS`."""
    return Checks(tuple(Check(s, s.efficiency(overlap=overlap)) for s in _setups(setups)))


def ignoring_communication(setups=None) -> Checks:
    """The model with infinite bandwidth and no latency: every run at 100%."""
    return Checks(tuple(Check(s, 1.0) for s in _setups(setups)))


def two_servers(setup: Setup) -> Setup:
    """``setup`` at two servers' worth of workers (never fewer than its baseline)."""
    return replace(setup, workers=max(setup.base, min(setup.workers, 2 * setup.machine().per_node)))


def flat_in_workers(setups=None) -> Checks:
    """A model whose communication does not grow with N: every run predicted as if it ran on
    two servers (measure two, extrapolate flat)."""
    return Checks(tuple(Check(s, two_servers(s).efficiency()) for s in _setups(setups)))


@dataclass(frozen=True)
class Series:
    """One published series: the same model on the same servers at several sizes."""

    name: str
    checks: tuple[Check, ...]

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(c.setup.workers for c in self.checks)

    @property
    def within(self) -> bool:
        """Every size within :data:`TREND_TOLERANCE`."""
        return all(abs(c.difference) <= TREND_TOLERANCE for c in self.checks)

    @property
    def drop(self) -> tuple[float, float]:
        """(published, predicted) efficiency lost from the smallest size to the largest."""
        first, last = self.checks[0], self.checks[-1]
        return first.setup.published - last.setup.published, first.predicted - last.predicted


@dataclass(frozen=True)
class Trends:
    """Every series, published against predicted, size by size."""

    series: tuple[Series, ...]

    def __iter__(self):
        return iter(self.series)

    def __getitem__(self, name: str) -> Series:
        for s in self.series:
            if s.name == name:
                return s
        raise KeyError(f"no series {name!r}; known: {[s.name for s in self.series]}")

    @property
    def hits(self) -> int:
        """Sizes predicted within :data:`TREND_TOLERANCE`, over every series."""
        return sum(abs(c.difference) <= TREND_TOLERANCE for s in self for c in s.checks)

    @property
    def points(self) -> int:
        return sum(len(s.checks) for s in self)

    HEADERS = (
        "series",
        "GPUs",
        "published",
        "predicted",
        "difference",
        "drop: published, predicted",
    )

    def rows(self) -> list[tuple]:
        out = []
        for s in self:
            pub, pred = s.drop
            out.append(
                (
                    s.name,
                    " / ".join(str(n) for n in s.workers),
                    " / ".join(f"{c.setup.published:.0%}" for c in s.checks),
                    " / ".join(f"{c.predicted:.0%}" for c in s.checks),
                    " / ".join(f"{c.difference * 100:+.1f}" for c in s.checks),
                    f"{pub * 100:.1f}, {pred * 100:.1f} points",
                )
            )
        return out

    def caption(self) -> str:
        return (
            f"{self.hits} of {self.points} sizes predicted within "
            f"{TREND_TOLERANCE * 100:.0f} points"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def trends(checks: Checks | None = None) -> Trends:
    """Each series of :data:`ddlkit.scale.runs.SERIES` from ``checks`` (default: this model;
    pass :func:`flat_in_workers` or :func:`ignoring_communication` to see another fail)."""
    from ddlkit.scale.runs import SERIES

    checks = check() if checks is None else checks
    return Trends(
        tuple(Series(name, tuple(checks[k] for k in keys)) for name, keys in SERIES.items())
    )


@dataclass(frozen=True)
class Scorecard:
    """Several models of the same runs: this one, and the ones the checks must fail."""

    models: tuple[tuple[str, Checks], ...]

    def hits(self, tolerance: float = TOLERANCE) -> dict[str, int]:
        """Runs each model predicts within ``tolerance`` (default 10 points)."""
        return {name: checks.hits_within(tolerance) for name, checks in self.models}

    def rows(self) -> list[tuple]:
        first = self.models[0][1]
        rows = []
        for i, c in enumerate(first):
            cells = [f"{checks.checks[i].predicted:.0%}" for _, checks in self.models]
            rows.append((c.setup.key, f"{c.setup.published:.0%}", *cells))
        n = len(first)
        for tol in (TOLERANCE, TREND_TOLERANCE):
            hits = self.hits(tol).values()
            rows.append((f"within {tol * 100:.0f} points", "", *(f"{h} of {n}" for h in hits)))
        return rows

    def _repr_html_(self) -> str:
        heads = ("run", "published", *(name for name, _ in self.models))
        caption = f"predicted efficiency of each run, {len(self.models)} models"
        return html_table(heads, self.rows(), caption)

    def __str__(self) -> str:
        heads = ("run", "published", *(name for name, _ in self.models))
        return text_table(heads, self.rows())


def scorecard(setups=None) -> Scorecard:
    """dk.scale's predictions beside the one-page formula (overlap 0.5), communication flat in
    N (two servers' worth), no communication and full overlap."""
    setups = _setups(setups)
    return Scorecard(
        (
            ("dk.scale", check(setups)),
            ("one page, overlap 0.5", check(setups, overlap=ONE_PAGE_OVERLAP)),
            ("flat in N (two servers)", flat_in_workers(setups)),
            ("no communication", ignoring_communication(setups)),
            ("full overlap", check(setups, overlap=1.0)),
        )
    )


@dataclass(frozen=True)
class Sensitivity:
    """Predicted efficiency of every setup as the two assumptions change."""

    grid: tuple[tuple[float, float | None], ...]  # (share, overlap; None: the timeline)
    table: tuple[tuple[Setup, tuple[float, ...]], ...]

    def hits(self) -> tuple[int, ...]:
        """Setups within the tolerance, for each (share, overlap)."""
        return tuple(
            sum(abs(effs[i] - s.published) <= TOLERANCE for s, effs in self.table)
            for i in range(len(self.grid))
        )

    def _repr_html_(self) -> str:
        heads = ("setup", "compute from", "published") + tuple(
            f"share {a:g}, {'timeline' if o is None else f'overlap {o:g}'}" for a, o in self.grid
        )
        rows = [
            (s.key, s.compute_from, f"{s.published:.0%}", *(f"{e:.0%}" for e in effs))
            for s, effs in self.table
        ]
        rows.append(("within 10 points", "", "", *self.hits()))
        caption = (
            "predicted efficiency as the assumptions change (the share of peak moves only "
            "the runs whose compute is counted in FLOPs)"
        )
        return html_table(heads, rows, caption)


def sensitivity(
    shares: tuple[float, ...] = (0.4, 0.5, 0.6),
    overlaps: tuple[float | None, ...] = (None, 0.0, 1.0),
    setups=None,
) -> Sensitivity:
    """Every setup under every (sustained share, overlap) pair (pure)."""
    grid = tuple((a, o) for a in shares for o in overlaps)
    table = tuple(
        (s, tuple(s.efficiency(overlap=o, share=a) for a, o in grid)) for s in _setups(setups)
    )
    return Sensitivity(grid, table)


def __getattr__(name: str):
    if name == "SETUPS":  # the run list lives in ddlkit.scale.runs
        from ddlkit.scale.runs import SETUPS

        return SETUPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
