"""ddlkit.bench end to end: a tiny benchmark with real worker processes."""

from __future__ import annotations

import json

import pytest

from ddlkit import contract
from ddlkit.bench import BenchCase, plan_cases, run_bench
from ddlkit.bench.run import run_case_once


@pytest.mark.slow
def test_tiny_bench_measures_every_case_the_overhead_and_draws_the_plot(tmp_path):
    cases = plan_cases(True, 2, False, strategies=("single", "multi_worker"), steps=20, repeats=1)
    lines: list[str] = []
    result = run_bench(
        cases, runs_dir=tmp_path, overhead_pairs=1, timeout=300, progress=lines.append
    )
    doc = json.loads(result.path.read_text())
    by = {c["name"]: c for c in doc["cases"]}
    assert list(by) == ["single-x1", "multi_worker-x1", "multi_worker-x2"]
    for name, case in by.items():
        assert case["error"] is None and case["skipped"] is None, name
        assert len(case["runs"]) == 1, name
        assert case["examples_per_sec"]["median"] > 0, name
        assert case["step_time"]["median"] > 0, name
        assert 0.0 <= case["test_accuracy"]["median"] <= 1.0, name
        (r,) = case["runs"]
        assert r["evals"] == 2 and 0.0 <= r["best_eval_accuracy"] <= 1.0, name  # steps 0, 20
        assert 0.0 <= r["foreign_cpu"] <= 1.0, name
        assert case["target_reached"] in ("0/1", "1/1"), name
    assert by["multi_worker-x2"]["comm"]["how"].startswith("estimate")
    assert 0.0 <= by["multi_worker-x2"]["comm"]["share"] < 1.0
    assert by["single-x1"]["comm"]["share"] is None
    assert doc["machine"]["load_start"] and doc["machine"]["load_end"]
    assert by["multi_worker-x1"]["efficiency"] == 1.0
    assert by["single-x1"]["vs_single"] == 1.0 and by["multi_worker-x2"]["vs_single"] > 0
    assert by["multi_worker-x2"]["speedup"] > 0
    assert doc["machine"]["cores_per_worker"] >= 1
    assert result.plot_path.read_bytes()[:4] == b"\x89PNG"
    # every case and the overhead's kit run ran as launched runs under the bench's directory
    assert len(list((result.bench_dir / "runs").iterdir())) == 3
    assert len(list((result.bench_dir / "overhead" / "runs").iterdir())) == 1
    assert sum("examples/s" in line for line in lines) == 3
    overhead = doc["overhead"]
    assert doc["overhead_error"] is None
    assert len(overhead["kit"]) == len(overhead["by_hand"]) == 1
    assert overhead["kit"][0] > 0 and overhead["by_hand"][0] > 0
    assert 0.3 < overhead["ratio_median"] < 3  # same job both ways: the same order
    assert overhead["ratio_median"] == overhead["kit"][0] / overhead["by_hand"][0]
    assert "RESULT " in (result.bench_dir / "overhead" / "by-hand-0" / "hand-0.log").read_text()


@pytest.mark.slow
def test_horovod_cases_pin_each_rank_and_measure_allreduce_from_the_timeline(tmp_path):
    from ddlkit.launch import plan

    assert plan.find_horovodrun(__import__("sys").executable), "Horovod is not built in the venv"
    cases = plan_cases(True, 2, True, strategies=("horovod",), steps=20, repeats=1)
    result = run_bench(cases, runs_dir=tmp_path, timeout=300, progress=None)
    doc = json.loads(result.path.read_text())
    by = {c["name"]: c for c in doc["cases"]}
    assert [c["error"] for c in by.values()] == [None, None]
    one, two = by["horovod-x1"], by["horovod-x2"]
    assert one["comm"]["share"] == 0.0 and one["profile_run"] is None  # one rank: no allreduce
    assert 0.0 < two["comm"]["share"] < 1.0 and two["comm"]["how"].startswith("measured")
    assert two["profile_run"]["comm_ms_per_step"] > 0  # the extra run with the timeline
    assert two["runs"][0]["comm_ms_per_step"] is None  # measured runs without it
    assert (result.bench_dir / "timelines" / "horovod-x2.json").is_file()
    assert two["runs"][0]["evals"] == 2  # rank 0 evaluated at steps 0 and 20


@pytest.mark.slow
def test_a_resnet_case_trains_the_small_resnet_through_its_worker_script(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_OFFLINE", "1")  # CIFAR-10's stand-in without probing Keras' host
    case = BenchCase("single", 1, 6, model="cifar10", arch="small_resnet")
    m = run_case_once(case, cpus=(0,), runs_dir=tmp_path, timeout=300)
    assert m.examples_per_sec > 0 and m.step_time > 0
    (report,) = contract.read_results(tmp_path / m.run_id).values()
    assert (report["model"], report["dataset"], report["steps"]) == ("small_resnet", "cifar10", 6)
