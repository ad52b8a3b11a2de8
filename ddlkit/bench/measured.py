"""What a benchmark measured, case by case, assembled into bench.json's typed records.

    result = BenchResult(bench_id, bench_dir, [CaseResult(case) for case in cases], cores, 1)
    result.cases[0].runs.append(measure)     # as the runs finish (ddlkit.bench.run)
    result.write()                            # bench.json via ddlkit.bench.schema
    result.results()                          # the one table (ddlkit.bench.results)

Pure apart from :meth:`BenchResult.write` and :func:`machine_info`: the medians and
spreads, scaling against x1 and single-x1, communication share and time to target of
every case (:mod:`ddlkit.bench.stats`) become :class:`~ddlkit.bench.schema.CaseRecord`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlkit.bench.config import BenchCase
from ddlkit.bench.overhead import Overhead
from ddlkit.bench.schema import SCHEMA_VERSION, BenchFile, CaseRecord, Machine, write_atomic
from ddlkit.bench.stats import (
    RunMeasure,
    Scaling,
    Spread,
    communication,
    scaling,
    stability,
    summarize,
)


@dataclass
class CaseResult:
    """What a case measured: every repeat, or why it was skipped or failed."""

    case: BenchCase
    runs: list[RunMeasure] = field(default_factory=list)
    error: str = ""
    profile: RunMeasure | None = None  # Horovod: one extra run with the timeline on

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.error and not self.case.skip

    def spread(self, attr: str) -> Spread | None:
        values = [getattr(r, attr) for r in self.runs]
        values = [v for v in values if v is not None]  # test_accuracy: None without the metric
        return summarize(values) if values else None

    def to_record(
        self,
        scale: Scaling | None,
        single: float | None = None,
        single_step: float | None = None,
        *,
        reference: float | None = None,
        ceiling: float | None = None,
    ) -> CaseRecord:
        """This case as bench.json holds it; `scale` and `single`/`single_step` (single-x1's
        throughput and step time), `reference` (reference-x1's throughput) and `ceiling`
        (independent-xN's, N this case's workers) give the numbers against other cases."""
        c = self.case
        repeat_ratio, unstable = stability([r.examples_per_sec for r in self.runs])
        rate, step = self.spread("examples_per_sec"), self.spread("step_time")
        foreign = [r.foreign_cpu for r in self.runs if r.foreign_cpu is not None]
        p = self.profile
        comm = communication(
            c.strategy,
            step and step.median,
            p and p.comm_ms_per_step,
            single_step,
            workers=c.workers,
            profiled_step_time=p and p.step_time,
        )
        return CaseRecord(
            name=c.name,
            strategy=c.strategy,
            workers=c.workers,
            steps=c.steps,
            batch=c.batch,
            repeats=c.repeats,
            model=c.model,
            eval_every=c.eval_every,
            eval_examples=c.eval_examples,
            skipped=c.skip or None,
            error=self.error or None,
            runs=tuple(self.runs),
            examples_per_sec=rate,
            step_time=step,
            test_accuracy=self.spread("test_accuracy"),
            foreign_cpu=summarize(foreign) if foreign else None,
            comm=comm,
            profile_run=p,
            speedup=scale.speedup if scale else None,
            efficiency=scale.efficiency if scale else None,
            # against one device without a strategy: what distribution buys overall
            vs_single=rate.median / single if rate and single else None,
            vs_reference=rate.median / reference if rate and reference else None,
            vs_ceiling=rate.median / ceiling if rate and ceiling and c.workers > 1 else None,
            repeat_ratio=repeat_ratio,
            unstable=unstable,
            arch=c.arch,
            **self._target(),
        )

    def to_dict(
        self, scale: Scaling | None, single: float | None = None, single_step: float | None = None
    ) -> dict:
        return self.to_record(scale, single, single_step).to_json()

    def _target(self) -> dict[str, Any]:
        reached = [r.seconds_to_target for r in self.runs if r.seconds_to_target is not None]
        note = None
        if not self.case.eval_every:
            note = "not measured: no held-out evaluations (eval_every 0)"
        elif self.runs and len(reached) < len(self.runs):
            best = max((r.best_eval_accuracy or 0.0) for r in self.runs)
            note = (
                f"not reached in {self.case.steps} steps by {len(self.runs) - len(reached)} "
                f"of {len(self.runs)} runs (best held-out accuracy {best:.3f})"
            )
        return {
            "seconds_to_target": summarize(reached) if reached else None,
            "target_reached": f"{len(reached)}/{len(self.runs)}",
            "target_note": note,
        }


@dataclass
class BenchResult:
    bench_id: str
    bench_dir: Path
    cases: list[CaseResult]
    cores: tuple[int, ...]
    cores_per_worker: int
    quick: bool = False
    overhead: Overhead | None = None
    overhead_error: str = ""
    started: float = field(default_factory=time.time)
    wall_seconds: float = 0.0
    target: float = 0.95
    command: str = ""
    machine: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.bench_dir / "bench.json"

    @property
    def plot_path(self) -> Path:
        return self.bench_dir / "bench.png"

    def rates(self, arch: str = "cnn") -> dict[tuple[str, int], float]:
        """Median examples/s of the measured cases of one arch, by (strategy, workers): a
        case is compared only with cases that trained the same model."""
        return {
            (r.case.strategy, r.case.workers): r.spread("examples_per_sec").median
            for r in self.cases
            if r.ok and r.case.arch == arch
        }

    def scaling(self, arch: str = "cnn") -> dict[tuple[str, int], Scaling]:
        return scaling(self.rates(arch))

    def _record(self, r: CaseResult) -> CaseRecord:
        """A case's record against single-x1, reference-x1 and independent-xN of its arch."""
        arch = r.case.arch
        rates = self.rates(arch)
        base = [
            b for b in self.cases if b.ok and b.case.arch == arch and b.case.strategy == "single"
        ]
        return r.to_record(
            self.scaling(arch).get((r.case.strategy, r.case.workers)),
            base[0].spread("examples_per_sec").median if base else None,
            base[0].spread("step_time").median if base else None,
            reference=rates.get(("reference", 1)),
            ceiling=rates.get(("independent", r.case.workers)),
        )

    def to_record(self) -> BenchFile:
        """The benchmark so far as bench.json's typed model."""
        return BenchFile(
            bench_id=self.bench_id,
            created=self.started,
            machine=Machine.of(self.cores, self.cores_per_worker, self.machine),
            cases=tuple(self._record(r) for r in self.cases),
            quick=self.quick,
            wall_seconds=self.wall_seconds,
            command=self.command,
            target_accuracy=self.target,
            overhead=self.overhead.to_record() if self.overhead else None,
            overhead_error=self.overhead_error or None,
            schema=SCHEMA_VERSION,
        )

    def to_dict(self) -> dict:
        """bench.json's content (:meth:`to_record` as JSON)."""
        return self.to_record().to_json()

    def write(self) -> Path:
        """bench.json, atomically (a reader never sees half a file)."""
        return write_atomic(self.to_record(), self.path)

    def results(self):
        """The benchmark as :func:`ddlkit.bench.results.load_results` reads it back (the
        one table: the CLI prints it, a notebook shows it)."""
        from ddlkit.bench.results import from_file

        return from_file(self.to_record(), self.path)

    def _repr_html_(self) -> str:
        return self.results()._repr_html_()


def machine_info() -> dict:
    """What ran the benchmark: CPU model, versions, load averages now (for bench.json)."""
    import platform
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    model = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((ln.split(":", 1)[1].strip() for ln in lines if "model name" in ln), "")
    return {
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "tensorflow": version("tensorflow-cpu") or version("tensorflow"),
        "horovod": version("horovod"),
        "load_start": list(os.getloadavg()),
    }
