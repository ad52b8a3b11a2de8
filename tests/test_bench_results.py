"""ddlkit.bench.results: bench.json read back into typed results (fixture files written here)."""

from __future__ import annotations

import json

import pytest

from ddlkit.bench.results import load_results, parse
from ddlkit.errors import ConfigError


def spread(median, lo=None, hi=None, n=2):
    return {"median": median, "min": median if lo is None else lo, "max": hi or median, "n": n}


def case(strategy, workers, rate, **extra):
    out = {
        "name": f"{strategy}-x{workers}",
        "strategy": strategy,
        "workers": workers,
        "steps": 60,
        "batch": 64,
        "repeats": 2,
        "model": "mnist",
        "skipped": None,
        "error": None,
        "runs": [],
        "examples_per_sec": None if rate is None else spread(rate, rate - 100, rate + 50),
        "step_time": None if rate is None else spread(64 * workers / rate),
        "test_accuracy": None if rate is None else spread(0.9),
        # what an older engine wrote: results.py recomputes these from the medians
        "speedup": 99.0,
        "efficiency": 99.0,
    }
    out.update(extra)
    return out


def document(**extra):
    doc = {
        "schema": 1,
        "benchmark": "strategies",
        "bench_id": "20261121-090559.850-bench-7412",
        "created": 1795251959.85,
        "quick": True,
        "wall_seconds": 325.3,
        "machine": {"cores": [0, 1], "cores_per_worker": 1, "hostname": "box"},
        "cases": [
            case("single", 1, 2000.0),
            case("multi_worker", 1, 1000.0, comm_share=None, comm_share_note="one worker"),
            case("multi_worker", 2, 1600.0, comm_share=spread(0.25, 0.2, 0.3)),
            case(
                "parameter_server",
                2,
                1200.0,
                comm_share={"value": None, "reason": "push/pull is inside the step"},
            ),
            case("horovod", 1, None, skipped="horovodrun was not found"),
            case("horovod", 2, None, skipped="horovodrun was not found"),
            case("mirrored", 1, None, error="worker-0 exited with code 1"),
        ],
        "overhead": {"by_hand": [1.0], "kit": [1.0], "ratios": [0.98], "ratio_median": 0.98},
        "overhead_error": None,
        "command": "ddlkit bench --quick",
    }
    doc.update(extra)
    return doc


def write(tmp_path, doc, name="bench.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_load_from_run_dir_or_file_gives_cases_with_spreads(tmp_path):
    write(tmp_path, document())
    res = load_results(tmp_path)
    assert res == load_results(tmp_path / "bench.json")
    assert res.bench_id == "20261121-090559.850-bench-7412"
    assert res.cores == (0, 1) and res.cores_per_worker == 1 and res.quick
    mw2 = res.case("multi_worker-x2")
    assert (mw2.throughput.median, mw2.throughput.min, mw2.throughput.max) == (1600, 1500, 1650)
    assert mw2.step_time.median == pytest.approx(0.08)
    assert [c.name for c in res.measured] == [
        "single-x1",
        "multi_worker-x1",
        "multi_worker-x2",
        "parameter_server-x2",
    ]
    assert res.strategies == ("single", "multi_worker", "parameter_server", "horovod", "mirrored")
    assert res.worker_counts == (1, 2)
    assert res.single.name == "single-x1"
    assert res.overhead_ratio == 0.98
    assert ("command", "ddlkit bench --quick") in res.meta
    assert ("hostname", "box") in res.meta


def test_scaling_is_recomputed_from_medians_against_x1_and_single(tmp_path):
    res = load_results(write(tmp_path, document()))
    mw1, mw2 = res.case("multi_worker-x1"), res.case("multi_worker-x2")
    assert mw1.speedup == 1.0 and mw1.efficiency == 1.0
    assert mw2.speedup == pytest.approx(1.6)
    assert mw2.efficiency == pytest.approx(0.8)  # not the file's 99
    assert mw2.vs_single == pytest.approx(0.8)
    assert mw2.efficiency_vs_single == pytest.approx(0.4)
    # no parameter_server-x1 in the file: no efficiency, but still against one device
    ps2 = res.case("parameter_server-x2")
    assert ps2.efficiency is None and ps2.vs_single == pytest.approx(0.6)
    # skipped and failed cases have no numbers
    for name in ("horovod-x2", "mirrored-x1"):
        c = res.case(name)
        assert not c.ok and c.throughput is None and c.efficiency is None and c.vs_single is None


def test_unmeasured_values_keep_their_reason(tmp_path):
    res = load_results(write(tmp_path, document()))
    assert res.case("multi_worker-x2").comm_share.median == 0.25
    assert res.case("multi_worker-x2").comm_text() == "25%"
    assert res.case("multi_worker-x1").comm_text() == "not measured: one worker"
    ps2 = res.case("parameter_server-x2")
    assert ps2.comm_share is None
    assert ps2.comm_text() == "not measured: push/pull is inside the step"
    assert ps2.target_text() == "not measured"
    assert res.case("horovod-x1").status == "skipped: horovodrun was not found"
    assert res.case("mirrored-x1").status == "FAILED: worker-0 exited with code 1"


def test_time_to_target_and_eval_curves(tmp_path):
    doc = document(target_accuracy=0.9)
    curve = [
        {"step": 20, "train_seconds": 4.0, "accuracy": 0.85},
        {"step": 10, "train_seconds": 2.0, "accuracy": 0.7},
    ]
    doc["cases"][2]["runs"] = [{"run_id": "a", "evals": curve}, {"run_id": "b", "evals": []}]
    doc["cases"][2]["time_to_target"] = {"value": 3.5, "reason": None}
    doc["cases"][0]["evals"] = [[{"seconds": 1.0, "accuracy": 0.91}]]
    doc["cases"][0]["time_to_target"] = None
    doc["cases"][0]["time_to_target_note"] = "target not reached"
    res = load_results(write(tmp_path, doc))
    assert res.target_accuracy == 0.9 and res.has_evals
    mw2 = res.case("multi_worker-x2")
    assert len(mw2.evals) == 1  # the run without evals adds no curve
    assert [(p.seconds, p.accuracy, p.step) for p in mw2.evals[0]] == [
        (2.0, 0.7, 10),
        (4.0, 0.85, 20),
    ]
    assert mw2.time_to_target.median == 3.5 and mw2.target_text() == "3.5 s"
    assert res.case("single-x1").target_text() == "not measured: target not reached"
    assert not load_results(write(tmp_path, document(), "other.json")).has_evals


def test_table_and_about_show_every_case_and_the_metadata(tmp_path):
    res = load_results(write(tmp_path, document()))
    html = res._repr_html_()
    for text in (
        "multi_worker-x2",
        "1,600",
        "80%",
        "not measured: push/pull is inside the step",
        "skipped: horovodrun was not found",
        "FAILED: worker-0 exited with code 1",
        "2 cores",
    ):
        assert text in html
    rows = dict(res.about().rows)
    assert rows["date"] == "2026-11-21 09:05 UTC"
    assert rows["size"] == "quick: 60 steps, 2 repeats"
    assert rows["kit overhead"].startswith("0.980")
    assert "ddlkit bench --quick" in res.about()._repr_html_()
    assert "multi_worker-x2" in str(res)


def test_missing_file_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="no benchmark result at .*bench.json.*ddlkit bench"):
        load_results(tmp_path)
    with pytest.raises(ConfigError, match="nowhere.json"):
        load_results(tmp_path / "nowhere.json")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "no 'benchmark': 'strategies'"),
        (json.dumps({"benchmark": "strategies", "schema": 1}), "lacks bench_id"),
        (json.dumps(document(cases=[])), "no cases"),
        (json.dumps(document(cases=[{"name": "x"}])), "case 0 lacks strategy"),
        (
            json.dumps(document(cases=[case("single", 1, 10.0, examples_per_sec={"a": 1})])),
            "examples_per_sec is not a median/min/max/n",
        ),
    ],
)
def test_invalid_files_name_the_path_the_cause_and_the_fix(tmp_path, content, match):
    path = write(tmp_path, content)
    with pytest.raises(ConfigError, match=match) as err:
        load_results(path)
    assert str(path) in str(err.value) and "ddlkit bench" in str(err.value)


def test_newer_schema_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="schema 99.*reads schemas 1"):
        parse(document(schema=99), tmp_path / "bench.json")


def test_unknown_case_name(tmp_path):
    res = load_results(write(tmp_path, document()))
    with pytest.raises(ConfigError, match="no case 'nope'.*single-x1"):
        res.case("nope")


@pytest.mark.slow
def test_a_real_benchmark_run_reads_back(tmp_path):
    """A one-case benchmark with a real worker (about 20 s): what run_bench wrote loads."""
    from ddlkit.bench.config import BenchCase
    from ddlkit.bench.run import run_bench

    bench = run_bench([BenchCase("single", 1, steps=15)], runs_dir=tmp_path, progress=None)
    res = load_results(bench.bench_dir)
    (single,) = res.cases
    assert single.ok and single.name == "single-x1" and single.throughput.n == 1
    assert single.throughput.median > 0 and single.step_time.median > 0
    assert single.vs_single == 1.0 and single.speedup == 1.0
    assert res.bench_id == bench.bench_id and res.cores == tuple(bench.cores)


def test_summary_answers_per_multi_worker_case(tmp_path):
    res = load_results(write(tmp_path, document()))
    lines = res.summary().splitlines()
    assert lines[0] == "single-x1: 2,000 examples/s"
    assert lines[1] == (
        "multi_worker-x2: 1,600 examples/s, 1.60x its own x1 (80% efficiency), "
        "0.80x one device, communication 25%"
    )
    assert lines[2] == (
        "parameter_server-x2: 1,200 examples/s, 0.60x one device, "
        "communication not measured: push/pull is inside the step"
    )
    assert lines[3] == "horovod-x2: skipped: horovodrun was not found"
    assert len(lines) == 4  # x1 cases of the strategies are in the table, not the summary


def test_plan_table_shows_every_planned_case_before_it_runs():
    from ddlkit.bench.config import plan_cases
    from ddlkit.bench.results import plan_table

    table = plan_table(plan_cases(True, 2, False, strategies=("single", "horovod")))
    assert [r[0] for r in table.rows] == ["single-x1", "horovod-x1", "horovod-x2"]
    assert table.rows[2][3] == "64 x 2"
    assert "horovodrun was not found" in table.rows[1][6]
    assert "horovod-x2" in table._repr_html_() and "horovod-x2" in str(table)
