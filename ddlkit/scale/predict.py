"""One synchronous data-parallel step, predicted: compute + waiting + the communication exposed.

    p = dk.scale.predict(dk.scale.model("resnet101"), hw, 512, algorithm="ring")
    p                                     # a table: each term, its value and its formula
    p.efficiency, p.throughput, p.speedup

The model:

- compute ``C = 3 x forward FLOPs x batch / sustained FLOP/s``; the backward pass is
  ``2/3 C``, the forward ``1/3 C``.
- waiting for the slowest worker: a synchronous step starts its all-reduces when the last
  worker is ready. With each worker's compute varying by ``hardware.jitter`` (standard
  deviation / mean), the slowest of ``N`` finishes ``jitter x C x z(N)`` after the mean,
  ``z(N)`` the expected maximum of ``N`` standard normal draws (1.0 at 3, 2.3 at 16, 3.0 at
  512): Chen et al. 2016 (arXiv:1604.00981) measured this tail on real clusters.
- communication, by default (``overlap=None``) the step's timeline
  (:mod:`ddlkit.scale.timeline`): Horovod's background loop all-reduces in fused buffers
  whatever the backward pass has produced, cycle by cycle, each call costing NCCL's own
  latency model and the algorithm's bytes (:mod:`ddlkit.scale.comm`) at the achieved
  bandwidth; what runs while the backward pass runs is hidden, what runs after it is exposed.
  Its latency grows with ``N`` (``2(N-1)`` hops a ring call), so past one server the
  prediction keeps falling as workers are added, where the bytes alone (``2(N-1)/N S``) would
  stay nearly flat.
- ``overlap`` a number: the one-page formula of notebook 09 instead. ``M`` from
  :mod:`ddlkit.scale.comm` at line rate on ``S`` gradient bytes (4 per parameter, 2 with
  ``compression="fp16"``) in ``ceil(S / fusion_bytes)`` fused buffers (``fusion_bytes=None``:
  one per gradient tensor); a share ``overlap`` of it is hidden, at most as long as the
  backward pass:
  ``hidden = min(overlap x M, 2/3 C)``; ``exposed = M - hidden``. ``overlap=1`` is the
  ideal of a perfectly pipelined backward pass, ``0`` communication strictly after it. A
  synchronous parameter server's pull brings the parameters the next forward pass needs,
  so only its push (half of ``M``) can be hidden: ``hidden = min(overlap x M / 2, 2/3 C)``.
- the network: every term that leaves a node uses all its ports
  (:attr:`~ddlkit.scale.hardware.Hardware.node_link`): a DGX's eight, a VM's one.
- step ``T = C + wait + exposed``; throughput ``N x batch / T``; speed-up ``N C / T`` over one
  worker without communication; efficiency ``C / T``.
- asynchronous parameter server (``"async_ps"``): no barrier; each worker loops
  ``C + push + pull`` of its own gradients, and the servers take at most
  ``k B / S`` updates/s (push and pull are not synchronised, so a worker's own link,
  shared by its node, limits it: ``push + pull = 2 (a + g S / B)``). A gradient is
  applied to parameters that the other ``N - 1`` workers updated in the meantime:
  expected staleness ``N - 1`` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.scale import comm
from ddlkit.scale.hardware import Hardware
from ddlkit.scale.models import BACKWARD_SHARE, ModelSpec
from ddlkit.scale.timeline import HOROVOD_CYCLE_TIME, timeline

KINDS = ("ring", "tree", "binary_tree", "halving_doubling", "hierarchical", "ps", "async_ps")
# HOROVOD_FUSION_THRESHOLD's default in the Horovod of the published runs (2017-18); Horovod
# 0.28 defaults to 128 MiB (horovod/common/operations.cc). One fixed assumption for every setup.
FUSION_BYTES = 64 * 2**20
DEFAULT_OVERLAP = None  # the timeline; a number: the one-page formula's fixed share
ONE_PAGE_OVERLAP = 0.5  # the share the one-page formula hides, where one is wanted


def expected_max(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal draws (0 for one), by
    integrating ``x n phi(x) Phi(x)^(n-1)`` over [-8, 8]."""
    if n <= 1:
        return 0.0
    return _EXPECTED_MAX.get(n) or _EXPECTED_MAX.setdefault(n, _integrate_max(n))


_EXPECTED_MAX: dict[int, float] = {}


def _integrate_max(n: int) -> float:
    h, total, x = 1e-3, 0.0, -8.0
    while x < 8.0:
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * pdf * cdf ** (n - 1) * h
        x += h
    return total


@dataclass(frozen=True)
class Algorithm:
    """How gradients are synchronised, and the options that change its cost."""

    kind: str = "ring"
    across: str = "ring"  # hierarchical: the algorithm between nodes
    servers: int = 1  # ps, async_ps
    node_sum: bool = False  # ps: a node sums its accelerators' gradients, then pushes once
    fusion_bytes: float | None = FUSION_BYTES
    compression: str | None = None  # None or "fp16"
    overlap: float | None = DEFAULT_OVERLAP  # None: the timeline; a share: the one-page rule
    cycle_time: float = HOROVOD_CYCLE_TIME  # s between the background loop's cycles

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(
                f"unknown algorithm {self.kind!r}. Fix: use one of {', '.join(KINDS)}"
            )
        if self.across not in comm.FLAT:
            raise ConfigError(
                f"across={self.across!r} is not one of {', '.join(comm.FLAT)}. Fix: across='ring'"
            )
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ConfigError(f"servers={self.servers!r} must be an int >= 1. Fix: e.g. servers=4")
        if self.node_sum and self.kind != "ps":
            raise ConfigError(
                f"node_sum=True is for kind='ps' (a node sums its gradients before one push), "
                f"not {self.kind!r}. Fix: kind='ps', or leave node_sum out"
            )
        if self.fusion_bytes is not None and not (
            isinstance(self.fusion_bytes, int | float) and self.fusion_bytes > 0
        ):
            raise ConfigError(
                f"fusion_bytes={self.fusion_bytes!r} must be > 0 or None (no fusion). "
                f"Fix: e.g. fusion_bytes=64 * 2**20"
            )
        if self.compression not in (None, "fp16"):
            raise ConfigError(
                f"compression={self.compression!r} is not None or 'fp16'. Fix: compression='fp16'"
            )
        if self.overlap is not None and (
            isinstance(self.overlap, bool)
            or not isinstance(self.overlap, int | float)
            or not 0 <= self.overlap <= 1
        ):
            raise ConfigError(
                f"overlap={self.overlap!r} must be None (the step's timeline) or a share in "
                f"[0, 1]. Fix: leave it out, or e.g. overlap=0.5"
            )
        if (
            isinstance(self.cycle_time, bool)
            or not isinstance(self.cycle_time, int | float)
            or not 0 < self.cycle_time < 1
        ):
            raise ConfigError(
                f"cycle_time={self.cycle_time!r} must be seconds in (0, 1). "
                f"Fix: e.g. cycle_time=5e-3 (HOROVOD_CYCLE_TIME=5)"
            )

    @property
    def timeline(self) -> bool:
        """Whether the step's timeline decides what is hidden (``overlap=None``)."""
        return self.overlap is None and self.kind != "async_ps"

    @property
    def bytes_per_param(self) -> int:
        return 2 if self.compression == "fp16" else 4

    def buffers(self, model: ModelSpec) -> int:
        if self.fusion_bytes is None:
            return model.tensors
        return max(1, math.ceil(model.param_bytes(self.bytes_per_param) / self.fusion_bytes))

    def label(self) -> str:
        out = self.kind
        if self.kind == "hierarchical":
            out += f" (across: {self.across})"
        if self.kind in ("ps", "async_ps"):
            out += f", {self.servers} server{'s' * (self.servers > 1)}"
        if self.node_sum:
            out += ", summed per node"
        if self.compression:
            out += f", {self.compression}"
        return out


def algorithm_of(algorithm: str | Algorithm, **options) -> Algorithm:
    if isinstance(algorithm, Algorithm):
        if options:
            from dataclasses import replace

            return replace(algorithm, **options)
        return algorithm
    return Algorithm(algorithm, **options)


@dataclass(frozen=True)
class Prediction:
    """One step of ``workers`` data-parallel workers, term by term (seconds)."""

    model: ModelSpec
    hardware: Hardware
    workers: int
    algorithm: Algorithm
    compute: float
    communication: float
    hidden: float
    staleness: float | None = None  # async: expected updates between a pull and its push
    async_step: float | None = None  # async: seconds per update seen by the servers x N
    wait: float = 0.0  # for the slowest worker: jitter x compute x z(N)
    calls: int | None = None  # the timeline's all-reduce calls (a PS: pushes)

    def __post_init__(self) -> None:
        if not (
            self.compute > 0 and self.communication >= 0 and 0 <= self.hidden <= self.communication
        ):
            raise ConfigError(
                f"prediction terms compute={self.compute}, communication={self.communication},"
                f" hidden={self.hidden}: need compute > 0 and 0 <= hidden <= communication. "
                f"Fix: build predictions with dk.scale.predict"
            )

    @property
    def exposed(self) -> float:
        return self.communication - self.hidden

    @property
    def step(self) -> float:
        """Seconds per synchronous step (async: N / updates per second)."""
        if self.async_step is not None:
            return self.async_step
        return self.compute + self.wait + self.exposed

    @property
    def throughput(self) -> float:
        """Examples per second of all workers."""
        return self.workers * self.model.batch / self.step

    @property
    def speedup(self) -> float:
        """Over one worker that does not communicate."""
        return self.workers * self.compute / self.step

    @property
    def efficiency(self) -> float:
        return self.speedup / self.workers

    @property
    def nodes(self) -> int:
        return self.hardware.nodes(self.workers)

    HEADERS = ("term", "value", "formula")

    def rows(self) -> list[tuple]:
        a, ms = self.algorithm, 1e3
        if a.timeline:
            comm_how = f"{a.label()}: {self.calls} calls, NCCL latency + bytes / achieved B"
            hidden_how = "ran while the backward pass ran (the timeline)"
        else:
            comm_how = a.label()
            what = "push" if a.kind == "ps" else "comm"
            hidden_how = f"min({a.overlap:g} x {what}, 2/3 compute)"
        rows = [
            ("workers (nodes)", f"{self.workers} ({self.nodes})", f"{self.hardware.per_node}/node"),
            ("compute ms", f"{self.compute * ms:.2f}", "3 x FLOPs/example x batch / FLOP/s"),
            (
                "waiting for the slowest ms",
                f"{self.wait * ms:.2f}",
                f"{self.hardware.jitter:g} x compute x z({self.workers})",
            ),
            ("communication ms", f"{self.communication * ms:.2f}", comm_how),
            ("hidden behind backward ms", f"{self.hidden * ms:.2f}", hidden_how),
            ("exposed ms", f"{self.exposed * ms:.2f}", "comm - hidden"),
            ("step ms", f"{self.step * ms:.2f}", "compute + waiting + exposed"),
            ("throughput examples/s", f"{self.throughput:,.0f}", "N x batch / step"),
            ("speed-up", f"{self.speedup:.1f}", "N x compute / step"),
            ("efficiency", f"{self.efficiency:.1%}", "speed-up / N"),
        ]
        if self.staleness is not None:  # no barrier: nothing is hidden or exposed
            rows[3] = ("push + pull ms", rows[3][1], a.label())
            del rows[2]  # no barrier: no worker waits for another
            rows[3:6] = [
                (
                    "seconds per N updates ms",
                    f"{self.step * ms:.2f}",
                    "N / min(N / (compute + push + pull), k B / S)",
                )
            ]
            rows.append(("expected staleness (steps)", f"{self.staleness:g}", "N - 1"))
        return rows

    def caption(self) -> str:
        return (
            f"{self.model.name}, batch {self.model.batch}/worker, on "
            f"{self.hardware.accelerator.name} x {self.workers}"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def _check_workers(workers) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise ConfigError(f"workers={workers!r} is not an int. Fix: e.g. workers=8")
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1. Fix: e.g. workers=8")
    return workers


def communication(model: ModelSpec, hardware: Hardware, workers: int, algo: Algorithm) -> float:
    """Seconds one synchronisation of the model's gradients takes (:mod:`.comm`)."""
    n, g = _check_workers(workers), hardware.per_node
    nbytes, k = model.param_bytes(algo.bytes_per_param), algo.buffers(model)
    out = hardware.node_link  # every port of a node
    if algo.kind == "async_ps":
        return comm.ps_worker(nbytes, min(g, n), out, k)
    if algo.kind == "ps" and algo.node_sum:
        nodes, per_node = hardware.nodes(n), min(g, n)
        return comm.ps_node_summed(nbytes, per_node, nodes, algo.servers, hardware.intra, out, k)
    if algo.kind == "ps":
        return comm.parameter_server(nbytes, n, algo.servers, g, out, k)
    if n == 1:
        return 0.0
    if algo.kind == "hierarchical":
        nodes = hardware.nodes(n)
        per_node = min(g, n)
        return comm.hierarchical(nbytes, per_node, nodes, hardware.intra, out, k, algo.across)
    return comm.flat(nbytes, n, g, hardware.intra, out, k, algo.kind)


def predict(
    model: ModelSpec,
    hardware: Hardware,
    workers: int,
    algorithm: str | Algorithm = "ring",
    **options,
) -> Prediction:
    """The step of ``workers`` workers (pure). ``options`` are :class:`Algorithm` fields."""
    _check_workers(workers)
    algo = algorithm_of(algorithm, **options)
    compute = model.train_flops / hardware.accelerator.sustained_flops
    m = communication(model, hardware, workers, algo)
    if algo.kind == "async_ps":
        per_worker = compute + m  # push and pull of its own gradients, no barrier
        nbytes = model.param_bytes(algo.bytes_per_param)
        rate = min(workers / per_worker, comm.ps_capacity(nbytes, algo.servers, hardware.node_link))
        return Prediction(
            model,
            hardware,
            workers,
            algo,
            compute,
            m,
            0.0,
            staleness=float(workers - 1),
            async_step=workers / rate,
        )
    wait = hardware.jitter * compute * expected_max(workers)
    if algo.timeline:
        if workers == 1 and algo.kind != "ps":
            return Prediction(model, hardware, 1, algo, compute, 0.0, 0.0, calls=0)
        t = timeline(model, hardware, workers, algo, BACKWARD_SHARE * compute)
        spent = max(t.communication, t.exposed)  # a last cycle's wait counts as Horovod's
        hidden = spent - t.exposed
        return Prediction(
            model, hardware, workers, algo, compute, spent, hidden, None, None, wait, t.calls
        )
    can_hide = m / 2 if algo.kind == "ps" else m  # a PS's pull must come before the forward
    hidden = min(algo.overlap * can_hide, BACKWARD_SHARE * compute)
    return Prediction(model, hardware, workers, algo, compute, m, hidden, wait=wait)
