"""ddlkit.bench.results: bench.json read back into typed results (fixture files written here)."""

from __future__ import annotations

import html
import json

import pytest

from ddlkit.bench.results import load_results, parse
from ddlkit.errors import ConfigError


def spread(median, lo=None, hi=None, n=2):
    return {"median": median, "min": median if lo is None else lo, "max": hi or median, "n": n}


def run(run_id, rate, workers):
    """A run as the engine writes it (ddlkit.bench.schema.RunMeasure)."""
    return {
        "run_id": run_id,
        "examples_per_sec": rate,
        "step_time": 64 * workers / rate,
        "test_accuracy": 0.9,
        "wall_seconds": 30.0,
        "seconds_to_target": None,
        "best_eval_accuracy": 0.93,
        "evals": 4,
        "foreign_cpu": 0.1,
        "comm_ms_per_step": None,
    }


def case(strategy, workers, rate, **extra):
    """A case as the schema-2 engine writes it (ddlkit/bench/run.py's docstring)."""
    name = f"{strategy}-x{workers}"
    out = {
        "name": name,
        "strategy": strategy,
        "workers": workers,
        "steps": 60,
        "batch": 64,
        "repeats": 2,
        "model": "mnist",
        "eval_every": 20,
        "eval_examples": 1000,
        "skipped": None,
        "error": None,
        "runs": [] if rate is None else [run(f"{name}-{i}", rate, workers) for i in (1, 2)],
        "examples_per_sec": None if rate is None else spread(rate, rate - 100, rate + 50),
        "step_time": None if rate is None else spread(64 * workers / rate),
        "test_accuracy": None if rate is None else spread(0.9),
        "foreign_cpu": None if rate is None else spread(0.1, 0.05, 0.2),
        "seconds_to_target": None,
        "target_reached": "0/2",
        "target_note": "not reached in 60 steps by 2 of 2 runs (best held-out accuracy 0.930)",
        "comm": {"share": None, "ms_per_step": None, "how": "one device: nothing to send"},
        # the engine's own numbers: results.py recomputes these from the medians
        "speedup": 99.0,
        "efficiency": 99.0,
        "vs_single": 99.0,
    }
    out.update(extra)
    return out


PS_HOW = "not measured: PS pulls and pushes inside each step's remote function"
EST_HOW = "estimate: (step time - single-x1 step time) / step time"


def document(**extra):
    doc = {
        "schema": 2,
        "benchmark": "strategies",
        "bench_id": "20261121-090559.850-bench-7412",
        "created": 1795251959.85,
        "created_utc": "2026-11-21T09:05:59.850000+00:00",
        "quick": True,
        "wall_seconds": 325.3,
        "command": "ddlkit bench --quick",
        "target_accuracy": 0.95,
        "machine": {
            "cores": [0, 1],
            "cores_per_worker": 1,
            "cpu_model": "Some CPU",
            "load_start": [1.5, 2.25, 3.0],
        },
        "cases": [
            case("single", 1, 2000.0),
            case(
                "multi_worker",
                1,
                1000.0,
                seconds_to_target=spread(9.0, 8.0, 10.0),
                target_reached="2/2",
                target_note=None,
                comm={"share": 0.5, "ms_per_step": 32.0, "how": EST_HOW},
            ),
            case(
                "multi_worker",
                2,
                1600.0,
                comm={"share": 0.25, "ms_per_step": 20.0, "how": "measured: a timeline"},
            ),
            case(
                "parameter_server",
                2,
                1200.0,
                comm={"share": None, "ms_per_step": None, "how": PS_HOW},
                target_note=None,
                eval_every=0,
            ),
            case("horovod", 1, None, skipped="horovodrun was not found"),
            case("horovod", 2, None, skipped="horovodrun was not found"),
            case("mirrored", 1, None, error="worker-0 exited with code 1"),
        ],
        "overhead": {"by_hand": [1.0], "kit": [1.0], "ratios": [0.98], "ratio_median": 0.98},
        "overhead_error": None,
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
    assert res.target_accuracy == 0.95
    assert ("command", "ddlkit bench --quick") in res.meta
    assert ("command", "not recorded") in parse(document(command="")).meta
    assert ("cpu model", "Some CPU") in res.meta
    assert ("load start", "1.50, 2.25, 3.00") in res.meta
    assert mw2.foreign_cpu.median == 0.1 and mw2.eval_every == 20
    assert mw2.run_ids == ("multi_worker-x2-1", "multi_worker-x2-2")


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


def test_communication_share_says_how_or_why_not(tmp_path):
    res = load_results(write(tmp_path, document()))
    mw2, mw1 = res.case("multi_worker-x2"), res.case("multi_worker-x1")
    assert (mw2.comm_share, mw2.comm_ms, mw2.comm_measured) == (0.25, 20.0, True)
    assert mw2.comm_text() == "25% (measured)"
    assert mw1.comm_text() == "50% (estimated)" and not mw1.comm_measured
    ps2 = res.case("parameter_server-x2")
    assert ps2.comm_share is None and ps2.comm_text() == PS_HOW
    assert res.case("single-x1").comm_text() == "not measured: one device: nothing to send"
    one_rank = document()
    one_rank["cases"][0]["comm"] = {"share": 0.0, "ms_per_step": 0.0, "how": "one rank: none"}
    assert parse(one_rank).case("single-x1").comm_text() == "0%"  # neither measured nor estimated
    old = document()
    del old["cases"][0]["comm"]  # a schema-1 file has no comm at all
    assert parse(old).case("single-x1").comm_text() == "not measured"


def test_time_to_target_or_why_not(tmp_path):
    res = load_results(write(tmp_path, document()))
    mw1 = res.case("multi_worker-x1")
    assert mw1.time_to_target.median == 9.0 and mw1.target_reached == "2/2"
    assert mw1.target_text() == "9.0 s, 2/2 runs"
    assert res.case("single-x1").target_text().startswith("not reached in 60 steps by 2 of 2")
    assert res.case("parameter_server-x2").target_text() == "not measured"
    assert res.has_target_times
    assert res.case("horovod-x1").status == "skipped: horovodrun was not found"
    assert res.case("mirrored-x1").status == "FAILED: worker-0 exited with code 1"


def eval_line(step, seconds, accuracy, seq):
    from ddlkit.metrics.records import Record

    info = {"step": step, "examples": step * 64, "train_seconds": seconds}
    info |= {"accuracy": accuracy, "loss": 0.5}
    record = Record(
        kind="event",
        worker="main",
        step=step,
        epoch=0,
        wall_time=1.0,
        seq=seq,
        name="eval",
        info=info,
    )
    return record.to_json()


def test_curves_come_from_the_runs_directories_next_to_the_file(tmp_path):
    write(tmp_path, document())
    metrics = tmp_path / "runs" / "multi_worker-x2-1" / "metrics"
    metrics.mkdir(parents=True)
    lines = [eval_line(20, 4.0, 0.85, 1), eval_line(0, 0.0, 0.1, 0), eval_line(40, 8.0, 0.93, 2)]
    (metrics / "main.jsonl").write_text("\n".join(lines) + "\n")
    res = load_results(tmp_path)
    assert res.has_evals
    (curve,) = res.case("multi_worker-x2").evals  # the second run's directory is gone
    assert [(p.seconds, p.accuracy, p.step) for p in curve] == [
        (0.0, 0.1, 0),
        (4.0, 0.85, 20),
        (8.0, 0.93, 40),
    ]
    assert res.case("single-x1").evals == ()
    assert not load_results(tmp_path, curves=False).has_evals
    # a copied bench.json without its runs: no curves, the rest intact
    copy = write(tmp_path / "runs", document(), "copy.json")
    assert not load_results(copy).has_evals


def test_table_and_about_show_every_case_and_the_metadata(tmp_path):
    res = load_results(write(tmp_path, document()))
    table = res._repr_html_()
    for text in (
        "multi_worker-x2",
        "1,600",
        "80%",
        html.escape(PS_HOW),
        "skipped: horovodrun was not found",
        "FAILED: worker-0 exited with code 1",
        "2 cores",
    ):
        assert text in table
    rows = dict(res.about().rows)
    assert rows["date"] == "2026-11-21 09:05 UTC"
    assert rows["size"] == "quick: 60 steps, 2 repeats"
    assert rows["kit overhead"] == (
        "0.980: examples/s through the kit / by hand, median of 1 pair(s) (0.980)"
    )
    no_overhead = parse(document(overhead=None, overhead_error="by-hand worker-1 failed"))
    assert dict(no_overhead.about().rows)["kit overhead"] == (
        "not measured: by-hand worker-1 failed"
    )
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
        "0.80x one device, communication 25% (measured)"
    )
    assert lines[2] == (
        f"parameter_server-x2: 1,200 examples/s, 0.60x one device, communication {PS_HOW}"
    )
    assert lines[3] == "horovod-x2: skipped: horovodrun was not found"
    assert len(lines) == 4  # x1 cases of the strategies are in the table, not the summary


def resnet_document():
    """document() with ResNet cases after the CNN's, as `ddlkit bench --resnet` writes them."""
    resnet = {"model": "cifar10", "arch": "small_resnet", "eval_every": 0}
    cases = [("single", 1, 200.0), ("independent", 2, 380.0), ("multi_worker", 2, 361.0)]
    doc = document(schema=3)
    doc["cases"] += [
        case(s, n, rate, name=f"{s}-x{n}-resnet", **resnet) for s, n, rate in cases
    ]  # fmt: skip
    return doc


def test_resnet_cases_are_compared_only_with_resnet_cases():
    res = parse(resnet_document())
    assert res.archs == ("cnn", "small_resnet") and res.single.name == "single-x1"
    mw = res.case("multi_worker-x2-resnet")
    assert mw.vs_single == pytest.approx(361 / 200) and mw.vs_ceiling == pytest.approx(0.95)
    assert mw.speedup is None  # no multi_worker-x1-resnet; not the CNN's multi_worker-x1
    assert res.case("independent-x2-resnet").efficiency == pytest.approx(0.95)
    assert res.case("multi_worker-x2").vs_single == pytest.approx(0.8)  # the CNN's as before
    assert res.case("multi_worker-x2").vs_ceiling is None  # no CNN independent-x2 here
    cnn = res.of_arch("cnn")
    assert [c.name for c in cnn.cases] == [c.name for c in parse(document()).cases]
    assert "resnet" not in str(cnn) and "multi_worker-x2-resnet" in str(res)
    with pytest.raises(ConfigError, match="no 'vgg' cases. Fix: use one of cnn, small_resnet"):
        res.of_arch("vgg")


def test_plan_table_shows_every_planned_case_before_it_runs():
    from ddlkit.bench.config import plan_cases
    from ddlkit.bench.results import plan_table

    cases = plan_cases(True, 2, False, strategies=("single", "horovod"), eval_every=7)
    table = plan_table(cases)
    assert [r[0] for r in table.rows] == ["single-x1", "horovod-x1", "horovod-x2"]
    assert table.rows[2][3] == "64 x 2"
    assert "horovodrun was not found" in table.rows[1][7]
    assert {r[6] for r in table.rows} == {"every 7 steps"}
    assert "horovod-x2" in table._repr_html_() and "horovod-x2" in str(table)
    no_evals = plan_table(plan_cases(True, 2, True, strategies=("single",), eval_every=0))
    assert no_evals.rows[0][6] == "none" and no_evals.rows[0][7] == ""


def test_long_reasons_are_numbered_notes_under_the_table(tmp_path):
    res = load_results(write(tmp_path, document()))
    rows = {r[0]: r for r in res.rows()}
    notes = res.notes()
    # the same reason once, referenced from every case that shares it
    assert rows["single-x1"][7] == rows["multi_worker-x2"][7] == "not reached [2]"
    assert notes[1].startswith("[2] not reached in 60 steps by 2 of 2 runs")
    assert rows["multi_worker-x1"][6] == "50% (estimated) [3]" and notes[2] == f"[3] {EST_HOW}"
    assert rows["multi_worker-x1"][7] == "9.0 s, 2/2 runs"  # every run reached it: no note
    assert rows["parameter_server-x2"][6] == "not measured [5]" and notes[4] == f"[5] {PS_HOW}"
    assert rows["parameter_server-x2"][7] == "not measured"  # no reason given: no note
    assert rows["horovod-x1"][10] == rows["horovod-x2"][10] == "skipped [6]"
    assert notes[5] == "[6] skipped: horovodrun was not found"
    assert rows["mirrored-x1"][10] == "FAILED [7]"
    assert len(notes) == len(set(notes)) == 7
    assert notes[-1] in str(res) and html.escape(notes[4]) in res._repr_html_()
