"""This machine as the model's hardware, for every strategy: a bench.json and the all-reduce fits.

    cal = dk.scale.calibrate("data/bench-full.json",
                             {"horovod": "data/allreduce-horovod.json",
                              "multi_worker": "data/allreduce-mwms.json"}, spec)
    cal                     # each strategy's 2-worker step, predicted and measured
    cal["horovod"]          # one strategy, term by term
    cal["horovod"].hardware # use it like any preset: dk.scale.predict(spec, hw, 8)

Each strategy runs over its own transport here, and each transport has its recorded fit
``t = a + n / B`` (2 processes, each on its own core): Horovod's all-reduce over MPI, and
MultiWorkerMirroredStrategy's collective over TensorFlow's gRPC runtime, which also carries
the parameter server's pushes and pulls. A fit becomes a link whose hop latency is ``a / 2``
and bandwidth ``B`` (a ring of 2 takes ``2 a_hop + n / B``). Then, for each strategy:

- compute of a worker beside another: its *anchor* step ``x independent-x2 / single-x1``.
  One Horovod or MWMS worker communicates nothing, so the anchor is the strategy's x1 step
  (its compute and its own per-step work); one parameter-server worker already pushes and
  pulls every step, so its anchor is single-x1 and its x1 step is predicted too.
  ``independent-x2 / single-x1`` is what a second process costs a first one that never talks
  to it (the cores' shared caches and memory bandwidth).
- communication of 2 workers, with no overlap (on a CPU it runs on the cores that compute):
  Horovod and MWMS all-reduce every gradient as one buffer (Horovod's fusion buffer; TF's
  ``CollectiveAllReduce`` packs all gradients into one all-reduce when ``bytes_per_pack`` is
  0, its default), ``a + S / B``; the parameter server (one ps, asynchronous) has each worker
  loop over compute, push and pull, ``2 (a / 2 + S / B)``, unless the server saturates.

The measured step of a worker is ``workers x batch / examples/s`` (the median of the
repeats): a synchronous step, or an asynchronous worker's loop. A difference over 10% is
put next to the recorded measurements that account for it
(:meth:`StrategyCalibration.explanations`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import Accelerator, Hardware
from ddlkit.scale.models import ModelSpec
from ddlkit.scale.predict import Prediction, predict
from ddlkit.scale.transport import Transport, transport

CPU_MEMORY = 24e9  # bytes; only shown, the model does not use memory
TOLERANCE = 0.10  # of the measured step
# the strategies calibrated here, their algorithm in the model and the transport they use
STRATEGIES = {
    "horovod": ("ring", "horovod"),
    "multi_worker": ("ring", "multi_worker"),
    "parameter_server": ("async_ps", "multi_worker"),
}
TRANSPORT_NAMES = {"horovod": "MPI (Horovod's fit)", "multi_worker": "gRPC (MWMS's fit)"}


def _bench(bench):
    from ddlkit.bench.schema import BenchFile, read

    return bench if isinstance(bench, BenchFile) else read(bench)[0]


def _case(doc, name: str):
    for case in doc.cases:
        if case.name == name and case.step_time is not None:
            return case
    have = ", ".join(c.name for c in doc.cases if c.step_time is not None)
    raise ConfigError(
        f"bench.json has no measured case {name!r} (measured: {have}). "
        f"Fix: run `ddlkit bench` with that strategy, or calibrate the strategies that ran"
    )


@dataclass(frozen=True)
class StrategyCalibration:
    """One strategy's 2-worker step here: the model's terms next to the measurement."""

    strategy: str
    transport: Transport
    model: ModelSpec
    hardware: Hardware
    single_step: float  # single-x1
    own_step: float  # the strategy's x1
    anchor: str  # the case whose step is one worker's compute: the strategy's x1, or single-x1
    side_by_side: float  # independent-x2 step / single-x1 step
    one: Prediction  # 1 worker, as the model sees it
    prediction: Prediction  # 2 workers
    measured_step: float  # a worker's step (or async loop): workers x batch / examples/s
    measured_range: tuple[float, float]  # from the fastest and slowest repeat
    anchor_range: tuple[float, float]  # the anchor step's fastest and slowest repeat
    measured_comm: float | None = None  # Horovod: all-reduce per step in rank 0's timeline

    @property
    def predicted_step(self) -> float:
        p = self.prediction
        return p.workers * p.model.batch / p.throughput

    @property
    def difference(self) -> float:
        """Measured minus predicted step, seconds."""
        return self.measured_step - self.predicted_step

    @property
    def relative(self) -> float:
        return self.difference / self.measured_step

    @property
    def within(self) -> bool:
        return abs(self.relative) <= TOLERANCE

    def _with_comm(self, comm: float) -> float:
        """The predicted step with another communication time in place of the fit's."""
        return self.predicted_step - self.prediction.communication + comm

    def explanations(self) -> list[str]:
        """Each recorded measurement that accounts for a difference over 10% (empty: none
        needed, or none found)."""
        if self.within:
            return []
        out, measured, s = [], self.measured_step, self.model.param_bytes()
        point = self.transport.measured(s)
        if self.measured_comm is not None:
            step = self._with_comm(self.measured_comm)
            if abs(measured - step) <= TOLERANCE * measured:
                out.append(
                    f"rank 0's timeline counted {self.measured_comm * 1e3:.2f} ms of all-reduce "
                    f"a step against the fit's {self.prediction.communication * 1e3:.2f}: with "
                    f"it the prediction is {step * 1e3:.1f} ms"
                )
        if self.anchor == "single-x1":  # its x1 measured one worker's transfers in training
            one = self.own_step - self.single_step
            step = self._with_comm(one)
            if abs(measured - step) <= TOLERANCE * measured:
                out.append(
                    f"{self.strategy}-x1 measured one worker's push, pull and the server's "
                    f"work at {one * 1e3:.2f} ms a step ({self.strategy}-x1 - single-x1) "
                    f"against the fit's {self.one.communication * 1e3:.2f}: with it the "
                    f"prediction is {step * 1e3:.1f} ms"
                )
        if point is not None and self.prediction.algorithm.kind == "ring":
            step = self._with_comm(point[0])
            if abs(measured - step) <= TOLERANCE * measured:
                out.append(
                    f"the all-reduce measured at {s / 1e6:.2f} MB took {point[0] * 1e3:.2f} ms "
                    f"(between its recorded sizes) where the fit says "
                    f"{self.transport.fitted(s) * 1e3:.2f}: with it the prediction is "
                    f"{step * 1e3:.1f} ms"
                )
        low, high = self.predicted_range()
        if low <= self.measured_range[1] and self.measured_range[0] <= high:
            out.append(
                f"the repeats overlap: measured {self.measured_range[0] * 1e3:.1f}-"
                f"{self.measured_range[1] * 1e3:.1f} ms, predicted {low * 1e3:.1f}-"
                f"{high * 1e3:.1f} ms from the fastest and slowest {self.anchor} and transfer"
            )
        return out

    def predicted_range(self) -> tuple[float, float]:
        """The prediction from the fastest and the slowest repeat of its measured inputs
        (the anchor step, and the transfer at this size where the fit's points hold it)."""
        p = self.prediction
        point = self.transport.measured(self.model.param_bytes())
        scale = p.communication / self.transport.fitted(self.model.param_bytes())
        comms = (point[1] * scale, point[2] * scale) if point else (p.communication,) * 2
        low, high = (step * self.side_by_side for step in self.anchor_range)
        return low + comms[0], high + comms[1]

    def verdict(self) -> str:
        if self.within:
            return f"within {TOLERANCE:.0%}"
        found = self.explanations()
        return "; ".join(found) if found else "not explained by the recorded measurements"

    HEADERS = ("quantity", "predicted", "measured", "how")

    def rows(self) -> list[tuple]:
        p, ms, t = self.prediction, 1e3, self.transport
        comm = None if self.measured_comm is None else f"{self.measured_comm * ms:.2f}"
        how_comm = (
            "2 (a/2 + S/B) per worker: push, pull (one ps)"
            if p.algorithm.kind == "async_ps"
            else "a + S/B: one all-reduce of every gradient"
        )
        return [
            (
                "step of 1 worker ms",
                f"{self.one.step * ms:.1f}",
                f"{self.own_step * ms:.1f}",
                f"{self.strategy}-x1"
                + (" (the anchor)" if self.anchor != "single-x1" else ": single-x1 + push + pull"),
            ),
            (
                "compute of each of 2 workers ms",
                f"{p.compute * ms:.1f}",
                None,
                f"{self.anchor} x {self.side_by_side:.3f} (independent-x2 / single-x1)",
            ),
            (
                "communication per step ms",
                f"{p.communication * ms:.2f}",
                comm,
                f"{how_comm}; {t.name}: a = {t.latency * ms:.2f} ms, "
                f"B = {t.bandwidth / 1e9:.3f} GB/s, S = {self.model.param_bytes() / 1e6:.2f} MB",
            ),
            (
                "step of each of 2 workers ms",
                f"{self.predicted_step * ms:.1f}",
                f"{self.measured_step * ms:.1f}",
                "2 x batch / examples/s (median of the repeats)",
            ),
        ]

    def caption(self) -> str:
        return (
            f"{self.strategy}, 2 workers here: measured {self.difference * 1e3:+.1f} ms "
            f"({self.relative:+.0%}) from the prediction; {self.verdict()}"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


@dataclass(frozen=True)
class Calibration:
    """Every calibrated strategy: predicted against measured, and why where they differ."""

    strategies: tuple[StrategyCalibration, ...]
    bench_id: str

    def __getitem__(self, strategy: str) -> StrategyCalibration:
        for s in self.strategies:
            if s.strategy == strategy:
                return s
        raise KeyError(f"{strategy!r} was not calibrated; these were: {list(self.names)}")

    def __iter__(self):
        return iter(self.strategies)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.strategy for s in self.strategies)

    HEADERS = ("strategy", "transport", "predicted ms", "measured ms", "difference", "why")

    def rows(self) -> list[tuple]:
        return [
            (
                s.strategy,
                s.transport.name,
                f"{s.predicted_step * 1e3:.1f}",
                f"{s.measured_step * 1e3:.1f}",
                f"{s.relative:+.0%}",
                s.verdict(),
            )
            for s in self
        ]

    def caption(self) -> str:
        return f"a worker's step with 2 workers on this machine ({self.bench_id})"

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())

    def plot(self, ax=None):
        """Predicted and measured step per strategy, with the measured repeats' range."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3))
        names = list(self.names)
        y = range(len(names))
        ax.barh(
            [i + 0.2 for i in y], [s.predicted_step * 1e3 for s in self], 0.4, label="predicted"
        )
        meas = [s.measured_step * 1e3 for s in self]
        err = [
            [m - s.measured_range[0] * 1e3 for m, s in zip(meas, self, strict=True)],
            [s.measured_range[1] * 1e3 - m for m, s in zip(meas, self, strict=True)],
        ]
        ax.barh([i - 0.2 for i in y], meas, 0.4, xerr=err, label="measured (repeats' range)")
        ax.set_yticks(list(y), names)
        ax.set_xlabel("ms per step of each of 2 workers")
        ax.legend(fontsize=8, loc="lower right")
        return ax


def _calibrate_one(doc, strategy: str, fit: Transport, model: ModelSpec) -> StrategyCalibration:
    kind, _ = STRATEGIES[strategy]
    single = _case(doc, "single-x1").step_time.median
    pair = _case(doc, "independent-x2").step_time.median
    x1, x2 = _case(doc, f"{strategy}-x1"), _case(doc, f"{strategy}-x2")
    if x2.batch and x2.batch != model.batch:
        raise ConfigError(
            f"the benchmark ran batch {x2.batch} per worker, the model has {model.batch}. "
            f"Fix: model.with_batch({x2.batch})"
        )
    side = pair / single
    link = fit.link
    # one worker's compute: a step that communicates nothing
    anchor = _case(doc, "single-x1" if kind == "async_ps" else f"{strategy}-x1")

    def machine(step: float, what: str) -> Hardware:  # each worker on its own core
        flops = model.train_flops / step
        # jitter 0: the measured steps are medians of the machine's own runs, waits included
        chip = Accelerator("this CPU, 1 core", flops, CPU_MEMORY, None, what)
        return Hardware(chip, 1, link, link, jitter=0.0)

    alone = machine(anchor.step_time.median, f"{anchor.name} of {doc.bench_id}")
    hw = machine(anchor.step_time.median * side, f"{anchor.name} x independent-x2 / single-x1")
    rate = x2.examples_per_sec

    def per_worker(examples_per_sec: float) -> float:
        return x2.workers * model.batch / examples_per_sec

    # the communication measured (Horovod's timeline), not estimated from the step times
    timeline = x2.comm and x2.comm.how.startswith("measured") and x2.comm.ms_per_step
    comm = x2.comm.ms_per_step / 1e3 if timeline else None
    return StrategyCalibration(
        strategy,
        fit,
        model,
        hw,
        single,
        x1.step_time.median,
        anchor.name,
        side,
        predict(model, alone, 1, kind, overlap=0.0),
        predict(model, hw, 2, kind, overlap=0.0),
        per_worker(rate.median),
        (per_worker(rate.max), per_worker(rate.min)),
        (anchor.step_time.min, anchor.step_time.max),
        comm,
    )


def calibrate(bench, allreduce, model: ModelSpec, *, strategies=None) -> Calibration:
    """Each strategy of ``bench`` (a bench.json, its run directory or a BenchFile) predicted
    from the all-reduce fits ``allreduce`` (``{"horovod": ..., "multi_worker": ...}``, each a
    file, an AllreduceTiming or ``(latency, bandwidth)``; one fit alone is Horovod's)."""
    doc = _bench(bench)
    fits = allreduce if isinstance(allreduce, dict) else {"horovod": allreduce}
    unknown = set(fits) - set(TRANSPORT_NAMES)
    if unknown:
        raise ConfigError(
            f"no transport {sorted(unknown)}: the fits are {list(TRANSPORT_NAMES)}. "
            f"Fix: allreduce={{'horovod': <MPI fit>, 'multi_worker': <gRPC fit>}}"
        )
    have = {name: transport(fit, TRANSPORT_NAMES[name]) for name, fit in fits.items()}
    wanted = strategies or [s for s, (_, via) in STRATEGIES.items() if via in have]
    out = []
    for strategy in wanted:
        if strategy not in STRATEGIES:
            raise ConfigError(f"cannot calibrate {strategy!r}. Fix: one of {', '.join(STRATEGIES)}")
        via = STRATEGIES[strategy][1]
        if via not in have:
            raise ConfigError(
                f"{strategy} runs over {TRANSPORT_NAMES[via]}, and no {via!r} fit was given. "
                f"Fix: allreduce={{..., {via!r}: 'data/allreduce-...json'}}"
            )
        out.append(_calibrate_one(doc, strategy, have[via], model))
    return Calibration(tuple(out), doc.bench_id)
