"""benchmarks/bench_allreduce.py --mwms: MultiWorkerMirroredStrategy's all-reduce timed in
two real worker processes (launch/time_mwms_allreduce.py), the slower one's numbers fitted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_two_workers_time_the_all_reduce_against_the_same_call_without_it(tmp_path, capsys):
    bench = _load(ROOT / "benchmarks" / "bench_allreduce.py")
    bench.mwms_allreduce([8, 65536], repeats=5, workers=2, runs_dir=tmp_path)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *sizes, fit = lines
    assert [s["bytes"] for s in sizes] == [8, 65536]
    for s in sizes:
        assert (s["strategy"], s["ranks"]) == ("multi_worker", 2)
        assert 0 < s["min_s"] <= s["median_s"] <= s["max_s"]
        # the ring's exchange between two processes costs more than calling the function
        assert s["median_s"] > s["call_without_s"] > 0
    assert (fit["bench"], fit["transport"], fit["ranks"]) == ("allreduce_fit", "grpc", 2)
    assert fit["latency_s"] > 0
    (run_dir,) = tmp_path.iterdir()
    results = (run_dir / "results").glob("*.json")
    reports = sorted((json.loads(p.read_text()) for p in results), key=lambda r: r["worker"])
    assert [(r["worker"], r["workers"], r["repeats"]) for r in reports] == [(0, 2, 5), (1, 2, 5)]
    # the slower worker's median is the one printed
    assert sizes[0]["median_s"] == max(r["points"][0][1] for r in reports)


def test_sizes_that_are_not_whole_float32s_are_refused(capsys):
    timer = _load(ROOT / "launch" / "time_mwms_allreduce.py")
    with pytest.raises(SystemExit) as exit_:
        timer.parse_args(["--sizes", "8", "6"])
    assert exit_.value.code == 2
    assert "--sizes [6]: each must be a multiple of 4 bytes" in capsys.readouterr().err
