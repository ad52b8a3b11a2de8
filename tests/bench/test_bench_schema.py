"""ddlkit.bench.schema: bench.json as typed data, written and read by the same classes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_bench_results import document

from ddlkit.bench import schema
from ddlkit.bench.schema import (
    BenchFile,
    CaseRecord,
    Communication,
    Machine,
    OverheadRecord,
    RunMeasure,
    SchemaError,
    Spread,
)
from ddlkit.errors import ConfigError

RECORDED = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "bench-full.json"


def full_case() -> CaseRecord:
    run = RunMeasure("r1", 1500.0, 0.08, 0.95, 30.0, 12.5, 0.96, 8, 0.05, 3.5)
    return CaseRecord(
        name="horovod-x2",
        strategy="horovod",
        workers=2,
        steps=200,
        batch=64,
        repeats=1,
        model="mnist",
        eval_every=25,
        eval_examples=1000,
        runs=(run,),
        examples_per_sec=Spread(1500.0, 1500.0, 1500.0, 1),
        step_time=Spread(0.08, 0.08, 0.08, 1),
        test_accuracy=Spread(0.95, 0.95, 0.95, 1),
        foreign_cpu=Spread(0.05, 0.05, 0.05, 1),
        seconds_to_target=Spread(12.5, 12.5, 12.5, 1),
        target_reached="1/1",
        comm=Communication(0.04, 3.5, "measured: allreduce"),
        profile_run=run,
        speedup=1.6,
        efficiency=0.8,
        vs_single=0.7,
    )


def test_every_record_round_trips_through_json():
    case = full_case()
    skipped = CaseRecord("horovod-x1", "horovod", 1, skipped="horovodrun was not found")
    overhead = OverheadRecord(1.05, (1.2, 1.05, 0.97), (1.0, 2.0, 3.0), (1.2, 2.1, 2.9), 0.97,
                              1.2, ("hand-first", "kit-first", "hand-first"), 2, 200)  # fmt: skip
    machine = Machine.of([0, 1], 1, {"cpu_model": "X", "load_start": [1.0, 2.0, 3.0]})
    doc = BenchFile(
        bench_id="b",
        created=1795251959.85,
        machine=machine,
        cases=(case, skipped),
        quick=True,
        wall_seconds=12.0,
        command="ddlkit bench --quick",
        target_accuracy=0.95,
        overhead=overhead,
        extra=(("host", "box"),),
    )
    resnet = replace(case, name="horovod-x2-resnet", model="cifar10", arch="small_resnet")
    assert resnet.to_json()["arch"] == "small_resnet" and resnet.architecture == "small_resnet"
    assert "arch" not in case.to_json() and case.architecture == "cnn"  # as files before it
    for record in (case, resnet, skipped, overhead, machine, case.runs[0], case.comm):
        assert type(record).from_json(json.loads(json.dumps(record.to_json()))) == record
    text = json.dumps(doc.to_json())
    assert BenchFile.from_json(json.loads(text)) == doc
    assert json.loads(text)["created_utc"] == "2026-11-21T09:05:59.850000+00:00"
    assert json.loads(text)["host"] == "box"  # a key this ddlkit does not know is kept


def test_write_atomic_and_read_give_back_the_same_file(tmp_path):
    doc = BenchFile.from_json(document())
    path = schema.write_atomic(doc, tmp_path / "b" / "bench.json")
    assert not list(path.parent.glob("*.tmp"))
    assert schema.read(path.parent) == (doc, path)


def test_the_recorded_full_benchmark_still_reads():
    raw = json.loads(RECORDED.read_text())
    doc = BenchFile.from_json(raw, RECORDED)
    assert doc.schema in (2, 3) and len(doc.cases) == len(raw["cases"]) >= 10
    assert {c.name for c in doc.cases} >= {"single-x1", "multi_worker-x2", "horovod-x2"}
    assert all(c.examples_per_sec is not None for c in doc.cases if not c.skipped)
    assert doc.overhead is not None and doc.overhead.ratio_median == raw["overhead"]["ratio_median"]
    assert doc.to_json() == raw  # written today as it was recorded
    assert {c.architecture for c in doc.cases} == {"cnn", "small_resnet"}  # ddlkit bench --resnet


def test_records_check_themselves():
    with pytest.raises(SchemaError, match="min <= median <= max"):
        Spread(2.0, 3.0, 4.0, 1)
    with pytest.raises(SchemaError, match="not a finite number"):
        Spread(float("nan"), 0.0, 1.0, 1)
    with pytest.raises(SchemaError, match="run r examples_per_sec is 'fast', not a number"):
        RunMeasure("r", "fast", 0.1, 0.9, 1.0)
    with pytest.raises(SchemaError, match="workers=0"):
        CaseRecord("x", "single", 0)
    with pytest.raises(SchemaError, match="no cases"):
        BenchFile("b", 1.0, Machine((0,), 1), ())
    with pytest.raises(SchemaError, match="machine has cores"):
        Machine((), 1)


def test_a_malformed_run_names_its_case_and_the_fix(tmp_path):
    doc = document()
    del doc["cases"][0]["runs"][0]["step_time"]
    with pytest.raises(ConfigError, match="case 'single-x1': a run is malformed.*step_time") as e:
        BenchFile.from_json(doc, tmp_path / "bench.json")
    assert str(tmp_path / "bench.json") in str(e.value) and "ddlkit bench" in str(e.value)


def test_schema_one_files_read_with_what_they_lack_as_none():
    doc = document(schema=1)
    for c in doc["cases"]:
        for key in ("comm", "seconds_to_target", "foreign_cpu", "target_note", "eval_every"):
            c.pop(key, None)
        for r in c["runs"]:
            for key in ("seconds_to_target", "best_eval_accuracy", "evals", "foreign_cpu"):
                r.pop(key)
    for key in ("command", "target_accuracy", "created_utc"):
        del doc[key]
    old = BenchFile.from_json(doc)
    assert old.schema == 1 and old.command is None and old.target_accuracy is None
    assert old.cases[0].comm is None and old.cases[0].runs[0].evals == 0
