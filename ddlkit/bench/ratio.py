"""Compute per parameter: why one model scales better than another under data parallelism.

Every data-parallel step computes on the local batch, then synchronises one copy of the
gradients: as many values as the model has parameters. Ring all-reduce sends about
``2 (N-1)/N x parameter bytes`` per worker per step, a parameter server receives the
gradients of every worker and sends the parameters back. The more arithmetic a model does
per parameter, the smaller communication's share of a step, and the closer to linear
the scaling.

    profiles = profile_models(("mnist_cnn", "small_resnet"), batch=64)
    profiles                       # params, MB per all-reduce, FLOPs, FLOPs/param, ms/step
    predict(profiles, x1, x2)      # efficiency each model would get on the measured link

FLOPs are counted from the layers (:func:`forward_flops`: convolutions and dense layers,
2 per multiply-add; batch norm, activations and pooling left out, a few per cent);
a training step costs about 3x the forward pass (forward, then two products backward).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError

MODELS = {
    # name: (builder in ddlkit.models, input shape it trains on here)
    "mnist_cnn": ("mnist_cnn", (28, 28, 1)),
    "cifar_cnn": ("cifar_cnn", (32, 32, 3)),
    "small_resnet": ("small_resnet", (32, 32, 3)),
}
BYTES_PER_PARAM = 4  # float32 gradients
TRAIN_FLOPS_FACTOR = 3  # forward + backward (gradients w.r.t. inputs and weights)


def forward_flops(model) -> int:
    """FLOPs of one example's forward pass through the Conv2D and Dense layers (pure).

    A Conv2D output element costs ``kh x kw x in_channels`` multiply-adds; a Dense output
    ``inputs``; each multiply-add is 2 FLOPs, a bias add 1.
    """
    total = 0
    for layer in model.layers:
        kind = type(layer).__name__
        if kind == "Conv2D":
            _, h, w, c_out = layer.output.shape
            kh, kw = layer.kernel_size
            c_in = layer.input.shape[-1]
            total += 2 * h * w * c_out * kh * kw * c_in
            total += h * w * c_out if layer.use_bias else 0
        elif kind == "Dense":
            n_in, n_out = layer.input.shape[-1], layer.units
            total += 2 * n_in * n_out + (n_out if layer.use_bias else 0)
    return int(total)


@dataclass(frozen=True)
class ModelProfile:
    """What one training step of a model computes and what it must synchronise."""

    name: str
    params: int
    forward_flops: int  # per example
    batch: int
    step_seconds: float | None = None  # measured training step on one device, this machine
    tensors: int = 1  # trainable weight tensors: one gradient each, one all-reduce unfused

    @property
    def param_bytes(self) -> int:
        return self.params * BYTES_PER_PARAM

    @property
    def train_flops_per_step(self) -> int:
        return TRAIN_FLOPS_FACTOR * self.forward_flops * self.batch

    @property
    def flops_per_param(self) -> float:
        """Training FLOPs per step for every parameter synchronised per step."""
        return self.train_flops_per_step / self.params

    def ring_bytes(self, workers: int) -> float:
        """Bytes each worker sends per step in a ring all-reduce of the gradients."""
        if workers < 1:
            raise ConfigError(f"workers={workers}: must be 1 or more")
        return 2 * (workers - 1) / workers * self.param_bytes

    def row(self) -> tuple:
        step = None if self.step_seconds is None else f"{self.step_seconds * 1000:.1f}"
        return (
            self.name,
            f"{self.params:,}",
            f"{self.param_bytes / 1e6:.2f}",
            f"{self.forward_flops / 1e6:.1f}",
            f"{self.flops_per_param:,.0f}",
            step,
        )


PROFILE_HEADERS = (
    "model",
    "parameters",
    "MB synchronised per step",
    "forward MFLOPs per example",
    "train FLOPs per parameter per step",
    "ms/step on one device (measured)",
)


@dataclass(frozen=True)
class Profiles:
    profiles: tuple[ModelProfile, ...]

    def __getitem__(self, name: str) -> ModelProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise ConfigError(f"no profile {name!r}. Fix: use one of {[p.name for p in self]}.")

    def __iter__(self):
        return iter(self.profiles)

    def timed(self, step_seconds: Mapping[str, float]) -> Profiles:
        """The profiles named in ``step_seconds``, with those step times instead of their own
        (e.g. a recording's one-device steps, to predict what that machine measured)."""
        return Profiles(
            tuple(replace(self[name], step_seconds=s) for name, s in step_seconds.items())
        )

    def caption(self) -> str:
        return f"batch {self.profiles[0].batch} per step, float32 gradients"

    def _repr_html_(self) -> str:
        return html_table(PROFILE_HEADERS, [p.row() for p in self], self.caption())

    def __str__(self) -> str:
        return text_table(PROFILE_HEADERS, [p.row() for p in self], self.caption())


def build(name: str, seed: int = 0):
    """One of :data:`MODELS`, built by :mod:`ddlkit.models` for its input shape."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}. Fix: use one of {', '.join(MODELS)}.")
    from ddlkit import models

    builder, shape = MODELS[name]
    return getattr(models, builder)(shape, 10, seed=seed)


def time_step(model, batch: int, steps: int = 8, warmup: int = 2) -> float:
    """Median seconds of one training step (Adam, random data) on this process's device."""
    import numpy as np

    from ddlkit import models

    if steps < 1 or warmup < 0:
        raise ConfigError(f"steps={steps}, warmup={warmup}: need steps >= 1, warmup >= 0")
    models.compile_classifier(model, 1e-3)
    rng = np.random.default_rng(0)
    x = rng.random((batch, *model.input_shape[1:]), dtype=np.float32)
    y = rng.integers(0, 10, size=batch)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        model.train_on_batch(x, y)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_models(
    names: Sequence[str] = ("mnist_cnn", "small_resnet"), *, batch: int = 64, steps: int = 8
) -> Profiles:
    """Parameters and FLOPs of each model, and its training step timed here (``steps=0``:
    not timed)."""
    if type(batch) is not int or batch < 1:
        raise ConfigError(f"batch={batch!r}: must be an int >= 1")
    out = []
    for name in names:
        model = build(name)
        step = time_step(model, batch, steps) if steps else None
        tensors = len(model.trainable_weights)
        params = int(model.count_params())
        out.append(ModelProfile(name, params, forward_flops(model), batch, step, tensors))
    return Profiles(tuple(out))


@dataclass(frozen=True)
class Prediction:
    """Efficiency each model would get with N workers on the link the benchmark measured."""

    workers: int
    measured_model: str
    extra_seconds: float  # what N workers added to a step of the measured model
    rows_: tuple[tuple, ...]

    def efficiency(self, name: str) -> float:
        for row in self.rows_:
            if row[0] == name:
                return row[-1]
        raise ConfigError(f"no prediction for {name!r}")

    def rows(self) -> list[tuple]:
        return [
            (name, f"{c * 1000:.1f}", f"{s * 1000:.1f}", f"{e:.0%}") for name, c, s, e in self.rows_
        ]

    def caption(self) -> str:
        return (
            f"{self.workers} workers: +{self.extra_seconds * 1000:.1f} ms per step measured for "
            f"the {self.measured_model}, scaled by each model's parameter bytes; compute scaled "
            f"by each model's step time"
        )

    HEADERS = (
        "model",
        "compute ms/step (est.)",
        "synchronise ms/step (est.)",
        "predicted efficiency",
    )

    def _repr_html_(self) -> str:
        return html_table(self.HEADERS, self.rows(), self.caption())

    def __str__(self) -> str:
        return text_table(self.HEADERS, self.rows(), self.caption())


def predict(
    profiles: Profiles,
    x1_step: float,
    xn_step: float,
    workers: int,
    *,
    measured: str = "mnist_cnn",
) -> Prediction:
    """Predicted efficiency = compute / (compute + synchronisation) for every profile (pure).

    ``x1_step`` and ``xn_step`` are the benchmark's step times of the measured model with
    1 and ``workers`` workers (weak scaling: the same per-worker batch, each worker on its
    own core). Each model's compute is ``x1_step`` scaled by its step time relative to the
    measured model's (both timed by :func:`profile_models`), so the measured model gets
    back exactly the benchmark's ``x1_step / xn_step``. The extra time is taken as
    synchronisation, proportional to parameter bytes (a bandwidth-bound all-reduce);
    latency per message and overlap of communication with the backward pass are left
    out, so this is a first estimate, not a measurement.
    """
    if workers < 2:
        raise ConfigError(f"workers={workers}: a prediction needs 2 or more workers")
    if x1_step <= 0 or xn_step <= 0:
        raise ConfigError("step times must be positive. Fix: pass measured step times.")
    extra = max(0.0, xn_step - x1_step)
    base = profiles[measured]
    rows = []
    for p in profiles:
        if p.step_seconds is None:
            raise ConfigError(f"{p.name} has no measured step time. Fix: profile it with steps > 0")
        compute = x1_step * p.step_seconds / base.step_seconds
        sync = extra * p.param_bytes / base.param_bytes
        rows.append((p.name, compute, sync, compute / (compute + sync)))
    return Prediction(workers, measured, extra, tuple(rows))
