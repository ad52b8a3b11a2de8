from __future__ import annotations

import json

import pytest

from ddlkit import results
from ddlkit.errors import DdlkitError


def _result(**over):
    base = dict(
        name="baseline",
        strategy="single device",
        dataset="mnist",
        workers=1,
        replicas=1,
        global_batch=128,
        epochs=1.0,
        steps=469,
        examples_per_sec=1000.0,
        test_accuracy=0.98,
        train_seconds=60.0,
    )
    base.update(over)
    return results.Result(**base)


def test_save_and_load_round_trip(tmp_path):
    r = _result()
    path = results.save(r, tmp_path)
    assert json.loads(path.read_text())["test_accuracy"] == 0.98
    assert results.load("baseline", tmp_path) == r
    assert not list(tmp_path.glob("*.tmp*")), "no temp files left behind"


def test_missing_baseline_names_the_notebook(tmp_path):
    with pytest.raises(DdlkitError, match="00_start_here"):
        results.load("baseline", tmp_path)


@pytest.mark.parametrize(
    "over, word",
    [
        ({"name": "../x"}, "name"),
        ({"replicas": 0}, "replicas"),
        ({"test_accuracy": 1.5}, "test_accuracy"),
        ({"examples_per_sec": 0.0}, "positive"),
    ],
)
def test_bad_results_are_refused(over, word):
    with pytest.raises(ValueError, match=word):
        _result(**over)


def test_comparison_shows_speed_up_and_marks_synthetic_data(tmp_path):
    base = _result()
    fast = _result(name="mirrored", strategy="mirrored", replicas=2, examples_per_sec=1800.0)
    fake = _result(name="cifar", dataset="cifar10", synthetic_data=True)
    cmp = results.compare(fast, fake, baseline=base)
    html = cmp._repr_html_()
    assert "1.80x" in html
    assert "synthetic stand-in" in html
    assert "1.80x" in repr(cmp)


def test_throughput_is_the_sum_of_steady_worker_medians():
    from ddlkit.metrics import Record

    def step(worker, seq, eps):
        return Record(
            kind="step",
            worker=worker,
            step=seq,
            epoch=0,
            seq=seq,
            wall_time=1.0 + seq,
            examples_per_sec=eps,
        )

    warm = [step("w0", i, 10.0) for i in range(5)]
    steady = [step("w0", 5 + i, v) for i, v in enumerate([100.0, 120.0, 110.0])]
    other = [step("w1", i, 50.0) for i in range(3)]
    assert results.throughput(warm + steady + other) == 110.0 + 50.0


def test_throughput_without_steps_names_the_fix():
    with pytest.raises(DdlkitError, match="batch_size"):
        results.throughput([])
