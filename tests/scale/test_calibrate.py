"""ddlkit.scale.calibrate on the recorded bench.json and the recorded all-reduce fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit.bench.schema import read
from ddlkit.errors import ConfigError
from ddlkit.horovod.timing import AllreduceTiming
from ddlkit.scale import ModelSpec, calibrate, predict

# The full benchmark recorded on 2026-11-21 (then notebooks/data/bench-full.json): the recording
# this calibration was checked against; notebook 09 calibrates on the current one.
BENCH = Path(__file__).parent / "data" / "bench-2026-11-21.json"
# Its Horovod ran over Gloo, so the Gloo fit goes with it: the course's Horovod fit
# until 2026-11-25 05:31 UTC, before the horovod strategy ran over MPI (the current file).
ALLREDUCE = Path(__file__).parent / "data" / "allreduce-gloo-2026-11-25.json"
# the benchmark's model, as dk.bench.ratio counts it (tests/scale/test_scale_models.py checks)
MNIST_CNN = ModelSpec("mnist_cnn", 225_034, 5_291_594, 64, 8)


@pytest.fixture(scope="module")
def cal():
    return calibrate(BENCH, ALLREDUCE, MNIST_CNN)


def test_parameters_come_from_the_recorded_cases_and_the_fit(cal):
    doc, _ = read(BENCH)
    step = {c.name: c.step_time.median for c in doc.cases if c.step_time}
    a, b = AllreduceTiming.from_dict(json.loads(ALLREDUCE.read_text())).fit()
    side = step["independent-x2"] / step["single-x1"]
    assert cal.side_by_side == pytest.approx(side)
    compute = step["horovod-x1"] * side
    assert cal.hardware.accelerator.sustained_flops == pytest.approx(3 * 5_291_594 * 64 / compute)
    assert cal.hardware.intra.latency == pytest.approx(a / 2)
    assert cal.hardware.intra.bandwidth == pytest.approx(b)
    # 2 workers, ring, overlap 0: compute + a + S / B
    assert cal.prediction.step == pytest.approx(compute + a + 225_034 * 4 / b)
    assert cal.measured_step == pytest.approx(step["horovod-x2"])


def test_two_worker_prediction_is_close_to_the_measured_step(cal):
    # the model leaves out waiting and negotiation, so it may only be faster, and by little
    assert 0 <= cal.difference <= 0.15 * cal.measured_step
    assert abs(cal.predicted_efficiency - cal.measured_efficiency) < 0.10
    assert "<table>" in cal._repr_html_() and "ms" in str(cal)


def test_the_calibrated_machine_predicts_like_any_preset(cal):
    p = predict(MNIST_CNN, cal.hardware, 8, "ring", overlap=0.0)
    assert p.efficiency < cal.prediction.efficiency  # more workers, more latency


def test_a_pair_latency_bandwidth_works_too():
    c = calibrate(BENCH, (1e-3, 1e9), MNIST_CNN)
    assert c.prediction.communication == pytest.approx(1e-3 + 225_034 * 4 / 1e9)


def test_a_strategy_the_benchmark_did_not_run_is_refused():
    with pytest.raises(ConfigError, match="no measured case 'gossip-x1'"):
        calibrate(BENCH, (1e-3, 1e9), MNIST_CNN, strategy="gossip")


def test_a_batch_other_than_the_benchmark_s_is_refused():
    with pytest.raises(ConfigError, match="batch 64"):
        calibrate(BENCH, (1e-3, 1e9), MNIST_CNN.with_batch(32))


def test_an_unreadable_timing_file_is_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="cannot read the all-reduce timing"):
        calibrate(BENCH, bad, MNIST_CNN)
