"""ddlkit.bench.ratio: FLOPs and parameters of the kit's models, and the scaling estimate."""

from __future__ import annotations

import pytest

from ddlkit.bench import ratio
from ddlkit.bench.ratio import ModelProfile, Profiles, predict
from ddlkit.errors import ConfigError


def test_forward_flops_of_the_mnist_cnn_by_hand():
    model = ratio.build("mnist_cnn")
    conv1 = 2 * 26 * 26 * 32 * 9 * 1 + 26 * 26 * 32  # 28x28x1 -> 26x26x32, then pool to 13
    conv2 = 2 * 11 * 11 * 64 * 9 * 32 + 11 * 11 * 64  # 13x13x32 -> 11x11x64, then pool to 5
    dense = 2 * 5 * 5 * 64 * 128 + 128
    logits = 2 * 128 * 10 + 10
    assert ratio.forward_flops(model) == conv1 + conv2 + dense + logits
    assert model.count_params() == 225_034


def test_the_resnet_computes_far_more_per_parameter_than_the_mnist_cnn():
    profiles = ratio.profile_models(("mnist_cnn", "small_resnet"), batch=8, steps=0)
    cnn, resnet = profiles["mnist_cnn"], profiles["small_resnet"]
    assert resnet.params < cnn.params  # fewer bytes to synchronise...
    assert resnet.flops_per_param > 10 * cnn.flops_per_param  # ...for much more arithmetic
    assert cnn.step_seconds is None  # steps=0: not timed
    assert cnn.param_bytes == 4 * cnn.params
    assert cnn.train_flops_per_step == 3 * cnn.forward_flops * 8
    assert "small_resnet" in profiles._repr_html_() and "176,378" in str(profiles)


def test_profile_times_a_real_training_step():
    (p,) = ratio.profile_models(("mnist_cnn",), batch=8, steps=2)
    assert 0 < p.step_seconds < 60


def test_ring_bytes_per_worker():
    p = ModelProfile("m", params=1000, forward_flops=1, batch=1)
    assert p.ring_bytes(1) == 0
    assert p.ring_bytes(2) == 4000  # 2 (N-1)/N x 4000 bytes
    assert p.ring_bytes(4) == 6000
    with pytest.raises(ConfigError):
        p.ring_bytes(0)


def test_predict_gives_back_the_measured_efficiency_and_scales_the_others():
    profiles = Profiles(
        (
            ModelProfile("mnist_cnn", 1000, 10, 64, step_seconds=0.02),
            ModelProfile("deep", 500, 400, 64, step_seconds=0.2),
        )
    )
    pred = predict(profiles, x1_step=0.06, xn_step=0.08, workers=2)
    assert pred.efficiency("mnist_cnn") == pytest.approx(0.06 / 0.08)
    # 10x the compute (0.6 s), half the bytes (0.01 s to synchronise)
    assert pred.efficiency("deep") == pytest.approx(0.6 / 0.61)
    assert pred.extra_seconds == pytest.approx(0.02)
    assert "75%" in pred._repr_html_() and "98%" in str(pred)
    # faster with more workers (noise): no negative synchronisation time
    assert predict(profiles, 0.08, 0.06, 2).efficiency("deep") == 1.0


def test_timed_profiles_predict_with_another_machines_steps():
    profiles = Profiles(
        (
            ModelProfile("mnist_cnn", 1000, 10, 64),
            ModelProfile("deep", 500, 400, 64, step_seconds=9.0),
            ModelProfile("other", 10, 10, 64),
        )
    )
    there = profiles.timed({"mnist_cnn": 0.02, "deep": 0.2})
    assert [(p.name, p.step_seconds) for p in there] == [("mnist_cnn", 0.02), ("deep", 0.2)]
    assert predict(there, 0.06, 0.08, 2).efficiency("deep") == pytest.approx(0.6 / 0.61)
    assert profiles["deep"].step_seconds == 9.0  # the profiles themselves are unchanged
    with pytest.raises(ConfigError, match="no profile 'vgg'"):
        profiles.timed({"vgg": 1.0})


def test_predict_refuses_what_it_cannot_estimate():
    timed = Profiles((ModelProfile("mnist_cnn", 1000, 10, 64, step_seconds=0.02),))
    with pytest.raises(ConfigError, match="2 or more workers"):
        predict(timed, 0.06, 0.08, 1)
    untimed = Profiles((ModelProfile("mnist_cnn", 1000, 10, 64),))
    with pytest.raises(ConfigError, match="no measured step time"):
        predict(untimed, 0.06, 0.08, 2)
    with pytest.raises(ConfigError, match="unknown model 'vgg'"):
        ratio.build("vgg")
    with pytest.raises(ConfigError, match="no profile 'x'"):
        timed["x"]
