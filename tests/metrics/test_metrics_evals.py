"""ddlkit.metrics.evals: the one reader of ``eval`` events (bench and ps both use it)."""

from __future__ import annotations

import pytest
from harness.factories import step_record

from ddlkit.errors import DdlkitError
from ddlkit.metrics import Record
from ddlkit.metrics.evals import EvalPoint, eval_points, eval_waits, time_to_accuracy


def event(info, name="eval", seq=0):
    return Record(kind="event", worker="worker-0", step=0, epoch=0, wall_time=1.0, seq=seq,
                  name=name, info=info)  # fmt: skip


def test_eval_points_keep_eval_events_in_training_time_order():
    full = {"step": 20, "examples": 1280, "train_seconds": 8.0, "accuracy": 0.9, "loss": 0.3}
    records = [
        step_record("worker-0", 10, 500.0),
        event(full, seq=2),
        event({"train_seconds": 1.0, "accuracy": 0.5}, seq=1),  # step, examples, loss optional
        event({"accuracy": 0.99}, name="evaluate"),  # another event: not a held-out curve point
    ]
    points = eval_points(records)
    assert points == [EvalPoint(1.0, 0.5), EvalPoint(8.0, 0.9, 20, 1280, 0.3)]
    assert points[1].seconds == 8.0
    assert eval_waits(records) == {21}


def test_a_missing_or_required_field_names_the_worker_and_the_fix():
    with pytest.raises(DdlkitError, match=r"'worker-0' \(seq 0\).*accuracy.*Fix: report evals"):
        eval_points([event({"train_seconds": 1.0})])
    with pytest.raises(DdlkitError, match="train_seconds"):
        eval_points([event({"train_seconds": "soon", "accuracy": 0.5})])
    with pytest.raises(DdlkitError, match="loss"):
        eval_points([event({"train_seconds": 1.0, "accuracy": 0.5, "step": 3})], require=("loss",))


def test_time_to_accuracy_is_the_first_point_reaching_the_target():
    points = [EvalPoint(0.0, 0.1, 0), EvalPoint(5.0, 0.85, 10), EvalPoint(9.0, 0.95, 20)]
    assert time_to_accuracy(points, 0.85) == 5.0
    assert time_to_accuracy(points, 0.99) is None
    assert time_to_accuracy([], 0.5) is None
    with pytest.raises(DdlkitError, match=r"\[0, 1\]"):
        time_to_accuracy(points, 90)
