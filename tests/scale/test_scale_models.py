"""ddlkit.scale.models: the step's FLOPs, and model sizes from dk.bench.ratio."""

from __future__ import annotations

import pytest

from ddlkit.bench.ratio import TRAIN_FLOPS_FACTOR
from ddlkit.scale import PUBLIC, ModelSpec, from_profile, model


def test_a_step_costs_three_forward_passes_per_example():
    spec = ModelSpec("m", 1e6, 2e9, 16)
    assert spec.train_flops == TRAIN_FLOPS_FACTOR * 2e9 * 16 == 96e9
    assert spec.param_bytes() == 4e6 and spec.param_bytes(2) == 2e6


def test_public_sizes_and_batch():
    assert model("vgg16").params == 138_357_544
    assert model("resnet50", batch=64).batch == 64
    assert set(PUBLIC) == {"resnet50", "resnet101", "resnet152", "inception_v3", "vgg16"}
    # one gradient tensor per trainable weight: what "no fusion" all-reduces one by one
    assert {m.name: m.tensors for m in PUBLIC.values()} == {
        "resnet50": 214,
        "resnet101": 418,
        "resnet152": 622,
        "inception_v3": 190,
        "vgg16": 32,
    }


def test_from_profile_takes_the_profile_s_tensor_count_unless_told():
    from ddlkit.bench.ratio import ModelProfile

    profile = ModelProfile("m", 1000, 10, 64, tensors=6)
    assert from_profile(profile).tensors == 6
    assert from_profile(profile, tensors=1).tensors == 1


@pytest.mark.slow
def test_from_profile_takes_what_dk_bench_ratio_counted_for_the_benchmark_model():
    from ddlkit.bench import ratio

    (profile,) = ratio.profile_models(("mnist_cnn",), batch=64, steps=0)
    spec = from_profile(profile)
    assert (spec.params, spec.forward_flops, spec.batch) == (225_034, 5_291_594, 64)
    assert spec.tensors == 8  # 4 kernels and 4 biases
