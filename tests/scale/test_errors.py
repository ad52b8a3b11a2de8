"""Bad input to ddlkit.scale: one clear line naming the cause and the fix."""

from __future__ import annotations

import pytest

from ddlkit.errors import ConfigError
from ddlkit.scale import (
    Accelerator,
    Algorithm,
    Link,
    ModelSpec,
    gpu,
    hardware,
    model,
    network,
    node,
)
from ddlkit.scale import predict as predict_step

SPEC = ModelSpec("m", 1e6, 1e9, 8)
HW = hardware("V100", per_node=8, intra="NVLink2", inter="IB-EDR")


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Fix" in text, text
    return text


@pytest.mark.parametrize("bandwidth", [0, -1e9, float("nan"), float("inf")])
def test_zero_negative_or_not_finite_bandwidth(bandwidth):
    with pytest.raises(ConfigError) as exc:
        Link("x", bandwidth, 1e-6)
    assert "bandwidth" in one_line(exc)


def test_negative_latency():
    with pytest.raises(ConfigError) as exc:
        Link("x", 1e9, -1e-6)
    assert "latency" in one_line(exc)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: gpu("Z100"), "Z100"),
        (lambda: network("30GbE"), "30GbE"),
        (lambda: model("resnet18"), "resnet18"),
        (lambda: hardware("V100", inter="Myrinet"), "Myrinet"),
        (lambda: node("DGX-1"), "DGX-1"),
    ],
)
def test_unknown_preset(call, name):
    with pytest.raises(ConfigError) as exc:
        call()
    text = one_line(exc)
    assert name in text and "use one of" in text


@pytest.mark.parametrize("workers", [0, -4, 1.5])
def test_workers_below_one_or_not_an_int(workers):
    with pytest.raises(ConfigError) as exc:
        predict_step(SPEC, HW, workers)
    assert "workers" in one_line(exc)


@pytest.mark.parametrize(
    "options, word",
    [
        ({"kind": "gossip"}, "gossip"),
        ({"overlap": 1.5}, "overlap"),
        ({"compression": "int8"}, "int8"),
        ({"servers": 0}, "servers"),
        ({"fusion_bytes": 0}, "fusion_bytes"),
        ({"across": "star"}, "star"),
        ({"kind": "ring", "node_sum": True}, "node_sum"),
    ],
)
def test_bad_algorithm_options(options, word):
    with pytest.raises(ConfigError) as exc:
        Algorithm(**options)
    assert word in one_line(exc)


@pytest.mark.parametrize(
    "build, word",
    [
        (lambda: Accelerator("a", 0, 1e9), "sustained_flops"),
        (lambda: Accelerator("a", 1e12, -1), "memory_bytes"),
        (lambda: ModelSpec("m", 0, 1e9, 8), "params"),
        (lambda: ModelSpec("m", 1e6, 1e9, 0), "batch"),
        (lambda: hardware("V100", per_node=0), "per_node"),
        (lambda: hardware("V100", nics=0), "nics"),
    ],
)
def test_bad_hardware_or_model_numbers(build, word):
    with pytest.raises(ConfigError) as exc:
        build()
    assert word in one_line(exc)
