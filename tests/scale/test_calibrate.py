"""ddlkit.scale.calibrate: every strategy's 2-worker step from a bench.json and the all-reduce fits.

The formulas are checked on a frozen benchmark (tests/scale/data, with the Gloo fit of its time
and a bare (latency, bandwidth) pair for gRPC); the course's own recording (notebooks/data, the
files notebook 09 reads) is checked for what notebook 09 says of it: each strategy within 10% of
its prediction, or the difference accounted for by a recorded measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlkit import recorded
from ddlkit.bench.schema import read
from ddlkit.errors import ConfigError
from ddlkit.horovod.timing import AllreduceTiming
from ddlkit.scale import ModelSpec, calibrate, predict
from ddlkit.scale.calibrate import Transport, transport

DATA = Path(__file__).parent / "data"
# A full benchmark of an earlier kit whose Horovod ran over Gloo, and the Gloo fit measured
# with it: frozen inputs for the formulas (notebook 09 calibrates on notebooks/data).
BENCH = DATA / "bench-2026-11-21.json"
GLOO = DATA / "allreduce-gloo-2026-11-25.json"
GRPC = (1.2e-3, 0.5e9)  # a gRPC fit as a bare (latency s, bandwidth bytes/s) pair
# the benchmark's model, as dk.bench.ratio counts it (tests/scale/test_scale_models.py checks)
MNIST_CNN = ModelSpec("mnist_cnn", 225_034, 5_291_594, 64, 8)
S = 225_034 * 4


@pytest.fixture(scope="module")
def cal():
    return calibrate(BENCH, {"horovod": GLOO, "multi_worker": GRPC}, MNIST_CNN)


def _cases():
    doc, _ = read(BENCH)
    return {c.name: c for c in doc.cases if c.step_time}


def test_all_reduce_strategies_are_compute_beside_another_plus_one_all_reduce(cal):
    c = _cases()
    side = c["independent-x2"].step_time.median / c["single-x1"].step_time.median
    fits = {"horovod": AllreduceTiming.from_dict(json.loads(GLOO.read_text())).fit(), **{}}
    fits["multi_worker"] = GRPC
    for name in ("horovod", "multi_worker"):
        s, (a, b) = cal[name], fits[name]
        assert s.side_by_side == pytest.approx(side)
        compute = c[f"{name}-x1"].step_time.median * side  # one worker all-reduces nothing
        assert s.prediction.compute == pytest.approx(compute)
        assert s.prediction.communication == pytest.approx(a + S / b)  # ring of 2: 2 x a/2
        assert s.predicted_step == pytest.approx(compute + a + S / b)  # no overlap on a CPU
        rate = c[f"{name}-x2"].examples_per_sec.median
        assert s.measured_step == pytest.approx(2 * 64 / rate)
        assert s.hardware.intra.latency == pytest.approx(a / 2)


def test_the_parameter_server_is_compute_plus_its_own_push_and_pull(cal):
    c, (a, b) = _cases(), GRPC
    s = cal["parameter_server"]
    single = c["single-x1"].step_time.median
    side = c["independent-x2"].step_time.median / single
    push_pull = 2 * (a / 2 + S / b)  # each worker, one ps, no barrier
    # one worker already pushes and pulls: its compute is single-x1's, its x1 a prediction
    assert s.anchor == "single-x1"
    assert s.one.communication == pytest.approx(push_pull)
    assert s.one.step == pytest.approx(single + push_pull)
    assert s.own_step == c["parameter_server-x1"].step_time.median
    assert s.prediction.compute == pytest.approx(single * side)
    assert s.prediction.staleness == 1  # the other worker's update
    # a worker loops compute, push, pull; one ps takes B / S updates a second, far more here
    assert s.predicted_step == pytest.approx(single * side + push_pull)
    rate = c["parameter_server-x2"].examples_per_sec.median
    assert s.measured_step == pytest.approx(2 * 64 / rate)  # a worker's loop, not an update


def test_a_parameter_server_gap_can_be_its_own_x1_s_measured_transfers(tmp_path):
    # PS-x1 measured one worker's push, pull and server work in training (x1 - single-x1);
    # a PS-x2 whose loop is compute beside another plus that is accounted for by it
    doc, c = json.loads(BENCH.read_text()), _cases()
    single = c["single-x1"].step_time.median
    side = c["independent-x2"].step_time.median / single
    loop = single * side + c["parameter_server-x1"].step_time.median - single
    for case in doc["cases"]:
        if case["name"] == "parameter_server-x2":
            case["examples_per_sec"] |= {"median": 2 * 64 / loop, "min": 1.0, "max": 1e6}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    ps = calibrate(path, {"multi_worker": (1e-6, 1e12)}, MNIST_CNN)["parameter_server"]
    assert not ps.within
    assert any("parameter_server-x1 measured" in e for e in ps.explanations()), ps.verdict()


def test_the_calibrated_machine_predicts_like_any_preset(cal):
    hw = cal["horovod"].hardware
    p = predict(MNIST_CNN, hw, 8, "ring", overlap=0.0)
    assert p.efficiency < cal["horovod"].prediction.efficiency  # more workers, more latency
    assert "<table>" in cal._repr_html_() and "ms" in str(cal["parameter_server"])


def test_a_transport_reads_its_measured_points_between_sizes():
    t = transport(GLOO)
    points = {p.nbytes: p for p in t.points}
    at = t.measured(65536)
    assert at == pytest.approx(
        (points[65536].seconds, points[65536].min_seconds, points[65536].max_seconds)
    )
    # half-way between 256 KiB and 1 MiB on a log scale: the geometric mean of the two
    mid = t.measured(512 * 1024)[0]
    assert mid == pytest.approx((points[262144].seconds * points[1048576].seconds) ** 0.5)
    assert t.measured(100) is None and t.measured(1e12) is None  # outside what was measured
    assert Transport("pair", *GRPC).measured(S) is None


def test_a_difference_over_10_percent_needs_a_measurement_that_accounts_for_it(tmp_path):
    # a fit that says the all-reduce costs nothing makes Horovod's step too short; a timeline
    # that counted the missing milliseconds in training accounts for them
    doc = json.loads(BENCH.read_text())
    c = _cases()
    side = c["independent-x2"].step_time.median / c["single-x1"].step_time.median
    missing = (
        2 * 64 / c["horovod-x2"].examples_per_sec.median - c["horovod-x1"].step_time.median * side
    )
    for case in doc["cases"]:
        if case["name"] == "horovod-x2":
            case["comm"]["ms_per_step"] = missing * 1e3
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    free = calibrate(path, {"horovod": (1e-9, 1e15)}, MNIST_CNN)["horovod"]
    assert not free.within
    found = free.explanations()
    assert any("timeline counted" in e for e in found), found
    assert free.verdict() == "; ".join(found)
    # a fit far off every measurement: nothing recorded accounts for the difference
    only = ["multi_worker"]
    wrong = calibrate(BENCH, {"multi_worker": (0.1, 1e9)}, MNIST_CNN, strategies=only)
    wrong = wrong["multi_worker"]
    assert not wrong.within and wrong.explanations() == []
    assert wrong.verdict() == "not explained by the recorded measurements"


def test_the_course_recording_every_strategy_within_10_percent_or_explained():
    # the strategies' own transports (the Gloo fit is a comparison, not a strategy's)
    files = {s: recorded.DATA / recorded.ALLREDUCE[s] for s in ("horovod", "multi_worker")}
    bench = recorded.DATA / recorded.BENCH
    cal = calibrate(bench, files, MNIST_CNN)
    assert set(cal.names) == {"horovod", "multi_worker", "parameter_server"}
    for s in cal:
        assert s.within or s.explanations(), (s.strategy, f"{s.relative:+.1%}", s.verdict())
    assert cal["parameter_server"].transport is cal["multi_worker"].transport  # both gRPC


def test_one_fit_alone_is_horovod_s_and_calibrates_horovod_only():
    cal = calibrate(BENCH, GLOO, MNIST_CNN)
    assert cal.names == ("horovod",)
    assert calibrate(BENCH, (1e-3, 1e9), MNIST_CNN)["horovod"].prediction.communication == (
        pytest.approx(1e-3 + S / 1e9)
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: calibrate(BENCH, {"nccl": GRPC}, MNIST_CNN), "no transport"),
        (
            lambda: calibrate(BENCH, {"horovod": GLOO}, MNIST_CNN, strategies=["multi_worker"]),
            "no 'multi_worker' fit",
        ),
        (lambda: calibrate(BENCH, GLOO, MNIST_CNN, strategies=["gossip"]), "cannot calibrate"),
        (lambda: calibrate(BENCH, GLOO, MNIST_CNN.with_batch(32)), "batch 64"),
    ],
)
def test_bad_input_is_one_clear_error(call, match):
    with pytest.raises(ConfigError, match=match) as exc:
        call()
    assert "Fix" in str(exc.value) and "\n" not in str(exc.value)


def test_an_unreadable_timing_file_is_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="cannot read the all-reduce timing"):
        calibrate(BENCH, bad, MNIST_CNN)


def test_a_strategy_the_benchmark_did_not_run_is_refused(tmp_path):
    doc = json.loads(BENCH.read_text())
    doc["cases"] = [c for c in doc["cases"] if not c["name"].startswith("multi_worker")]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="no measured case 'multi_worker-x1'"):
        calibrate(path, {"multi_worker": GRPC}, MNIST_CNN, strategies=["multi_worker"])
