"""What a model costs per step: parameters to synchronise, FLOPs to compute (pure).

    dk.scale.model("resnet50", batch=32)            # a public model size
    dk.scale.from_profile(profiles["mnist_cnn"])    # what dk.bench.ratio counted here
    dk.scale.ModelSpec("mine", params=2e6, forward_flops=4e8, batch=64)

One training step costs :data:`TRAIN_FLOPS_FACTOR` (3) x the forward FLOPs per example x
the batch: the forward pass, then two products of the same size backward (gradients
with respect to the inputs and to the weights), so the backward pass is 2/3 of a step.

Public model sizes (:data:`PUBLIC`): parameters as the Keras Applications table lists
them; forward FLOPs counted by :func:`ddlkit.bench.ratio.forward_flops` (convolutions
and dense layers, 2 FLOPs per multiply-add) on ``tf.keras.applications`` built with
``weights=None``: ResNet-50 7.73 GFLOP, ResNet-101 15.16, ResNet-152 22.59, Inception V3
(299x299) 11.43, VGG-16 30.95. He et al. 2016 (arXiv:1512.03385, Table 1) give 3.8, 7.6 and
11.3 billion multiply-adds for ResNet-50, -101 and -152: the same to 2%. ``tensors`` is the
number of trainable weight tensors (one gradient each, so one all-reduce each without
fusion) of the same Keras models; :func:`from_profile` takes the count of the model it
profiled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddlkit._tables import html_table, text_table
from ddlkit.bench.ratio import TRAIN_FLOPS_FACTOR
from ddlkit.errors import ConfigError
from ddlkit.scale import gradients as _gradients

BACKWARD_SHARE = (TRAIN_FLOPS_FACTOR - 1) / TRAIN_FLOPS_FACTOR  # 2/3 of a step's FLOPs


@dataclass(frozen=True)
class ModelSpec:
    """Parameters, forward FLOPs per example, batch per worker, gradient tensors; ``gradients``:
    when each is ready in the backward pass (:mod:`ddlkit.scale.gradients`; empty: ``tensors``
    equal ones at even intervals, an assumption)."""

    name: str
    params: float
    forward_flops: float
    batch: int
    tensors: int = 1
    source: str = ""
    gradients: tuple = ()

    def __post_init__(self) -> None:
        for what in ("params", "forward_flops"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(
                    f"model {self.name!r}: {what}={value!r} must be a number > 0. "
                    f"Fix: give the model's {what.replace('_', ' ')}"
                )
        for what in ("batch", "tensors"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"model {self.name!r}: {what}={value!r} must be an int >= 1. "
                    f"Fix: e.g. {what}=32"
                )
        if self.gradients:
            checked = _gradients.check(self.gradients, f"model {self.name!r} gradients")
            object.__setattr__(self, "gradients", checked)

    def profile(self) -> _gradients.Profile:
        """When each gradient is ready: ``gradients``, or the even assumption."""
        if self.gradients:
            return self.gradients
        return _gradients.uniform(self.param_bytes(), self.tensors)

    def param_bytes(self, bytes_per_param: int = 4) -> float:
        """Bytes of one copy of the gradients (float32: 4 per parameter)."""
        return self.params * bytes_per_param

    @property
    def train_flops(self) -> float:
        """FLOPs of one worker's training step: 3 x forward FLOPs x batch."""
        return TRAIN_FLOPS_FACTOR * self.forward_flops * self.batch

    def with_batch(self, batch: int) -> ModelSpec:
        return replace(self, batch=batch)

    HEADERS = (
        "model",
        "parameters (M)",
        "MB of fp32 gradients",
        "forward GFLOP/example",
        "batch/worker",
        "train GFLOP/step",
        "gradient tensors",
    )

    def row(self) -> tuple:
        return (
            self.name,
            f"{self.params / 1e6:.2f}",
            f"{self.param_bytes() / 1e6:.1f}",
            f"{self.forward_flops / 1e9:.3g}",
            self.batch,
            f"{self.train_flops / 1e9:.4g}",
            self.tensors,
        )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, [self.row()], self.source)

    def __str__(self) -> str:
        return text_table(self.HEADERS, [self.row()], self.source)


_KERAS = "params: Keras Applications table; FLOPs: ddlkit.bench.ratio.forward_flops on it"
PUBLIC = {
    m.name: replace(m, gradients=_gradients.PUBLIC[m.name])
    for m in (
        ModelSpec("resnet50", 25_636_712, 7.727e9, 32, 214, _KERAS + " (He et al.: 3.8e9 MACs)"),
        ModelSpec("resnet101", 44_707_176, 15.16e9, 64, 418, _KERAS + " (He et al.: 7.6e9 MACs)"),
        ModelSpec("resnet152", 60_419_944, 22.59e9, 32, 622, _KERAS + " (He et al.: 11.3e9 MACs)"),
        ModelSpec("inception_v3", 23_851_784, 11.43e9, 64, 190, _KERAS + ", 299x299 input"),
        ModelSpec("vgg16", 138_357_544, 30.95e9, 64, 32, _KERAS),
    )
}


def model(name: str, *, batch: int | None = None) -> ModelSpec:
    """A public model size from :data:`PUBLIC`, with its per-worker ``batch`` if given."""
    if name not in PUBLIC:
        raise ConfigError(
            f"unknown model {name!r}. Fix: use one of {', '.join(PUBLIC)} "
            f"or build your own ModelSpec(name, params, forward_flops, batch)"
        )
    spec = PUBLIC[name]
    return spec if batch is None else spec.with_batch(batch)


def from_profile(profile, *, tensors: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a :class:`ddlkit.bench.ratio.ModelProfile` (counted here):
    its parameters, forward FLOPs, batch and gradient tensors (``tensors`` overrides)."""
    return ModelSpec(
        profile.name,
        profile.params,
        profile.forward_flops,
        profile.batch,
        profile.tensors if tensors is None else tensors,
        "counted by ddlkit.bench.ratio on this machine's model",
    )
