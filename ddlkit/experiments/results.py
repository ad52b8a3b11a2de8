"""An experiment read back: the measured cases, the model's costs and the predictions.

    exp = Experiment.load("runs/bench-.../")     # bench.json + experiment.json
    exp.table()                                   # the benchmark's one table
    exp.plot()                                    # throughput and efficiency
    exp.predict("DGX-A100")                       # 1 to 1,024 workers, every strategy
    exp.to_json()                                 # what ``ddlkit experiment --json`` writes

Predictions (:mod:`ddlkit.scale`) take the model's own costs: its gradient bytes and
tensors, and the training FLOPs TensorFlow's profiler counted. On this machine
(:meth:`Experiment.here`) the compute is the measured step and the links are the recorded
all-reduce fits (``dk.scale.calibrate``); on a preset or a described cluster
(:meth:`Experiment.predict`) the compute is the FLOPs at the accelerator's sustained share of
its peak. The assumptions are listed beside every prediction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlkit.bench.results import Table
from ddlkit.errors import ConfigError
from ddlkit.experiments.spec import ModelCosts

ROOT = Path(__file__).resolve().parents[2]
FILE = "experiment.json"
# The recorded all-reduce fits of this kit's transports (notebooks 05a and 09):
FITS = {
    "horovod": ROOT / "notebooks" / "data" / "allreduce-horovod.json",
    "multi_worker": ROOT / "notebooks" / "data" / "allreduce-mwms.json",
}
SIZES = tuple(2**i for i in range(11))  # 1 to 1,024 workers
# Horovod's background loop as the kit's Horovod 0.28 runs it: a cycle every 1 ms
# (SetCycleTimeMs(1) in BackgroundThreadLoop, horovod/common/operations.cc); dk.scale's
# default, 5 ms, is the Horovod of the published runs. MultiWorkerMirrored has no loop: its
# collective starts when the pack is ready (a cycle too short to wait on).
HOROVOD_CYCLE, NO_CYCLE = 1e-3, 1e-9
# How each strategy synchronises, in the scaling model's terms (dk.scale.Algorithm):
# Horovod: its fusion buffers over a ring (NCCL's or MPI's); MultiWorkerMirrored: every
# gradient packed into one all-reduce (CollectiveAllReduce, bytes_per_pack=0); the
# parameter server: synchronous pushes and pulls, one ps task per node.
ALGORITHMS = {"horovod": "ring", "multi_worker": "ring", "parameter_server": "ps"}
# How each strategy is calibrated on this machine: the transport whose recorded fit it runs
# over, and its kind in the scaling model (one parameter-server worker is asynchronous).
CALIBRATED = {
    "horovod": ("horovod", "ring"),
    "multi_worker": ("multi_worker", "ring"),
    "parameter_server": ("multi_worker", "async_ps"),
}
ASSUMPTIONS = (
    "weak scaling: every worker keeps the measured per-worker batch",
    "compute: the training step's FLOPs by TensorFlow's profiler, at the accelerator's "
    "sustained share of peak (dk.scale.SUSTAINED_SHARE), with no per-step floor (kernel "
    "launches, Python): a model whose step is far below a millisecond is predicted "
    "communication-bound; on this machine the measured step",
    "gradients: the model's own bytes and tensors, ready in the backward pass as the costs "
    "say; Horovod fuses them over its 1 ms cycle (Horovod 0.28's; dk.scale's step timeline), "
    "MultiWorkerMirrored "
    "packs them into one all-reduce after the backward pass, the parameter server pushes "
    "them as they are ready and pulls after the backward pass (one ps task per node)",
    "stragglers: each step waits for the slowest of N workers at the hardware's jitter",
    "left out: congestion from other jobs, the all-reduce slowing the backward pass it "
    "overlaps, input pipelines that cannot keep up: exp.sensitivity() re-predicts with each",
)


@dataclass
class Experiment:
    """A finished experiment: its directory, bench.json's results and the model's costs."""

    directory: Path
    costs: ModelCosts
    results: Any  # ddlkit.bench.results.BenchResults
    predictions: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, directory: str | Path, *, costs: ModelCosts | None = None) -> Experiment:
        from ddlkit.bench.results import load_results

        directory = Path(directory)
        saved = directory / FILE
        if costs is None:
            if not saved.exists():
                raise ConfigError(
                    f"{directory} has no {FILE}. Fix: pass the directory an experiment wrote "
                    f"(runs/<bench-id>/)"
                )
            costs = ModelCosts.from_json(json.loads(saved.read_text())["costs"])
        return cls(directory, costs, load_results(directory / "bench.json"))

    # ---- the model as the scaling model sees it
    def spec(self, strategy: str = "horovod"):
        """The model's costs as a :class:`ddlkit.scale.ModelSpec` (the step's FLOPs / 3 as the
        forward FLOPs, so that ModelSpec's 3x gives back TensorFlow's own count), its
        gradients ready as the costs say; MultiWorkerMirrored's one pack leaves after the
        backward pass, so for it every gradient is ready at the end."""
        from ddlkit.bench.ratio import TRAIN_FLOPS_FACTOR
        from ddlkit.scale import ModelSpec

        c = self.costs
        ready = tuple(tuple(r) for r in c.readiness)
        if _options(strategy).get("packed") and ready:  # one pack after the backward pass
            ready = ((1.0, sum(int(r[1]) for r in ready), sum(int(r[2]) for r in ready)),)
        return ModelSpec(
            c.name,
            float(c.params),
            c.train_flops / TRAIN_FLOPS_FACTOR,
            c.batch,
            max(1, len(c.gradients)),
            "TensorFlow's profiler on the user's model (training step / 3)",
            gradients=ready,
        )

    def _algorithm(self, strategy: str, hardware, workers: int):
        from ddlkit.scale.predict import Algorithm

        options = _options(strategy)
        kind = ALGORITHMS[strategy]
        if options.get("server_per_node"):
            return Algorithm(kind, servers=hardware.nodes(workers))
        if options.get("packed"):  # one pack, all-reduced as soon as it is ready
            pack = float(self.costs.total_gradient_bytes) or None
            return Algorithm(kind, cycle_time=options["cycle"], fusion_bytes=pack)
        return Algorithm(kind, cycle_time=options["cycle"])

    def sensitivity(self, hardware, workers: int, strategy: str = "horovod"):
        """How far each effect the prediction leaves out moves it (dk.scale.sensitivity)."""
        from ddlkit.scale import node, sensitivity

        hw = node(hardware) if isinstance(hardware, str) else hardware
        return sensitivity(self.spec(strategy), hw, workers,
                           self._algorithm(strategy, hw, workers))  # fmt: skip

    def predict(self, hardware, *, workers=SIZES, strategies=tuple(ALGORITHMS)) -> list[dict]:
        """Efficiency and throughput of ``workers`` workers on ``hardware`` (a node preset
        name, or a ``dk.scale`` Hardware), one row per strategy and size."""
        from ddlkit.scale import node
        from ddlkit.scale.predict import predict

        hw = node(hardware) if isinstance(hardware, str) else hardware
        label = hardware if isinstance(hardware, str) else _described(hw)
        rows = []
        for strategy in strategies:
            for n in workers:
                p = predict(self.spec(strategy), hw, n, self._algorithm(strategy, hw, n))
                rows.append(_row(label, strategy, p))
        return rows

    def here(self, *, workers=SIZES) -> tuple[list[dict], list[str]]:
        """This machine's cores as the cluster: each strategy calibrated on the measured
        cases (dk.scale.calibrate) and the recorded fits; and why a strategy is left out."""
        from ddlkit.scale import calibrate
        from ddlkit.scale.predict import predict

        rows, left_out = [], []
        names = {c.name for c in self.results.measured}
        for strategy in ALGORITHMS:
            need = {"single-x1", "independent-x2", f"{strategy}-x1", f"{strategy}-x2"}
            if not need <= names:
                missing = ", ".join(sorted(need - names))
                left_out.append(f"{strategy}: not measured ({missing})")
                continue
            via, kind = CALIBRATED[strategy]
            spec = self.spec(strategy)
            cal = calibrate(self.results.path, {via: FITS[via]}, spec,
                            strategies=[strategy])[strategy]  # fmt: skip
            for n in workers:  # as calibrate predicts: no overlap on a CPU's shared cores
                p = predict(spec, cal.hardware, n, kind, overlap=0.0)
                rows.append(_row("this machine (calibrated)", strategy, p))
        return rows, left_out

    # ---- what a reader sees
    def table(self):
        """The benchmark's one table of the measured cases (BenchResults shows as it)."""
        return self.results

    def plot(self):
        """Throughput and scaling efficiency of every case (the benchmark's plots)."""
        import matplotlib.pyplot as plt

        from ddlkit.bench import plots

        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
        plots.throughput(self.results, left, arch="user")
        plots.efficiency(self.results, right, arch="user")
        fig.suptitle(f"{self.costs.name}: every strategy on this machine")
        fig.tight_layout()
        return fig

    def cases(self) -> list[dict]:
        out = []
        for c in self.results.cases:
            rate = c.throughput
            out.append({
                "case": c.name,
                "strategy": c.strategy,
                "workers": c.workers,
                "examples_per_s": rate.median if rate else None,
                "examples_per_s_range": [rate.min, rate.max] if rate else None,
                "step_s": c.step_time.median if c.step_time else None,
                "vs_single": c.vs_single,
                "ceiling_ratio": c.vs_ceiling,
                "efficiency": c.efficiency,
                "test_accuracy": c.test_accuracy.median if c.test_accuracy else None,
                "seconds_to_target": c.time_to_target.median if c.time_to_target else None,
                "skipped": c.skipped or None,
                "error": c.error or None,
            })  # fmt: skip
        return out

    def to_json(self, *, hardware=()) -> dict[str, Any]:
        here, left_out = self.here()
        predicted = here + [row for hw in hardware for row in self.predict(hw)]
        moved = []
        for hw in hardware:  # how far what the model leaves out moves its largest size
            s = self.sensitivity(hw, SIZES[-1])
            moved.append({
                "where": hw if isinstance(hw, str) else _described(hw),
                "strategy": "horovod", "workers": SIZES[-1], "efficiency": s.base.efficiency,
                "low": s.low, "high": s.high,
                "variants": [{"effect": v.effect, "how": v.how,
                              "efficiency": v.prediction.efficiency} for v in s.variants],
            })  # fmt: skip
        return {
            "experiment": self.costs.name,
            "bench": self.results.bench_id,
            "costs": self.costs.to_json(),
            "cases": self.cases(),
            "predictions": predicted,
            "predictions_left_out": left_out,
            "assumptions": list(ASSUMPTIONS),
            "sensitivity": moved,
        }

    def write(self, path: str | Path | None = None, *, hardware=()) -> Path:
        """experiment.json (atomically) in the experiment's directory, or at ``path``."""
        target = Path(path) if path else self.directory / FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(hardware=hardware), indent=1) + "\n")
        tmp.replace(target)
        return target

    def costs_table(self) -> Table:
        return Table(ModelCosts.HEADERS, tuple(self.costs.rows()), f"{self.costs.name} at batch "
                     f"{self.costs.batch} per worker")  # fmt: skip

    def _repr_html_(self) -> str:
        return self.costs_table()._repr_html_() + self.results._repr_html_()


def _options(strategy: str) -> dict:
    """How the scaling model runs ``strategy``'s synchronisation (pure)."""
    return {
        "horovod": {"cycle": HOROVOD_CYCLE},
        "multi_worker": {"cycle": NO_CYCLE, "packed": True},
        "parameter_server": {"server_per_node": True},
    }[strategy]


def _described(hw) -> str:
    """A cluster as a row names it: its accelerators per node and network."""
    return f"{hw.per_node} x {hw.accelerator.name} per node, {hw.inter.name}"


def _row(where: str, strategy: str, p) -> dict:
    return {
        "where": where,
        "strategy": strategy,
        "algorithm": p.algorithm.label(),
        "workers": p.workers,
        "efficiency": p.efficiency,
        "examples_per_s": p.throughput,
        "step_s": p.step,
        "compute_s": p.compute,
        "exposed_comm_s": p.exposed,
    }


def prediction_table(rows: list[dict], sizes=(1, 8, 64, 512, 1024)) -> Table:
    """Efficiency by strategy (rows) and workers (columns)."""
    keyed = {(r["where"], r["strategy"], r["workers"]): r["efficiency"] for r in rows}
    lines = sorted({(r["where"], r["strategy"]) for r in rows})
    body = [
        (where, strategy, *(f"{keyed[(where, strategy, n)]:.0%}" if (where, strategy, n) in keyed
                            else "-" for n in sizes))
        for where, strategy in lines
    ]  # fmt: skip
    return Table(("where", "strategy", *(f"x{n}" for n in sizes)), tuple(body),
                 "predicted efficiency")  # fmt: skip
