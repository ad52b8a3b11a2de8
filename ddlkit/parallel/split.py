"""Model parallelism: one model's layers cut into stages, each stage on its own device.

::

    devices = dk.replicas.devices(2)
    model = dk.models.mnist_cnn(seed=0)
    split = parallel.split(model, devices, at=["flatten"])  # conv layers | dense layers
    split                        # which layers, parameters and variables live where
    logits = split(images)       # stage 0 on devices[0], its output copied to devices[1]

The stages are new Keras models whose variables are *created* under
``tf.device(device)`` (a variable lives where it was created), with the original
model's weights copied in, so the split model computes the same function as the
original. Only a chain of layers (each layer feeding the next, as in the kit's
tutorial CNNs or an MLP) can be cut this way; a model with skip connections
(``small_resnet``) cannot, and :func:`split` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlkit._tables import html_table
from ddlkit.backend import keras, tf
from ddlkit.errors import ConfigError


@dataclass(frozen=True)
class StageInfo:
    """One stage of a split model, as the reader should see it."""

    index: int
    device: str
    layers: tuple[str, ...]
    params: int
    input_shape: tuple[int | None, ...]
    output_shape: tuple[int | None, ...]
    variable_devices: tuple[str, ...]


def cut_points(layer_names: Sequence[str], at: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Group ``layer_names`` (in order) into stages; each name in ``at`` starts a stage (pure)."""
    names = list(layer_names)
    at = list(at)
    unknown = [a for a in at if a not in names]
    if unknown:
        raise ConfigError(
            f"cannot cut at {unknown}: the model has no such layer. Fix: cut at layer "
            f"names from {names}."
        )
    positions = [names.index(a) for a in at]
    if positions != sorted(set(positions)) or (positions and positions[0] == 0):
        raise ConfigError(
            f"cut points {at} must be distinct layers in model order, after the first layer "
            f"{names[0]!r}, so that every stage has a layer. "
            f"Fix: e.g. at={[names[len(names) // 2]]}."
        )
    bounds = [0, *positions, len(names)]
    return tuple(tuple(names[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))


def _clone(layer: Any) -> Any:
    return layer.__class__.from_config(layer.get_config())


class SplitModel:
    """A model cut into stages, stage ``k`` on ``devices[k]``; callable like a Keras model."""

    def __init__(self, stages: Sequence[Any], devices: Sequence[str], name: str = "split") -> None:
        if len(stages) != len(devices):
            raise ConfigError(
                f"{len(stages)} stages but {len(devices)} devices. Fix: give one device per stage."
            )
        self.stages = tuple(stages)
        self.devices = tuple(devices)
        self.name = name

    def __len__(self) -> int:
        return len(self.stages)

    def __call__(self, x: Any, training: bool = False) -> Any:
        """Run the stages in turn, each on its device (TensorFlow copies between them)."""
        for stage, device in zip(self.stages, self.devices, strict=True):
            with tf().device(device):
                x = stage(x, training=training)
        return x

    @property
    def trainable_variables(self) -> list[Any]:
        return [v for stage in self.stages for v in stage.trainable_variables]

    def outputs_by_stage(self, x: Any) -> list[tuple[str, tuple[int, ...]]]:
        """Where each stage's output tensor lives, and its shape: ``[(device, shape), ...]``."""
        placed = []
        for stage, device in zip(self.stages, self.devices, strict=True):
            with tf().device(device):
                x = stage(x, training=False)
            placed.append((x.device, tuple(x.shape)))
        return placed

    def info(self) -> tuple[StageInfo, ...]:
        rows = []
        for i, (stage, device) in enumerate(zip(self.stages, self.devices, strict=True)):
            rows.append(
                StageInfo(
                    index=i,
                    device=device,
                    layers=tuple(layer.name for layer in stage.layers),
                    params=int(sum(np.prod(v.shape) for v in stage.variables)),
                    input_shape=tuple(stage.input_shape),
                    output_shape=tuple(stage.output_shape),
                    variable_devices=tuple(sorted({v.device for v in stage.variables})),
                )
            )
        return tuple(rows)

    def _repr_html_(self) -> str:
        rows = [
            (
                s.index,
                s.device,
                ", ".join(s.layers),
                f"{s.params:,}",
                f"{s.input_shape} → {s.output_shape}",
                ", ".join(s.variable_devices),
            )
            for s in self.info()
        ]
        head = ("stage", "device", "layers", "params", "shape in → out", "variables live on")
        return html_table(head, rows, caption=f"{self.name}: {len(self)} stages")

    def __repr__(self) -> str:
        parts = [f"stage {s.index} on {s.device}: {', '.join(s.layers)}" for s in self.info()]
        return f"SplitModel({self.name!r}; " + "; ".join(parts) + ")"


def split(model: Any, devices: Sequence[str], at: Sequence[str]) -> SplitModel:
    """Cut ``model`` before each layer named in ``at``; stage ``k`` goes on ``devices[k]``.

    The stages get copies of the model's layers and weights, created on their
    devices; the result is checked to compute what ``model`` computes.
    """
    devices = tuple(devices)
    names = [layer.name for layer in model.layers if not _is_input(layer)]
    groups = cut_points(names, at)
    if len(groups) != len(devices):
        raise ConfigError(
            f"cutting at {list(at)} gives {len(groups)} stages but {len(devices)} devices were "
            f"given. Fix: pass {len(devices) - 1} cut point(s) for {len(devices)} devices, or "
            f"dk.replicas.devices({len(groups)})."
        )
    if len(model.inputs) != 1:
        raise ConfigError(
            f"{model.name} has {len(model.inputs)} inputs. Fix: split a model with one input."
        )
    by_name = {layer.name: layer for layer in model.layers}
    shape = tuple(model.input_shape)
    stages = []
    for k, (group, device) in enumerate(zip(groups, devices, strict=True)):
        with tf().device(device):
            try:
                stage = keras().Sequential(
                    [keras().Input(shape=shape[1:])] + [_clone(by_name[n]) for n in group],
                    name=f"stage{k}",
                )
            except (ValueError, TypeError) as exc:
                raise _not_a_chain(model, exc) from exc
        for name in group:
            stage.get_layer(name).set_weights(by_name[name].get_weights())
        stages.append(stage)
        shape = tuple(stage.output_shape)
    result = SplitModel(stages, devices, name=f"{model.name} split")
    _check_same_function(model, result)
    return result


def _is_input(layer: Any) -> bool:
    return type(layer).__name__ == "InputLayer"


def _not_a_chain(model: Any, exc: Exception | None = None) -> ConfigError:
    why = f" ({type(exc).__name__}: {exc})" if exc else ""
    return ConfigError(
        f"{model.name} is not a chain of layers, so cutting it into stages would change what "
        f"it computes{why}. Fix: split a model whose layers each feed the next "
        f"(dk.models.mnist_cnn, cifar_cnn, parallel.mlp), not one with skip connections."
    )


def _check_same_function(model: Any, split_model: SplitModel) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((2, *model.input_shape[1:]), dtype=np.float32)
    want = np.asarray(model(x, training=False))
    got = np.asarray(split_model(x))
    if want.shape != got.shape or not np.allclose(want, got, rtol=1e-4, atol=1e-5):
        raise _not_a_chain(model)


def mlp(
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    width: int = 1024,
    depth: int = 4,
    *,
    seed: int | None = None,
) -> Any:
    """A plain MLP (flatten, ``depth`` dense ReLU layers of ``width``, logits).

    Its hidden layers have the same width, so cutting it in the middle gives stages of
    nearly equal work, which a pipeline needs: nearly, because the first hidden layer
    has the flattened image as inputs (784 on MNIST) and the others ``width``. The MNIST
    CNN's second convolution alone is most of its multiply-adds, so no cut balances it.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"width={width!r} must be an integer >= 1. Fix: pass e.g. 1024.")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"depth={depth!r} must be an integer >= 1. Fix: pass e.g. 4.")
    k = keras()
    inputs = k.Input(shape=tuple(input_shape), name="images")
    h = k.layers.Flatten(name="flatten")(inputs)
    for i in range(depth):
        init = k.initializers.HeNormal(seed=None if seed is None else seed * 1009 + i)
        h = k.layers.Dense(width, activation="relu", kernel_initializer=init, name=f"dense{i + 1}")(
            h
        )
    init = k.initializers.GlorotUniform(seed=None if seed is None else seed * 1009 + depth)
    logits = k.layers.Dense(num_classes, kernel_initializer=init, name="logits")(h)
    return k.Model(inputs, logits, name="mlp")
