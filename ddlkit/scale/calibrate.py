"""This machine as the model's hardware: from a bench.json and notebook 05's all-reduce fit.

    cal = dk.scale.calibrate("notebooks/data/bench-full.json",
                             "notebooks/data/allreduce-horovod.json", spec)
    cal             # the parameters, and predicted vs measured for 2 workers
    cal.hardware    # use it like any preset: dk.scale.predict(spec, cal.hardware, 8)

Where each parameter comes from (all measured here, nothing assumed):

- sustained FLOP/s of one core: ``3 x forward FLOPs x batch / step`` of the benchmark's
  ``single-x1`` case (one process, no strategy);
- the strategy's own work per step: its ``x1`` step minus ``single-x1``'s (Horovod's
  optimizer wrapper and background thread, with nothing to all-reduce);
- two processes side by side: ``independent-x2``'s step / ``single-x1``'s (two workers
  that never communicate: shared memory bandwidth, caches, other processes);
- the link: notebook 05 fits ``t = a + n / B`` to Horovod all-reduce times of 2 ranks;
  a ring of 2 takes ``2 a_hop + n / B``, so hop latency ``a / 2`` and bandwidth ``B``.

On a CPU the all-reduce runs on the cores that compute, so ``overlap = 0`` here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import Accelerator, Hardware, Link
from ddlkit.scale.models import ModelSpec
from ddlkit.scale.predict import Prediction, predict

CPU_MEMORY = 24e9  # bytes; only shown, the model does not use memory


def _bench(bench):
    from ddlkit.bench.schema import BenchFile, read

    return bench if isinstance(bench, BenchFile) else read(bench)[0]


def _fit(allreduce) -> tuple[float, float]:
    """(latency, bandwidth) from an AllreduceTiming, its dict or JSON file, or a pair."""
    from ddlkit.horovod.timing import AllreduceTiming

    if isinstance(allreduce, tuple) and len(allreduce) == 2:
        return float(allreduce[0]), float(allreduce[1])
    if isinstance(allreduce, str | Path):
        try:
            allreduce = json.loads(Path(allreduce).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"cannot read the all-reduce timing {allreduce}: {exc}. Fix: pass the JSON "
                f"AllreduceTiming.to_dict() wrote (notebook 05), or (latency, bandwidth)"
            ) from None
    if isinstance(allreduce, dict):
        allreduce = AllreduceTiming.from_dict(allreduce)
    if not isinstance(allreduce, AllreduceTiming):
        raise ConfigError(
            f"allreduce={type(allreduce).__name__}: pass an AllreduceTiming "
            f"(dk.horovod.allreduce_timing), its JSON file, or (latency, bandwidth)"
        )
    return allreduce.fit()


def _case(doc, name: str):
    for case in doc.cases:
        if case.name == name and case.step_time is not None:
            return case
    have = ", ".join(c.name for c in doc.cases if c.step_time is not None)
    raise ConfigError(
        f"bench.json has no measured case {name!r} (measured: {have}). "
        f"Fix: run `ddlkit bench` with that strategy, or pass strategy= one that ran"
    )


@dataclass(frozen=True)
class Calibration:
    """This machine's parameters and the 2-worker prediction next to the measurement."""

    model: ModelSpec
    strategy: str
    hardware: Hardware
    single_step: float  # single-x1
    own_step: float  # the strategy's x1
    side_by_side: float  # independent-x2 step / single-x1 step
    latency: float  # the fit's a (seconds)
    bandwidth: float  # the fit's B (bytes/s)
    prediction: Prediction  # 2 workers
    measured_step: float  # the strategy's x2
    measured_comm: float | None  # ms/step of all-reduce in its timeline, seconds

    @property
    def measured_efficiency(self) -> float:
        return self.own_step / self.measured_step

    @property
    def predicted_efficiency(self) -> float:
        return self.own_step / self.prediction.step

    @property
    def difference(self) -> float:
        """Measured minus predicted step, seconds."""
        return self.measured_step - self.prediction.step

    HEADERS = ("quantity", "predicted", "measured", "how")

    def rows(self) -> list[tuple]:
        p, ms = self.prediction, 1e3
        comm = None if self.measured_comm is None else f"{self.measured_comm * ms:.1f}"
        return [
            (
                "step of 1 worker ms",
                None,
                f"{self.own_step * ms:.1f}",
                f"{self.strategy}-x1 (single-x1 {self.single_step * ms:.1f} + the strategy's "
                f"own {(self.own_step - self.single_step) * ms:+.1f})",
            ),
            (
                "compute of each of 2 workers ms",
                f"{p.compute * ms:.1f}",
                None,
                f"x1 step x {self.side_by_side:.3f} (independent-x2 / single-x1)",
            ),
            (
                "all-reduce per step ms",
                f"{p.communication * ms:.1f}",
                comm,
                f"a + S/B = {self.latency * ms:.2f} + {self.model.param_bytes() / 1e6:.2f} MB / "
                f"{self.bandwidth / 1e9:.3f} GB/s; measured: rank 0's timeline",
            ),
            (
                "step of 2 workers ms",
                f"{p.step * ms:.1f}",
                f"{self.measured_step * ms:.1f}",
                "compute + all-reduce (overlap 0)",
            ),
            (
                "examples/s",
                f"{p.throughput:,.0f}",
                f"{2 * self.model.batch / self.measured_step:,.0f}",
                "2 x batch / step",
            ),
            (
                "efficiency vs 1 worker",
                f"{self.predicted_efficiency:.1%}",
                f"{self.measured_efficiency:.1%}",
                "x1 step / x2 step",
            ),
        ]

    def caption(self) -> str:
        d = self.difference
        return (
            f"{self.strategy}, 2 workers on this machine: the measured step is "
            f"{d * 1e3:+.1f} ms ({d / self.measured_step:+.0%}) from the prediction. Left out "
            f"of the model: waiting for the slower rank, Horovod's negotiation cycle, and the "
            f"machine's load and the ranks' placement when the fit was measured (unpinned "
            f"ranks' small all-reduces vary from one start to the next)"
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def calibrate(bench, allreduce, model: ModelSpec, *, strategy: str = "horovod") -> Calibration:
    """Parameters of this machine from ``bench`` (a bench.json, its run directory or a
    BenchFile) and ``allreduce`` (notebook 05's timing); the 2-worker prediction."""
    doc = _bench(bench)
    latency, bandwidth = _fit(allreduce)
    single = _case(doc, "single-x1").step_time.median
    own = _case(doc, f"{strategy}-x1").step_time.median
    pair = _case(doc, "independent-x2").step_time.median
    x2 = _case(doc, f"{strategy}-x2")
    if x2.batch and x2.batch != model.batch:
        raise ConfigError(
            f"the benchmark ran batch {x2.batch} per worker, the model has {model.batch}. "
            f"Fix: model.with_batch({x2.batch})"
        )
    side = pair / single
    sustained = model.train_flops / (own * side)
    cpu = Accelerator(
        "this CPU, 1 core per worker",
        sustained,
        CPU_MEMORY,
        None,
        f"{strategy}-x1 and independent-x2 of {doc.bench_id}",
    )
    link = Link("loopback (fit)", bandwidth, latency / 2, "notebook 05's all-reduce fit, a/2")
    cores = len(doc.machine.cores) // max(1, doc.machine.cores_per_worker)
    hw = Hardware(cpu, max(1, cores), link, link)
    prediction = predict(model, hw, 2, "ring", overlap=0.0)
    comm = x2.comm.ms_per_step / 1e3 if x2.comm and x2.comm.ms_per_step else None
    return Calibration(
        model,
        strategy,
        hw,
        single,
        own,
        side,
        latency,
        bandwidth,
        prediction,
        x2.step_time.median,
        comm,
    )
