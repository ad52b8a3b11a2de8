"""ddlkit.scale.timeline, .gradients and .leftout: the step as Horovod and NCCL run it, by hand."""

from __future__ import annotations

import pytest

from ddlkit.errors import ConfigError
from ddlkit.scale import (
    Accelerator,
    Algorithm,
    Hardware,
    Link,
    ModelSpec,
    gradients,
    model,
    predict,
    published,
    sensitivity,
    timeline,
)
from ddlkit.scale.predict import expected_max

CHIP = Accelerator("1 TFLOP/s", 1e12, 16e9)
BUS = Link("bus", 1e10, 2e-6)
NET = Link("net", 1e9, 20e-6)
# 1e6 params (4 MB), 1 GFLOP forward, batch 10: compute 30 ms, backward 20 ms
LATE = ModelSpec("late", 1e6, 1e9, 10, gradients=((1.0, 4_000_000, 1),))
EARLY = ModelSpec("early", 1e6, 1e9, 10, gradients=((0.0, 4_000_000, 1),))


def hw(per_node=4, jitter=0.0):
    return Hardware(CHIP, per_node, BUS, NET, jitter=jitter)


def test_a_ring_call_pays_nccl_s_latency_per_hop_and_the_bytes_at_the_achieved_rate():
    h = hw()
    n, m = 16, 4
    hops = (2 * (n - 1) - 2 * (m - 1)) * 2e-6 + 2 * (m - 1) * 20e-6  # NET hop: max(20, 9.6) us
    expect = timeline.NCCL_BASE_LATENCY + timeline.NCCL_PLATEAU * hops
    expect += 2 * (n - 1) / n * 4e6 / (0.85 * 1e9)
    assert timeline.call_time(4e6, n, h, "ring") == pytest.approx(expect)
    # small messages: no plateau factor (NCCL's ncclTopoGetAlgoTime)
    small = timeline.call_time(1e3, n, h, "ring") - 2 * 15 / 16 * 1e3 / 0.85e9
    assert small == pytest.approx(timeline.NCCL_BASE_LATENCY + hops)


def test_the_ring_s_latency_grows_with_n_where_its_bytes_do_not():
    h = hw()
    lat = [timeline.hops("ring", n, h, 4e6) for n in (16, 128, 512)]
    assert lat[0] < lat[1] < lat[2] and lat[2] / lat[0] > 25
    tree = [timeline.hops("tree", n, h, 4e6) for n in (16, 128, 512)]
    assert tree[2] < lat[2] / 20  # the double binary tree: log2 of the nodes


def test_gradients_ready_at_the_end_expose_everything_ready_at_the_start_hide_it():
    late = predict(LATE, hw(), 8)  # 2 nodes
    early = predict(EARLY, hw(), 8)
    call = timeline.call_time(4e6, 8, hw(), "ring")
    # late: the first cycle after the 20 ms backward pass, then the call
    assert late.calls == 1 and late.exposed == pytest.approx(0.0 + call, abs=5e-3 + 1e-9)
    assert late.exposed >= call
    # early: the call starts at the first cycle (5 ms) and ends before the backward pass
    assert call + 5e-3 < 0.020 and early.exposed == 0.0 and early.efficiency == 1.0


def test_tensors_larger_than_the_fusion_buffer_go_alone_others_are_fused():
    spec = ModelSpec("m", 1e6, 1e9, 10, gradients=((0.0, 3e6, 3), (0.0, 5e5, 1), (0.0, 5e5, 1)))
    p = predict(spec, hw(), 8, fusion_bytes=1e6)
    assert p.calls == 2  # 3 MB alone; the two 0.5 MB fused
    assert predict(spec, hw(), 8, fusion_bytes=None).calls == 5  # one call per tensor


def test_a_parameter_server_pushes_as_gradients_come_and_pulls_after_the_last():
    p = predict(EARLY, hw(), 8, "ps", servers=2)
    pull = timeline.push_time(4e6, 8, hw(), 2, False)
    assert p.calls == 1 and p.exposed >= pull  # the pull is never hidden


def test_the_slowest_of_n_workers_costs_jitter_x_compute_x_expected_max():
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / 3.141592653589793**0.5, rel=1e-4)  # 1/sqrt(pi)
    assert expected_max(3) == pytest.approx(1.5 / 3.141592653589793**0.5, rel=1e-4)
    p = predict(EARLY, hw(jitter=0.03), 16)
    assert p.wait == pytest.approx(0.03 * 0.030 * expected_max(16))
    assert p.step == pytest.approx(p.compute + p.wait + p.exposed)
    assert predict(EARLY, hw(jitter=0.03), 16, "async_ps").wait == 0.0  # no barrier, no wait


def test_an_explicit_overlap_is_the_one_page_formula():
    a = Algorithm("ring", overlap=0.5)
    assert not a.timeline and Algorithm("ring").timeline and not Algorithm("async_ps").timeline
    with pytest.raises(ConfigError, match="overlap=2"):
        Algorithm("ring", overlap=2)
    with pytest.raises(ConfigError, match="cycle_time=0"):
        Algorithm("ring", cycle_time=0)


def test_public_profiles_hold_each_model_s_trainable_bytes_in_backward_order():
    for name, profile in gradients.PUBLIC.items():
        spec = model(name)
        shares = [s for s, _, _ in profile]
        assert shares == sorted(shares) and shares[-1] == 1.0
        total = sum(b for _, b, _ in profile)
        assert total == pytest.approx(spec.param_bytes(), rel=0.003)  # BN statistics: not trained
        assert sum(t for *_, t in profile) == spec.tensors
    vgg = gradients.PUBLIC["vgg16"]
    first = sum(b for s, b, _ in vgg if s <= 0.01)
    assert first / sum(b for _, b, _ in vgg) > 0.89  # the dense layers, ready first


def test_a_profile_checks_itself_and_the_default_is_even():
    with pytest.raises(ConfigError, match="rising"):
        ModelSpec("x", 1e6, 1e9, 1, gradients=((0.5, 1, 1), (0.2, 1, 1)))
    with pytest.raises(ConfigError, match="share, bytes, tensors"):
        ModelSpec("x", 1e6, 1e9, 1, gradients=((0.5, 1),))
    even = ModelSpec("x", 1e6, 1e9, 1, tensors=4).profile()
    assert [s for s, _, _ in even] == [0.25, 0.5, 0.75, 1.0]
    assert sum(b for _, b, _ in even) == 4_000_000


def test_sensitivity_re_predicts_each_left_out_effect_at_both_ends():
    run = next(s for s in published.SETUPS if s.key == "horovod-128-vgg16")
    spec, h = run.spec(), run.hardware()  # Horovod's servers, VGG-16 at its published rate
    s = sensitivity(spec, h, 128)
    base = predict(spec, h, 128).efficiency
    assert s.base.efficiency == pytest.approx(base)
    assert s.low <= base <= s.high
    none, perfect = s.moves("overlap")
    assert none < base <= perfect + 1e-12  # nothing hidden is worse
    slow, fast = s.moves("stragglers")
    assert fast == pytest.approx(predict(spec, h.replace(jitter=0.0), 128).efficiency)
    assert slow < base < fast
    congested, line_rate = s.moves("congestion")
    assert congested < base < line_rate
    with pytest.raises(KeyError, match="known"):
        s.moves("cosmic rays")
    assert "<table>" in s._repr_html_() and "stragglers" in str(s)
