"""Scaling model: one data-parallel step from FLOPs, bytes, links and worker count.

Modules (all pure): :mod:`.hardware` (accelerator and link presets, nodes), :mod:`.models`
(what a step computes and synchronises; public model sizes), :mod:`.comm` (the
all-reduce and parameter-server formulas), :mod:`.predict` (one step: compute + exposed
communication; async PS with staleness), :mod:`.sweep` (curves over worker counts),
:mod:`.published` (published runs predicted and checked), :mod:`.calibrate` (this
machine from a bench.json and notebook 05's all-reduce fit).

    import ddlkit as dk
    hw = dk.scale.hardware("V100", per_node=8, intra="NVLink2", inter="IB-EDR")
    dk.scale.predict(dk.scale.model("resnet50", batch=64), hw, 256, algorithm="hierarchical")
"""

from __future__ import annotations

from ddlkit.scale import comm, published
from ddlkit.scale.calibrate import Calibration, calibrate
from ddlkit.scale.hardware import (
    GPUS,
    NETWORKS,
    SUSTAINED_SHARE,
    Accelerator,
    Hardware,
    Link,
    gpu,
    hardware,
    network,
    presets,
)
from ddlkit.scale.models import PUBLIC, ModelSpec, from_profile, model
from ddlkit.scale.predict import Algorithm, Prediction, predict
from ddlkit.scale.sweep import Curve, curve, powers_of_two

__all__ = [
    "GPUS",
    "NETWORKS",
    "PUBLIC",
    "SUSTAINED_SHARE",
    "Accelerator",
    "Algorithm",
    "Calibration",
    "Curve",
    "Hardware",
    "Link",
    "ModelSpec",
    "Prediction",
    "calibrate",
    "comm",
    "curve",
    "from_profile",
    "gpu",
    "hardware",
    "model",
    "network",
    "powers_of_two",
    "predict",
    "presets",
    "published",
]
