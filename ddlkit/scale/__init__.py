"""Scaling model: one data-parallel step from FLOPs, bytes, links and worker count.

Modules (all pure): :mod:`.hardware` (accelerator and link presets, network ports),
:mod:`.nodes` (machines as built: DGX A100/H100, cloud VMs, the published runs' servers),
:mod:`.models` (what a step computes and synchronises; public model sizes), :mod:`.comm`
(the all-reduce and parameter-server formulas), :mod:`.predict` (one step: compute +
exposed communication; async PS with staleness), :mod:`.sweep` (curves over worker
counts), :mod:`.published` and :mod:`.runs` (published runs predicted and checked, and a
model without communication beside them), :mod:`.calibrate` (this machine, every strategy,
from a bench.json and the recorded all-reduce fits).

    import ddlkit as dk
    hw = dk.scale.node("DGX-A100")
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
from ddlkit.scale.nodes import NODES, node, nodes
from ddlkit.scale.predict import Algorithm, Prediction, predict
from ddlkit.scale.sweep import Curve, curve, powers_of_two

__all__ = [
    "GPUS",
    "NETWORKS",
    "NODES",
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
    "node",
    "nodes",
    "powers_of_two",
    "predict",
    "presets",
    "published",
]
