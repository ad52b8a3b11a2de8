"""Metric records: JSON round trip, and every kind of bad record refused."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from ddlkit.errors import DdlkitError, RecordError
from ddlkit.metrics import Record, load_run, metrics_path
from ddlkit.metrics.store import JsonlWriter


def _step(**changes) -> Record:
    fields = dict(
        kind="step",
        worker="worker-0",
        step=3,
        epoch=1,
        wall_time=1700000000.25,
        seq=7,
        loss=0.5,
        accuracy=0.875,
        examples_per_sec=1234.5,
        step_time=0.1,
        metrics={"lr": 0.001},
    )
    fields.update(changes)
    return Record(**fields)


def _valid_dict() -> dict:
    return json.loads(_step().to_json())


def test_round_trip_keeps_every_field():
    record = _step()
    line = record.to_json()
    assert "\n" not in line
    assert Record.from_json(line) == record
    assert Record.from_json(line.encode()) == record
    event = Record(
        kind="event",
        worker="chief-0",
        step=0,
        epoch=0,
        wall_time=1.0,
        seq=0,
        name="train_begin",
        info={"epochs": 3, "note": "hi", "ok": True, "missing": None, "lr": 0.1},
    )
    back = Record.from_json(event.to_json())
    assert back == event
    assert back.info["ok"] is True and back.info["epochs"] == 3


def test_json_has_the_documented_fields_in_order():
    keys = list(json.loads(_step().to_json()))
    assert keys == [
        "v",
        "kind",
        "worker",
        "step",
        "epoch",
        "loss",
        "accuracy",
        "examples_per_sec",
        "step_time",
        "wall_time",
        "seq",
        "metrics",
        "name",
        "info",
    ]


def test_ints_become_floats_and_nan_survives():
    record = Record.from_json(json.dumps({**_valid_dict(), "loss": 2, "wall_time": 5}))
    assert isinstance(record.loss, float) and record.loss == 2.0
    assert isinstance(record.wall_time, float)
    diverged = Record.from_json(_step(loss=float("nan")).to_json())
    assert math.isnan(diverged.loss)


def test_records_are_immutable():
    record = _step()
    with pytest.raises(AttributeError):
        record.loss = 1.0
    with pytest.raises(TypeError):
        record.metrics["lr"] = 1.0


def test_old_v1_lines_without_name_and_info_parse():
    data = _valid_dict()
    del data["name"], data["info"]
    assert Record.from_json(json.dumps(data)) == _step()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "gradient"}, "kind 'gradient' is unknown"),
        ({"v": 2}, "version 2"),
        ({"worker": "../etc"}, "worker name"),
        ({"worker": ""}, "worker name"),
        ({"worker": 7}, "worker name"),
        ({"step": -1}, "'step' must be an integer"),
        ({"step": 1.5}, "'step' must be an integer"),
        ({"seq": True}, "'seq' must be an integer"),
        ({"epoch": "1"}, "'epoch' must be an integer"),
        ({"loss": "0.5"}, "'loss' must be a number"),
        ({"accuracy": True}, "'accuracy' must be a number"),
        ({"wall_time": None}, "'wall_time' must be a finite number"),
        ({"wall_time": float("inf")}, "'wall_time' must be a finite number"),
        ({"metrics": [1, 2]}, "'metrics' must be a mapping"),
        ({"metrics": {"val loss": 1.0}}, "metrics key 'val loss'"),
        ({"metrics": {"x": "high"}}, "metric 'x' must be a number"),
        ({"metrics": {f"m{i}": 1.0 for i in range(65)}}, "more than 64"),
        ({"info": {"x": [1]}}, "info field 'x' must be a str"),
        ({"info": {"x": "y" * 1001}}, "more than 1000"),
        ({"name": "train_begin"}, "only event records have a name"),
        ({"surprise": 1}, "unknown field(s) ['surprise']"),
    ],
)
def test_bad_records_are_refused(change, message):
    data = {**_valid_dict(), **change}
    with pytest.raises(RecordError) as info:
        Record.from_json(json.dumps(data))
    assert message in str(info.value)
    assert "Fix" in str(info.value)
    assert isinstance(info.value, DdlkitError) and isinstance(info.value, ValueError)


def test_event_needs_a_name():
    data = {**_valid_dict(), "kind": "event"}
    with pytest.raises(RecordError, match="event record needs a name"):
        Record.from_json(json.dumps(data))


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"v": 1}',
        b"\xff\xfe",
        b'{"v": 1, "v": 1, "kind": "step"}',
    ],
)
def test_non_records_are_refused(line):
    with pytest.raises(RecordError):
        Record.from_json(line)


def test_missing_field_is_named():
    data = _valid_dict()
    del data["seq"]
    with pytest.raises(RecordError, match=r"missing field\(s\) \['seq'\]"):
        Record.from_json(json.dumps(data))


def test_jsonl_writer_continues_seq_and_repairs_a_cut_line(tmp_path):
    path = metrics_path(tmp_path, "worker-1")
    writer = JsonlWriter(path)
    assert writer.next_seq == 0
    for seq in range(3):
        writer.write((_step(worker="worker-1", seq=seq).to_json() + "\n").encode())
    writer.close()
    with open(path, "ab") as f:  # a worker killed in the middle of a line
        f.write(_step(worker="worker-1", seq=3).to_json()[:20].encode())
    writer = JsonlWriter(path)
    assert writer.next_seq == 3
    writer.write((_step(worker="worker-1", seq=3).to_json() + "\n").encode())
    writer.close()
    with pytest.warns(RuntimeWarning, match=r"skipped 1 line\(s\).*line 4"):
        records = load_run(tmp_path)
    assert [r.seq for r in records] == [0, 1, 2, 3]


def test_load_run_orders_by_worker_and_seq(tmp_path):
    for worker in ("worker-1", "worker-0"):
        writer = JsonlWriter(metrics_path(tmp_path, worker))
        for seq in range(2):
            writer.write((_step(worker=worker, seq=seq).to_json() + "\n").encode())
        writer.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = load_run(tmp_path)
    assert [(r.worker, r.seq) for r in records] == [
        ("worker-0", 0),
        ("worker-0", 1),
        ("worker-1", 0),
        ("worker-1", 1),
    ]


def test_load_run_without_metrics_names_the_fix(tmp_path):
    with pytest.raises(DdlkitError, match="no metrics/ directory.*Fix"):
        load_run(tmp_path)


def test_metrics_path_refuses_unsafe_worker_names(tmp_path):
    with pytest.raises(DdlkitError, match="cannot name a metrics file"):
        metrics_path(tmp_path, "../../x")
