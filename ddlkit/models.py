"""The kit's models: the two classic tutorial CNNs and a small ResNet.

Every model returns **logits** (no softmax): the loss applies the softmax
itself, which is numerically safer. :func:`compile_classifier` pairs them
with ``SparseCategoricalCrossentropy(from_logits=True)``; for probabilities,
apply ``tf.nn.softmax`` to the output.

Models are returned uncompiled, so a distributed script can build them inside
``strategy.scope()`` and wrap the optimizer (Horovod) before compiling. Pass
``seed=`` for the same initial weights in every process, e.g. to compare
replicas; ``seed=None`` draws fresh weights. A seed is given to each layer's
kernel initializer, a different one per layer (:class:`_Initializers`), and
TensorFlow's global seed plays no part: the tutorial CNNs get Keras' default
initializers (Glorot-uniform kernels, zero biases), but not the same numbers as
the same layers built after ``tf.keras.utils.set_random_seed(seed)`` with
unseeded initializers (same distribution, different draws; notebook 00 checks both).

All layers are plain Keras layers built with :func:`ddlkit.backend.keras`, so
the models build under tf-keras (the default) and under Keras 3.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ddlkit.backend import active_flavour, keras
from ddlkit.errors import ConfigError


class _Initializers:
    """Kernel initializers with a different, reproducible seed for each layer:
    ``(seed * 1009 + layer_index) % 2**31``, whatever TensorFlow's global seed is."""

    def __init__(self, seed: int | None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed={seed!r} is not an integer. Fix: pass an int, or seed=None.")
        self._seed = seed
        self._count = itertools.count()

    def __call__(self, kind: str) -> Any:
        """``kind`` is ``"glorot_uniform"`` or ``"he_normal"``."""
        cls = {"glorot_uniform": "GlorotUniform", "he_normal": "HeNormal"}[kind]
        layer_index = next(self._count)
        if self._seed is None:
            return getattr(keras().initializers, cls)()
        # Reusing one seed would give equal-shaped layers equal weights.
        return getattr(keras().initializers, cls)(seed=(self._seed * 1009 + layer_index) % 2**31)


def _check_shape(name: str, shape: Sequence[int], channels_hint: str) -> tuple[int, int, int]:
    shape = tuple(shape)
    if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ConfigError(
            f"{name}={shape!r} is not an image shape (height, width, channels). Fix: pass e.g. "
            f"{channels_hint}; make_dataset() adds the channel axis to (H, W) images."
        )
    return shape  # type: ignore[return-value]


def _check_classes(num_classes: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError(
            f"num_classes={num_classes!r} must be an integer >= 2. Fix: pass the number of "
            f"labels, e.g. 10 for MNIST or CIFAR-10."
        )


def _tutorial_cnn(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    conv_filters: Sequence[int],
    pooled: int,
    dense_units: int,
    seed: int | None,
):
    """Convs (the first ``pooled`` each followed by 2x2 max pooling), then dense."""
    k = keras()
    init = _Initializers(seed)
    inputs = k.Input(shape=input_shape, name="images")
    h = inputs
    for i, filters in enumerate(conv_filters, start=1):
        h = k.layers.Conv2D(
            filters,
            3,
            activation="relu",
            kernel_initializer=init("glorot_uniform"),
            name=f"conv{i}",
        )(h)
        if i <= pooled:
            h = k.layers.MaxPooling2D(2, name=f"pool{i}")(h)
    h = k.layers.Flatten(name="flatten")(h)
    h = k.layers.Dense(
        dense_units, activation="relu", kernel_initializer=init("glorot_uniform"), name="dense"
    )(h)
    logits = k.layers.Dense(num_classes, kernel_initializer=init("glorot_uniform"), name="logits")(
        h
    )
    return k.Model(inputs, logits, name=name)


def mnist_cnn(
    input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 10, *, seed: int | None = None
):
    """The MNIST tutorial CNN: conv 32, pool, conv 64, pool, dense 128, logits.

    225,034 parameters (320 + 18,496 + 204,928 + 1,290).
    """
    _check_classes(num_classes)
    shape = _check_shape("input_shape", input_shape, "(28, 28, 1) for MNIST")
    return _tutorial_cnn("mnist_cnn", shape, num_classes, (32, 64), 2, 128, seed)


def cifar_cnn(
    input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10, *, seed: int | None = None
):
    """The CIFAR-10 tutorial CNN (TensorFlow's "Convolutional Neural Network" tutorial).

    conv 32, pool, conv 64, pool, conv 64, dense 64, logits: about 122k parameters.
    """
    _check_classes(num_classes)
    shape = _check_shape("input_shape", input_shape, "(32, 32, 3) for CIFAR-10")
    return _tutorial_cnn("cifar_cnn", shape, num_classes, (32, 64, 64), 2, 64, seed)


def _residual_block(h, filters: int, stride: int, name: str, init: _Initializers):
    """conv-BN-ReLU-conv-BN plus a shortcut, added, then ReLU (ResNet v1 basic block)."""
    k = keras()
    layers = k.layers
    shortcut = h
    h = layers.Conv2D(
        filters,
        3,
        strides=stride,
        padding="same",
        use_bias=False,
        kernel_initializer=init("he_normal"),
        name=f"{name}_conv1",
    )(h)
    h = layers.BatchNormalization(name=f"{name}_bn1")(h)
    h = layers.ReLU(name=f"{name}_relu1")(h)
    h = layers.Conv2D(
        filters,
        3,
        padding="same",
        use_bias=False,
        kernel_initializer=init("he_normal"),
        name=f"{name}_conv2",
    )(h)
    # gamma starts at 0, so each block starts as the identity ("zero-init
    # residual", Goyal et al. 2017): it steadies training with large global
    # batches, which is where data parallelism takes the batch size.
    h = layers.BatchNormalization(gamma_initializer="zeros", name=f"{name}_bn2")(h)
    if stride != 1 or shortcut.shape[-1] != filters:
        # The block changes the shape: project the shortcut to match it.
        shortcut = layers.Conv2D(
            filters,
            1,
            strides=stride,
            use_bias=False,
            kernel_initializer=init("he_normal"),
            name=f"{name}_proj",
        )(shortcut)
        shortcut = layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    h = layers.Add(name=f"{name}_add")([h, shortcut])
    return layers.ReLU(name=f"{name}_out")(h)


def small_resnet(
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    blocks_per_stage: Sequence[int] = (2, 2, 2),
    width: int = 16,
    *,
    seed: int | None = None,
):
    """A small ResNet for scaling experiments.

    A 3x3 stem conv with ``width`` filters, then one stage per entry of
    ``blocks_per_stage``, each of that many residual blocks; every stage
    after the first halves the resolution and doubles the filters. Global
    average pooling and a dense layer give the logits. With the defaults it
    has 14 weight layers and about 175k parameters, but needs several times
    the compute per example of the tutorial CNNs: more computation per
    parameter synchronised, which is what makes data parallelism pay off.
    """
    _check_classes(num_classes)
    shape = _check_shape("input_shape", input_shape, "(32, 32, 3) for CIFAR-10")
    stages = tuple(blocks_per_stage)
    if not stages or not all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in stages
    ):
        raise ConfigError(
            f"blocks_per_stage={blocks_per_stage!r} must be a non-empty sequence of positive "
            f"integers. Fix: pass e.g. (2, 2, 2) (three stages of two blocks)."
        )
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"width={width!r} must be a positive integer. Fix: pass e.g. width=16.")
    k = keras()
    init = _Initializers(seed)
    inputs = k.Input(shape=shape, name="images")
    h = k.layers.Conv2D(
        width, 3, padding="same", use_bias=False, kernel_initializer=init("he_normal"), name="stem"
    )(inputs)
    h = k.layers.BatchNormalization(name="stem_bn")(h)
    h = k.layers.ReLU(name="stem_relu")(h)
    for stage, blocks in enumerate(stages, start=1):
        filters = width * 2 ** (stage - 1)
        for block in range(1, blocks + 1):
            stride = 2 if stage > 1 and block == 1 else 1
            h = _residual_block(h, filters, stride, f"stage{stage}_block{block}", init)
    h = k.layers.GlobalAveragePooling2D(name="pool")(h)
    logits = k.layers.Dense(num_classes, kernel_initializer=init("glorot_uniform"), name="logits")(
        h
    )
    return k.Model(inputs, logits, name="small_resnet")


_BY_DATASET = {
    "mnist": lambda seed: mnist_cnn((28, 28, 1), 10, seed=seed),
    "fashion_mnist": lambda seed: mnist_cnn((28, 28, 1), 10, seed=seed),
    "cifar10": lambda seed: cifar_cnn((32, 32, 3), 10, seed=seed),
}


def _check_dataset(name: str) -> None:
    if name not in _BY_DATASET:
        raise ConfigError(
            f"No model for data set {name!r}. Fix: use one of {sorted(_BY_DATASET)}, or build "
            f"mnist_cnn/cifar_cnn/small_resnet with your input_shape and num_classes."
        )


def for_dataset(name: str, *, seed: int | None = None):
    """The tutorial CNN for a data set of :func:`ddlkit.data.load`."""
    _check_dataset(name)
    return _BY_DATASET[name](seed)


#: What ``--model`` of the worker scripts (and ``BenchCase.arch``) may name.
ARCHS = ("cnn", "small_resnet")


def build(model: str, dataset: str, *, seed: int | None = None):
    """The model named ``model`` for data set ``dataset``: ``"cnn"`` is
    :func:`for_dataset` (its tutorial CNN), ``"small_resnet"`` a :func:`small_resnet`
    for that data set's image shape and classes (e.g. 32x32x3 and 10 for CIFAR-10)."""
    if model not in ARCHS:
        raise ConfigError(
            f"unknown model {model!r}. Fix: use one of {', '.join(ARCHS)} (--model), or build "
            f"your own with ddlkit.models' builders."
        )
    if model == "cnn":
        return for_dataset(dataset, seed=seed)
    from ddlkit.data import catalog

    _check_dataset(dataset)
    spec = catalog.spec(dataset)
    height, width, *channels = spec.image_shape
    shape = (height, width, channels[0] if channels else 1)
    return small_resnet(shape, spec.num_classes, seed=seed)


_OPTIMIZERS = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop"}


def make_optimizer(name: str = "adam", learning_rate: float = 1e-3, *, legacy: bool = False):
    """A Keras optimizer by name (``"adam"``, ``"sgd"``, ``"rmsprop"``).

    ``legacy=True`` gives tf-keras' ``optimizers.legacy`` class. ParameterServerStrategy
    trains with either kind; TensorFlow's PS tutorial prefers the legacy ones there for speed.
    """
    if name not in _OPTIMIZERS:
        raise ConfigError(
            f"Unknown optimizer {name!r}. Fix: use one of {sorted(_OPTIMIZERS)}, or pass an "
            f"optimizer object to compile_classifier(optimizer=...)."
        )
    if not (isinstance(learning_rate, int | float) and learning_rate > 0):
        raise ConfigError(
            f"learning_rate={learning_rate!r} must be a positive number. Fix: pass e.g. 1e-3."
        )
    optimizers = keras().optimizers
    if legacy:
        if active_flavour() != "tf-keras":
            raise ConfigError(
                "legacy=True asks for a tf-keras legacy optimizer, but this Keras (Keras 3) has "
                "none. Fix: unset DDLKIT_KERAS (or set DDLKIT_KERAS=2) before importing ddlkit, "
                "or pass legacy=False."
            )
        optimizers = optimizers.legacy
    return getattr(optimizers, _OPTIMIZERS[name])(learning_rate=learning_rate)


def compile_classifier(
    model: Any,
    learning_rate: float | None = None,
    optimizer: Any = "adam",
    *,
    legacy: bool = False,
    steps_per_execution: int = 1,
):
    """Compile a logits model for integer labels; returns the model.

    ``optimizer`` is a name for :func:`make_optimizer` (``learning_rate``
    defaults to 1e-3) or an optimizer object (then give no ``learning_rate``:
    it is set on the object). Metric: ``"accuracy"``. ``steps_per_execution``
    goes to Keras' ``compile``: that many steps per call into TensorFlow. Under tf-keras it
    also sets ``model.distribute_reduction_method = "first"`` (see below).
    """
    if type(steps_per_execution) is not int or steps_per_execution < 1:
        raise ConfigError(
            f"steps_per_execution={steps_per_execution!r} must be an int >= 1. Fix: pass e.g. "
            f"16 (1 runs one step per call into TensorFlow)."
        )
    k = keras()
    if isinstance(optimizer, str):
        opt = make_optimizer(
            optimizer, 1e-3 if learning_rate is None else learning_rate, legacy=legacy
        )
    elif learning_rate is not None or legacy:
        raise ConfigError(
            f"compile_classifier got an optimizer object ({type(optimizer).__name__}) and also "
            f"learning_rate={learning_rate!r}, legacy={legacy!r}, which would be ignored. Fix: "
            f"set them on the optimizer object, or pass the optimizer by name."
        )
    else:
        opt = optimizer
    model.compile(
        optimizer=opt,
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    if hasattr(model, "distribute_reduction_method"):
        # tf-keras' default ("auto" = "sum" off TPU) adds up the per-batch loss and metrics
        # of every worker under MultiWorkerMirroredStrategy, although they are already
        # synchronised: with 2 workers the batch logs (and callbacks) see twice the loss.
        # "first" takes the synchronised value, as tf-keras documents for training.
        model.distribute_reduction_method = "first"
    return model
