"""Scaling model: one data-parallel step from FLOPs, bytes, links and worker count.

Modules (all pure): :mod:`.hardware` (accelerator and link presets, network ports, and
:func:`cluster`, a cluster you describe), :mod:`.nodes` (machines as built: DGX A100/H100,
cloud VMs, the published runs' servers), :mod:`.models` (what a step computes and
synchronises; public model sizes), :mod:`.gradients` (when each gradient is ready in the
backward pass), :mod:`.comm` (the all-reduce and parameter-server formulas),
:mod:`.timeline` (one step as Horovod's loop and NCCL run it), :mod:`.predict` (one step:
compute + waiting for the slowest + exposed communication; async PS with staleness),
:mod:`.sweep` (curves over worker counts), :mod:`.published` and :mod:`.runs` (published runs
and series predicted and checked, beside models that must fail them), :mod:`.leftout`
(:func:`sensitivity`: what the model leaves out, and how far it moves a prediction),
:mod:`.calibrate` (this machine, every strategy, from a bench.json and the recorded
all-reduce fits).

    import ddlkit as dk
    hw = dk.scale.node("DGX-A100")
    dk.scale.predict(dk.scale.model("resnet50", batch=64), hw, 256, algorithm="hierarchical")
    mine = dk.scale.cluster("A100", gpus_per_node=8, intra="NVLink3", nics_per_node=4,
                            nic_gbps=200)
    dk.scale.curve(dk.scale.model("vgg16"), mine, dk.scale.powers_of_two(1024))
    dk.scale.sensitivity(dk.scale.model("vgg16"), mine, 512)
"""

from __future__ import annotations

from ddlkit.scale import comm, gradients, published, timeline
from ddlkit.scale.calibrate import Calibration, calibrate
from ddlkit.scale.hardware import (
    BANDWIDTH_SHARE,
    GPUS,
    NETWORKS,
    STEP_JITTER,
    SUSTAINED_SHARE,
    TCP_STREAM,
    Accelerator,
    Hardware,
    Link,
    cluster,
    gpu,
    hardware,
    network,
    presets,
)
from ddlkit.scale.leftout import Sensitivity, sensitivity
from ddlkit.scale.models import PUBLIC, ModelSpec, from_profile, model
from ddlkit.scale.nodes import NODES, node, nodes
from ddlkit.scale.predict import Algorithm, Prediction, expected_max, predict
from ddlkit.scale.sweep import Curve, curve, powers_of_two

__all__ = [
    "BANDWIDTH_SHARE",
    "GPUS",
    "NETWORKS",
    "NODES",
    "PUBLIC",
    "STEP_JITTER",
    "SUSTAINED_SHARE",
    "TCP_STREAM",
    "Accelerator",
    "Algorithm",
    "Calibration",
    "Curve",
    "Hardware",
    "Link",
    "ModelSpec",
    "Prediction",
    "Sensitivity",
    "calibrate",
    "cluster",
    "comm",
    "curve",
    "expected_max",
    "from_profile",
    "gpu",
    "gradients",
    "hardware",
    "model",
    "network",
    "node",
    "nodes",
    "powers_of_two",
    "predict",
    "presets",
    "published",
    "sensitivity",
    "timeline",
]
