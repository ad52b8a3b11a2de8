"""ddlkit.bench, pure parts: planning, measuring, median and spread, scaling, JSON, CLI."""

from __future__ import annotations

import argparse
import json
import time

import pytest
from harness.factories import step_record

from ddlkit.bench import config, overhead, plots, run, schema, stats
from ddlkit.bench.cli import add_bench_parser
from ddlkit.bench.config import QUICK_TARGET, TARGET, BenchCase, plan_cases
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.metrics.records import Record
from ddlkit.where import ThisMachine


def _names(cases):
    return [c.name for c in cases]


def test_plan_two_cores_has_one_and_two_workers_per_strategy():
    cases = plan_cases(True, 2, True)
    assert _names(cases) == [
        "reference-x1",
        "single-x1",
        "independent-x2",
        "mirrored-x1",
        "mirrored-x2",
        "multi_worker-x1",
        "multi_worker-x2",
        "parameter_server-x1",
        "parameter_server-x2",
        "horovod-x1",
        "horovod-x2",
    ]
    assert {(c.steps, c.repeats) for c in cases} == {(50, 2)}
    assert not any(c.skip for c in cases)
    assert cases[0].script(run.LAUNCH_DIR).is_file()
    assert [c.workers for c in plan_cases(True, 8, True, strategies=("independent",))] == [2, 4, 8]
    with pytest.raises(ConfigError, match="independent runs have 2 or more workers"):
        BenchCase("independent", 1, 10)
    ceiling = BenchCase("independent", 2, 10)
    assert ceiling.launch_strategy == "multi_worker" and ceiling.script(run.LAUNCH_DIR).is_file()


def test_plan_more_cores_adds_worker_counts_and_full_runs_longer():
    cases = plan_cases(False, 8, True, strategies=("multi_worker",))
    assert [c.workers for c in cases] == [1, 2, 4, 8]
    assert {(c.steps, c.repeats) for c in cases} == {(200, 3)}
    assert [c.workers for c in plan_cases(False, 5, True, strategies=("horovod",))] == [1, 2, 4]
    # one core: still 1 and 2 workers (oversubscribed; the numbers will show it)
    assert [c.workers for c in plan_cases(True, 1, True, strategies=("mirrored",))] == [1, 2]


def test_plan_without_horovodrun_keeps_horovod_cases_with_the_reason():
    cases = plan_cases(True, 2, False, strategies=("horovod", "single"))
    assert _names(cases) == ["single-x1", "horovod-x1", "horovod-x2"]  # fixed order
    assert cases[0].skip == ""
    assert all(
        "horovodrun was not found" in c.skip and "build-horovod" in c.skip for c in cases[1:]
    )


def test_plan_overrides_and_bad_input():
    (case,) = plan_cases(True, 2, True, strategies=("single",), steps=7, repeats=5, batch=32)
    assert (case.steps, case.repeats, case.batch) == (7, 5, 32)
    with pytest.raises(ConfigError, match="unknown strategy 'ring'"):
        plan_cases(True, 2, True, strategies=("ring",))
    with pytest.raises(ConfigError, match="repeats=0"):
        plan_cases(True, 2, True, repeats=0)
    with pytest.raises(ConfigError, match="no strategies"):
        plan_cases(True, 2, True, strategies=())
    with pytest.raises(ConfigError, match="one worker"):
        BenchCase("single", 2, 10)
    with pytest.raises(ConfigError, match="unknown model"):
        BenchCase("mirrored", 1, 10, model="imagenet")


def test_case_arguments_fix_the_steps(tmp_path):
    case = BenchCase("multi_worker", 2, 40, batch=32)
    assert case.args() == [
        "--dataset", "mnist", "--epochs", "1", "--steps-per-epoch", "40", "--batch-size", "32",
        "--test-examples", str(config.TEST_EXAMPLES), "--eval-every", "0",
    ]  # fmt: skip
    evals = BenchCase("horovod", 2, 40, eval_every=10).args()
    assert evals[-4:] == ["--eval-every", "10", "--eval-examples", str(config.EVAL_EXAMPLES)]
    with pytest.raises(ConfigError, match="eval_every=-1"):
        BenchCase("single", 1, 40, eval_every=-1)
    assert [c.eval_every for c in plan_cases(True, 2, True)] == [0] + [20] * 10  # reference: 0
    assert {c.eval_every for c in plan_cases(False, 2, True, eval_every=0)} == {0}
    assert case.launch_strategy == "multi_worker"
    assert BenchCase("single", 1, 5).launch_strategy == "mirrored"
    assert BenchCase("single", 1, 5).script(tmp_path) == tmp_path / "train_single.py"
    ps = BenchCase("parameter_server", 2, 40).args()
    assert ps[-2:] == ["--eval-every", "0"]  # the script's own steps per call and joins
    for strategy, script in config.SCRIPTS.items():
        assert (run.LAUNCH_DIR / script).is_file(), strategy
    assert "multi_worker" in case._repr_html_()


def test_plan_resnet_adds_four_small_resnet_cases_on_cifar10_after_the_cnns():
    every = ("single", "independent", "mirrored", "multi_worker", "horovod")
    cases = plan_cases(True, 2, True, strategies=every, resnet=True)
    cnn, resnet = cases[:-4], cases[-4:]
    assert _names(cnn) == _names(plan_cases(True, 2, True, strategies=every))  # as before
    assert _names(resnet) == [
        "single-x1-resnet",
        "independent-x2-resnet",
        "multi_worker-x2-resnet",
        "horovod-x2-resnet",
    ]
    assert {c.arch for c in cnn} == {"cnn"} and {c.arch for c in resnet} == {"small_resnet"}
    steps = config.RESNET_STEPS["quick"]
    assert {(c.model, c.steps, c.repeats, c.eval_every) for c in resnet} == {
        ("cifar10", steps, 2, 0)
    }
    full = plan_cases(
        False, 2, False, strategies=("single", "horovod"), resnet=True, resnet_steps=9
    )
    assert [(c.name, c.steps) for c in full[-2:]] == [
        ("single-x1-resnet", 9),
        ("horovod-x2-resnet", 9),
    ]
    assert "horovodrun was not found" in full[-1].skip
    assert {c.arch for c in plan_cases(True, 2, True)} == {"cnn"}  # only when asked for
    with pytest.raises(ConfigError, match="resnet_steps=9 without the ResNet cases.*resnet=True"):
        plan_cases(True, 2, True, resnet_steps=9)


def test_a_resnet_case_passes_model_small_resnet_and_checks_its_arch():
    from ddlkit import models

    case = BenchCase("horovod", 2, 30, model="cifar10", arch="small_resnet")
    assert case.name == "horovod-x2-resnet" and BenchCase("horovod", 2, 30).name == "horovod-x2"
    assert case.args() == [
        "--dataset", "cifar10", "--epochs", "1", "--steps-per-epoch", "30", "--batch-size", "64",
        "--test-examples", "2000", "--model", "small_resnet", "--eval-every", "0",
    ]  # fmt: skip
    assert "--model" not in BenchCase("horovod", 2, 30).args()  # the CNN's argv as before
    assert ("model", "cifar10 small ResNet") in case.rows()
    assert tuple(config.ARCHS) == models.ARCHS  # the arch names are the scripts' --model
    with pytest.raises(ConfigError, match="unknown arch 'vgg'.*cnn, small_resnet"):
        BenchCase("single", 1, 5, arch="vgg")
    with pytest.raises(ConfigError, match="arch='cnn'"):
        BenchCase("reference", 1, 5, arch="small_resnet")


def test_resnet_cases_are_compared_only_with_resnet_cases(tmp_path):
    resnet = {"model": "cifar10", "arch": "small_resnet"}
    cases = [
        BenchCase("single", 1, 20),
        BenchCase("independent", 2, 20),
        BenchCase("multi_worker", 2, 20),
        BenchCase("single", 1, 8, **resnet),
        BenchCase("independent", 2, 8, **resnet),
        BenchCase("multi_worker", 2, 8, **resnet),
        BenchCase("horovod", 2, 8, **resnet),
    ]
    res = run.BenchResult("b", tmp_path / "b", [run.CaseResult(c) for c in cases], (0, 1), 1)
    m = lambda rate, step: stats.RunMeasure("r", rate, step, 0.5, 10.0)  # noqa: E731
    measured = [(1000, 64), (1900, 67), (1500, 85), (100, 640), (200, 640), (190, 674)]
    for c, (rate, ms) in zip(res.cases, measured, strict=False):  # examples/s, ms per step
        c.runs = [m(float(rate), ms / 1000)]
    res.cases[6].error = "rank 1 failed"
    by = {c["name"]: c for c in json.loads(res.write().read_text())["cases"]}
    assert (
        by["multi_worker-x2"]["arch"] == "cnn" and by["single-x1-resnet"]["arch"] == "small_resnet"
    )
    mw = by["multi_worker-x2-resnet"]
    assert mw["vs_ceiling"] == pytest.approx(0.95) and mw["vs_single"] == pytest.approx(1.9)
    assert mw["comm"]["ms_per_step"] == pytest.approx(34.0)  # against the ResNet's single-x1
    assert mw["speedup"] is None  # no multi_worker-x1-resnet: nothing of its own to scale from
    assert by["independent-x2-resnet"]["speedup"] == pytest.approx(2.0)
    assert by["multi_worker-x2"]["vs_ceiling"] == pytest.approx(1500 / 1900)
    assert by["multi_worker-x2"]["comm"]["ms_per_step"] == pytest.approx(21.0)
    assert (
        by["single-x1-resnet"]["vs_single"] == 1.0 and by["horovod-x2-resnet"]["vs_single"] is None
    )
    shown = res.results()  # read back: the same pairs
    assert shown.archs == ("cnn", "small_resnet")
    assert shown.case("multi_worker-x2-resnet").vs_ceiling == pytest.approx(0.95)
    assert shown.single.name == "single-x1"
    assert [c.name for c in shown.of_arch("small_resnet").measured][-1] == "multi_worker-x2-resnet"
    assert (
        "multi_worker-x2-resnet: 190 examples/s, 1.90x one device, 0.95 of the" in shown.summary()
    )
    res.bench_dir.mkdir(parents=True, exist_ok=True)
    assert plots.save_png(shown, res.plot_path).read_bytes()[:4] == b"\x89PNG"


def test_cores_per_worker_and_case_cores():
    cases = plan_cases(True, 2, True)
    assert run.cores_per_worker(cases, 2) == 1
    assert run.cores_per_worker(plan_cases(True, 8, True, strategies=("single",)), 8) == 8
    assert run.case_cores(1, 1, (0, 1)) == (0,)
    assert run.case_cores(2, 1, (0, 1)) == (0, 1)
    assert run.case_cores(4, 1, (0, 1)) == (0, 1)  # does not fit: all of them


def test_summarize_median_and_spread():
    s = stats.summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.rel_range == pytest.approx(9.0 / 2.5)
    assert stats.summarize([4.0]).rel_range == 0.0
    with pytest.raises(ValueError, match="at least one"):
        stats.summarize([])


def test_scaling_is_against_the_same_strategy_with_one_worker():
    rates = {
        ("multi_worker", 1): 1000.0,
        ("multi_worker", 2): 1900.0,
        ("horovod", 1): 800.0,
        ("horovod", 2): 1200.0,
        ("mirrored", 2): 500.0,  # no x1 to compare with: left out
        ("single", 1): 1050.0,
        ("independent", 2): 2037.0,  # against single-x1
    }
    out = stats.scaling(rates)
    assert out[("independent", 2)].speedup == pytest.approx(1.94)
    assert stats.communication("independent", 0.03, None, 0.03).how.startswith("independent")
    assert out[("multi_worker", 2)].speedup == pytest.approx(1.9)
    assert out[("multi_worker", 2)].efficiency == pytest.approx(0.95)
    assert out[("horovod", 2)].efficiency == pytest.approx(0.75)
    assert out[("horovod", 1)].efficiency == 1.0
    assert ("mirrored", 2) not in out


def test_measure_skips_warmup_adds_workers_and_takes_the_slowest_step():
    steps = range(1, 21)
    records = [step_record("worker-0", i, 1.0 if i <= 4 else 100.0, step_time=0.5) for i in steps]
    records += [
        step_record("worker-1", i, 1.0 if i <= 4 else 80.0, step_time=0.5 if i <= 4 else 0.8)
        for i in steps
    ]
    records.append(Record(kind="epoch", worker="worker-0", step=20, epoch=0, wall_time=0, seq=99))
    m = stats.measure(records, {"test_accuracy": 0.9}, run_id="r", steps=20, wall_seconds=12.0)
    assert stats.warmup_steps(20) == 4
    assert m.examples_per_sec == pytest.approx(180.0)  # warm-up steps left out, workers added
    assert m.step_time == pytest.approx(0.8)
    assert (m.test_accuracy, m.wall_seconds, m.run_id) == (0.9, 12.0, "r")
    with pytest.raises(DdlkitError, match="no step records after the first 4 steps"):
        stats.measure(records[:3], {"test_accuracy": 0.9}, run_id="r", steps=20, wall_seconds=1)


def _result(tmp_path):
    cases = [
        BenchCase("single", 1, 20),
        BenchCase("multi_worker", 1, 20, repeats=2),
        BenchCase("multi_worker", 2, 20, repeats=2),
        BenchCase("horovod", 1, 20, skip=config.NO_HOROVOD),
        BenchCase("parameter_server", 1, 20),
    ]
    res = run.BenchResult("b1", tmp_path / "b1", [run.CaseResult(c) for c in cases], (0, 1), 1)
    m = lambda rate: stats.RunMeasure("r", rate, 0.05, 0.9, 10.0)  # noqa: E731
    res.cases[0].runs = [m(1000.0)]
    res.cases[1].runs = [m(900.0), m(1100.0)]
    res.cases[2].runs = [m(1700.0), m(1900.0)]
    res.cases[4].error = "chief failed"
    return res


def test_bench_json_schema_and_atomic_write(tmp_path):
    res = _result(tmp_path)
    path = res.write()
    doc = json.loads(path.read_text())
    assert not list(res.bench_dir.glob("*.tmp"))
    top = {"schema", "bench_id", "created", "quick", "wall_seconds", "machine", "cases"}
    assert top | {"overhead", "overhead_error"} <= set(doc)
    assert doc["overhead"] is None and doc["overhead_error"] is None
    assert doc["machine"] == {"cores": [0, 1], "cores_per_worker": 1}
    assert doc["schema"] == run.SCHEMA_VERSION == 3 and doc["created_utc"].endswith("+00:00")
    by = {c["name"]: c for c in doc["cases"]}
    assert list(by) == [
        "single-x1",
        "multi_worker-x1",
        "multi_worker-x2",
        "horovod-x1",
        "parameter_server-x1",
    ]
    keys = {
        "strategy",
        "workers",
        "steps",
        "batch",
        "repeats",
        "model",
        "skipped",
        "error",
        "runs",
        "examples_per_sec",
        "step_time",
        "test_accuracy",
        "speedup",
        "efficiency",
        "vs_single",
        "foreign_cpu",
        "seconds_to_target",
        "target_reached",
        "target_note",
        "comm",
        "eval_every",
    }
    assert all(keys <= set(c) for c in doc["cases"])
    for key in keys - {"runs", "comm"}:  # every key the schema's docstring documents
        assert f"{key}" in schema.__doc__, key
    mw2 = by["multi_worker-x2"]
    assert mw2["examples_per_sec"] == {"median": 1800.0, "min": 1700.0, "max": 1900.0, "n": 2}
    assert mw2["speedup"] == pytest.approx(1.8) and mw2["efficiency"] == pytest.approx(0.9)
    assert len(mw2["runs"]) == 2 and mw2["runs"][0]["examples_per_sec"] == 1700.0
    assert by["horovod-x1"]["skipped"].startswith("horovodrun was not found")
    assert by["horovod-x1"]["examples_per_sec"] is None
    assert by["parameter_server-x1"]["error"] == "chief failed"
    assert by["single-x1"]["efficiency"] == 1.0
    assert mw2["vs_single"] == pytest.approx(1.8) and by["single-x1"]["vs_single"] == 1.0
    assert by["horovod-x1"]["vs_single"] is None
    res.overhead = overhead.Overhead((100.0, 100.0), (98.0, 110.0), ("hand-first", "kit-first"), 20)
    doc = json.loads(res.write().read_text())
    assert doc["overhead"] == {
        "by_hand": [100.0, 100.0], "kit": [98.0, 110.0], "ratios": [0.98, 1.1],
        "ratio_median": 1.04, "ratio_min": 0.98, "ratio_max": 1.1,
        "order": ["hand-first", "kit-first"], "steps": 20, "workers": 2,
    }  # fmt: skip
    assert [overhead.pair_order(i) for i in range(3)] == ["hand-first", "kit-first", "hand-first"]


def test_report_table_and_plot(tmp_path):
    res = _result(tmp_path)
    text = str(res.results())  # the one table: the CLI prints it, notebook 07 shows it
    assert "multi_worker-x2" in text and "1,800" in text and "90%" in text
    assert "skipped: horovodrun was not found" in text and "FAILED: chief failed" in text
    html = res._repr_html_()
    assert "<table>" in html and "1,700-1,900 (2)" in html
    res.bench_dir.mkdir(parents=True)
    png = plots.save_png(res.results(), res.plot_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_parser_defaults_and_choices():
    parser = argparse.ArgumentParser(prog="ddlkit")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--quick", "--strategies", "single", "horovod"])
    assert args.quick and args.strategies == ["single", "horovod"]
    assert args.repeats is None and args.steps is None
    assert not args.resnet and args.resnet_steps is None
    args = parser.parse_args(["bench", "--resnet", "--resnet-steps", "12"])
    assert args.resnet and args.resnet_steps == 12
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--strategies", "ring"])


def test_cli_help_states_the_plans_own_defaults():
    parser = argparse.ArgumentParser(prog="ddlkit")
    sub = parser.add_subparsers(dest="command")
    add_bench_parser(sub)
    text = " ".join(sub.choices["bench"].format_help().split())
    (quick,) = {c.eval_every for c in plan_cases(True, 2, True) if c.eval_every}
    (full,) = {c.eval_every for c in plan_cases(False, 2, True) if c.eval_every}
    assert f"default quick {quick}, full {full}; 0: none" in text
    assert f"(default {TARGET}; --quick: {QUICK_TARGET}," in text


def test_cli_bad_repeats_is_one_clear_error_and_nothing_runs(tmp_path, capsys):
    from ddlkit.bench.cli import main

    assert main(["--repeats", "0", "--runs-dir", str(tmp_path)]) == 2
    assert "repeats=0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_by_hand_workers_are_the_tutorial_way_with_the_kits_cores(tmp_path):

    from ddlkit.cluster import ClusterSpec

    cluster = ClusterSpec.local(workers=2)
    base = {"PATH": "/usr/bin", "DDLKIT_COLLECTOR": "127.0.0.1:1", "DDLKIT_WORKER": "x"}
    workers = overhead.by_hand_workers(
        tmp_path / "s.py", ["--epochs", "1"], cluster, [(0,), (1,)], 1, tmp_path, base
    )
    assert [w.cpus for w in workers] == [(0,), (1,)]
    for i, w in enumerate(workers):
        assert w.argv[1:] == (str(tmp_path / "s.py"), "--epochs", "1")
        assert json.loads(w.env["TF_CONFIG"])["task"] == {"type": "worker", "index": i}
        assert w.env["TF_USE_LEGACY_KERAS"] == "1" and w.env["PATH"] == "/usr/bin"
        assert w.env["TF_NUM_INTRAOP_THREADS"] == "1" and w.env["OMP_NUM_THREADS"] == "1"
        kit_vars = {k for k in w.env if k.startswith("DDLKIT_")}
        # the Keras choice and a place for its local metrics file; no collector, no name
        assert kit_vars == {"DDLKIT_RUNS", "DDLKIT_KERAS"}
        assert w.env["DDLKIT_RUNS"] == str(w.runs) == str(tmp_path / f"hand-{i}")


def test_result_line_and_overhead_ratio(tmp_path):

    out = 'noise\nRESULT {"examples_per_sec": 1.0}\nRESULT {"examples_per_sec": 2.5}\nbye'
    assert overhead.result_line(out) == {"examples_per_sec": 2.5}
    with pytest.raises(DdlkitError, match="no RESULT line"):
        overhead.result_line("Traceback ...")
    o = overhead.Overhead(by_hand=(100.0, 200.0, 100.0), kit=(99.0, 190.0, 101.0))
    assert o.ratios == pytest.approx((0.99, 0.95, 1.01))
    assert o.ratio == pytest.approx(0.99)
    res = _result(tmp_path)
    res.overhead = o
    line = dict(res.results().about_rows())["kit overhead"]
    assert line.startswith("0.990: examples/s through the kit / by hand, median of 3 pair(s)")
    assert "(0.990, 0.950, 1.010)" in line
    res.overhead, res.overhead_error = None, "boom"
    assert dict(res.results().about_rows())["kit overhead"] == "not measured: boom"
    res.overhead_error = ""
    assert dict(res.results().about_rows())["kit overhead"] == "not measured"


def test_a_failing_by_hand_worker_raises_and_leaves_nothing_running(tmp_path):
    import os
    import sys

    pidfile = tmp_path / "sleeper.pid"
    sleeper = (
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    env = dict(os.environ)
    workers = [
        overhead.HandWorker((sys.executable, "-c", sleeper), env, (0,), tmp_path / "w0.log"),
        overhead.HandWorker(
            (sys.executable, "-c", "raise SystemExit(3)"), env, (0,), tmp_path / "w1.log"
        ),  # fmt: skip
    ]
    start = time.monotonic()
    with pytest.raises(DdlkitError, match="timed out|did not finish|exited with"):
        overhead.run_by_hand(workers, timeout=5, steps=10)
    assert time.monotonic() - start < 30
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_overhead_with_a_missing_script_is_one_clear_error(tmp_path):
    with pytest.raises(DdlkitError, match="not found"):
        overhead.measure_overhead(
            tmp_path / "nope.py", pairs=1, steps=10, cores=(0,), workdir=tmp_path
        )
    assert not any(tmp_path.iterdir())


def test_ddlkit_bench_refuses_bad_input_in_one_line_with_exit_2():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "ddlkit.cli", "bench", "--repeats", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stderr.strip().count("\n") == 0 and "Fix:" in out.stderr


def _eval(worker, step, accuracy, seconds):
    info = {"step": step, "examples": step * 64, "train_seconds": seconds, "loss": 1.0}
    info["accuracy"] = accuracy
    return Record(
        kind="event", worker=worker, step=step, epoch=0, wall_time=0, seq=0, name="eval", info=info
    )


def test_measure_leaves_out_steps_that_waited_for_an_eval_and_times_the_target():
    records = [step_record("worker-0", i, 100.0, step_time=0.1) for i in range(1, 21)]
    records += [step_record("worker-1", i, 100.0, step_time=0.1) for i in range(1, 21)]
    for r in list(records):  # step 11 holds worker-0's evaluation after step 10, on both
        if r.step == 11:
            records.remove(r)
            records.append(step_record(r.worker, 11, 5.0, step_time=2.0))
    seen = [(0, 0.1, 0), (10, 0.96, 1.2), (20, 0.97, 2.3)]  # step, accuracy, train seconds
    records += [_eval("worker-0", s, a, t) for s, a, t in seen]
    assert stats.eval_waits(records) == {1, 11, 21}
    m = stats.measure(records, {"test_accuracy": 0.9}, run_id="r", steps=20, wall_seconds=9.0,
                      target=0.95, foreign_cpu=0.25)  # fmt: skip
    assert m.step_time == pytest.approx(0.1) and m.examples_per_sec == pytest.approx(200.0)
    assert (m.seconds_to_target, m.best_eval_accuracy, m.evals) == (1.2, 0.97, 3)
    assert m.foreign_cpu == 0.25 and m.comm_ms_per_step is None
    missed = stats.measure(records, {"test_accuracy": 0.9}, run_id="r", steps=20,
                           wall_seconds=9.0, target=0.99)  # fmt: skip
    assert missed.seconds_to_target is None and missed.best_eval_accuracy == 0.97
    assert stats.time_to_target([], 0.5) is None
    # The PS chief: a record per 10 steps, an evaluation before each, timed without it.
    ps = [step_record("chief-0", s, 640.0, step_time=0.1) for s in (10, 20, 30)]
    ps += [_eval("chief-0", s, 0.9, s / 10) for s in (0, 10, 20, 30)]
    with pytest.raises(DdlkitError, match="no step records after the first 6 steps"):
        stats.measure(ps, {"test_accuracy": 0.9}, run_id="r", steps=30, wall_seconds=9.0)
    kept = stats.measure(ps, {"test_accuracy": 0.9}, run_id="r", steps=30, wall_seconds=9.0,
                         evals_in_step_time=False)  # fmt: skip
    assert kept.step_time == pytest.approx(0.1)
    assert config.EVALS_OUTSIDE_STEP_TIME == {"parameter_server"}


def test_communication_is_measured_estimated_or_says_why_not():
    assert stats.communication("single", 0.03, None, 0.03).share is None
    ps = stats.communication("parameter_server", 0.05, None, 0.03)
    assert ps.share is None and ps.how.startswith("not measured: ParameterServerStrategy")
    hvd = stats.communication("horovod", 0.05, 10.0, 0.03, profiled_step_time=0.08)
    assert hvd.share == pytest.approx(0.125) and hvd.ms_per_step == 10.0  # of the profiled step
    assert hvd.how.startswith("measured: allreduce") and "80 ms/step against 50 without" in hvd.how
    assert stats.communication("horovod", 0.05, None, 0.03).how.startswith("not measured")
    one = stats.communication("horovod", 0.03, None, 0.03, workers=1)
    assert one.share == 0.0 and one.how.startswith("one rank")
    mw = stats.communication("multi_worker", 0.05, None, 0.03)
    assert mw.share == pytest.approx(0.4) and mw.ms_per_step == pytest.approx(20.0)
    assert mw.how.startswith("estimate")
    assert stats.communication("multi_worker", 0.02, None, 0.03).share == 0.0  # never negative
    assert stats.communication("mirrored", 0.05, None, None).how.startswith("not estimated")


def test_bench_json_has_comm_target_and_others_cpu_per_case(tmp_path):
    res = _result(tmp_path)
    res.cases[0].runs = [stats.RunMeasure("s", 1000.0, 0.03, 0.9, 5.0, 2.0, 0.96, 4, 0.0)]
    res.cases[2].case = BenchCase("multi_worker", 2, 20, repeats=2, eval_every=10)
    res.cases[2].runs = [
        stats.RunMeasure("a", 1700.0, 0.05, 0.9, 9.0, 3.0, 0.96, 3, 0.1),
        stats.RunMeasure("b", 1900.0, 0.05, 0.9, 9.0, None, 0.94, 3, 0.3),
    ]
    doc = res.to_dict()
    by = {c["name"]: c for c in doc["cases"]}
    mw2 = by["multi_worker-x2"]
    assert mw2["comm"]["share"] == pytest.approx(0.4) and "estimate" in mw2["comm"]["how"]
    assert mw2["seconds_to_target"] == {"median": 3.0, "min": 3.0, "max": 3.0, "n": 1}
    assert mw2["target_reached"] == "1/2"
    assert mw2["target_note"] == (
        "not reached in 20 steps by 1 of 2 runs (best held-out accuracy 0.960)"
    )
    assert mw2["foreign_cpu"]["median"] == pytest.approx(0.2)
    assert by["multi_worker-x1"]["target_note"].startswith("not measured: no held-out")
    assert by["single-x1"]["comm"]["how"].startswith("one device")
    text = str(res.results())
    assert "40% (estimated)" in text and "3.0 s, 1/2 runs" in text and "20%" in text
    assert "] estimate: (step time" in text and "] not reached in 20 steps by 1 of 2" in text


def test_foreign_cpu_share_from_proc_stat(monkeypatch):
    from ddlkit.bench import cpu

    text = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 50 800 50 0 0 0 0 0\n"
    text += "cpu1 10 0 10 980 0 0 0 0 0 0\n"
    assert cpu.parse_proc_stat(text, (0,)) == (150, 1000)  # iowait is not busy
    assert cpu.parse_proc_stat(text, (0, 1)) == (170, 2000)
    tick = __import__("os").sysconf("SC_CLK_TCK")
    assert cpu.foreign_share(600, 1000, 1.0 * 300 / tick) == pytest.approx(0.3)
    assert cpu.foreign_share(100, 1000, 5.0 * 1000 / tick) == 0.0  # clipped, never negative
    assert cpu.foreign_share(0, 0, 0.0) is None
    watch = cpu.CpuWatch.start((0,))
    time.sleep(0.2)  # a few clock ticks
    assert 0.0 <= watch.foreign_share() <= 1.0


def test_a_case_starts_with_its_cores_and_env_and_leaves_this_process_alone(tmp_path, monkeypatch):
    import os

    seen = {}

    def fake_start(script, **kwargs):
        seen.update(kwargs)
        raise DdlkitError("stop here")

    monkeypatch.setattr("ddlkit.launch.run.start", fake_start)
    affinity, environ = os.sched_getaffinity(0), dict(os.environ)
    timeline = tmp_path / "t" / "horovod-x2.json"
    with pytest.raises(DdlkitError, match="stop here"):
        run.run_case_once(BenchCase("horovod", 2, 20), cpus=(0,), runs_dir=tmp_path,
                          timeline=timeline)  # fmt: skip
    assert seen["where"] == ThisMachine(cores=(0,))
    assert seen["env"] == {"HOROVOD_TIMELINE": str(timeline)}
    assert seen["workers"] == 2 and seen["strategy"] == "horovod"
    with pytest.raises(DdlkitError, match="stop here"):
        run.run_case_once(BenchCase("multi_worker", 2, 20), cpus=(0, 1), runs_dir=tmp_path)
    assert seen["where"] == ThisMachine(cores=(0, 1)) and seen["env"] == {}
    assert os.sched_getaffinity(0) == affinity and dict(os.environ) == environ
