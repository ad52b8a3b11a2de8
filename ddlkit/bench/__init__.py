"""Strategy comparison benchmark: the same model, data and steps under every strategy.

Modules: :mod:`.config` (the cases, pure), :mod:`.stats` (throughput, step time,
median and spread, scaling efficiency, time to a target accuracy, communication share;
pure), :mod:`.cpu` (what other processes took from a run's cores), :mod:`.overhead`
(the kit vs by hand), :mod:`.run` (runs the cases through ``dk.launch.start``, writes
``runs/<bench-id>/bench.json`` and ``bench.png``), :mod:`.measured` (what the runs
measured, assembled into bench.json's records), :mod:`.schema` (bench.json as typed
data: its one writer and reader), :mod:`.cli` (``ddlkit bench``), :mod:`.results`
(a ``bench.json`` read back: the one table, for the CLI and notebooks alike),
:mod:`.plots` (throughput, efficiency, time to accuracy),
:mod:`.ratio` (compute per parameter of the kit's models).
"""

from __future__ import annotations

from ddlkit.bench import plots, ratio, results
from ddlkit.bench.config import BENCH_STRATEGIES, BenchCase, plan_cases
from ddlkit.bench.run import BenchResult, run_bench
from ddlkit.bench.stats import Spread, scaling, summarize

__all__ = [
    "BENCH_STRATEGIES",
    "BenchCase",
    "BenchResult",
    "plots",
    "ratio",
    "results",
    "Spread",
    "plan_cases",
    "run_bench",
    "scaling",
    "summarize",
]
