"""ddlkit.models: shapes, sizes, learning, residual structure and seeded initialisation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ddlkit  # noqa: F401  (chooses Keras before TensorFlow is imported)
from ddlkit import models
from ddlkit.backend import keras
from ddlkit.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent

# (builder, input shape, parameter count range): the counts follow from the
# architectures (mnist_cnn 225,034; cifar_cnn 122,570; small_resnet 176,378).
CASES = [
    (models.mnist_cnn, (28, 28, 1), (200_000, 250_000)),
    (models.cifar_cnn, (32, 32, 3), (100_000, 150_000)),
    (models.small_resnet, (32, 32, 3), (150_000, 200_000)),
]


def batch(shape, n=8, seed=0):
    """Images that are a per-class template plus noise, so the label is learnable."""
    rng = np.random.default_rng(seed)
    templates = rng.random((10, *shape), dtype=np.float32)
    y = rng.integers(0, 10, n)
    x = 0.7 * templates[y] + 0.3 * rng.random((n, *shape), dtype=np.float32)
    return x, y


@pytest.mark.parametrize("build, shape, params", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_output_shape_and_parameter_count(build, shape, params):
    model = build(seed=0)
    assert model.input_shape == (None, *shape)
    x, _ = batch(shape)
    assert model(x).shape == (8, 10)
    assert params[0] <= model.count_params() <= params[1]
    assert model.layers[-1].name == "logits"
    assert model.layers[-1].activation is keras().activations.linear, "outputs are logits"


def test_other_class_counts_and_input_shapes():
    assert models.mnist_cnn((28, 28, 1), 3).output_shape == (None, 3)
    assert models.cifar_cnn((48, 48, 1), 5).output_shape == (None, 5)
    assert models.small_resnet((16, 16, 1), 2, (1, 1), width=4).output_shape == (None, 2)


def test_tutorial_cnns_have_named_conv_pool_dense_layers():
    names = [layer.name for layer in models.mnist_cnn().layers]
    assert names == ["images", "conv1", "pool1", "conv2", "pool2", "flatten", "dense", "logits"]
    names = [layer.name for layer in models.cifar_cnn().layers]
    assert names[:6] == ["images", "conv1", "pool1", "conv2", "pool2", "conv3"]


@pytest.mark.parametrize("build, shape, params", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_a_few_training_steps_reduce_the_loss(build, shape, params):
    model = models.compile_classifier(build(seed=1), learning_rate=3e-3)
    x, y = batch(shape, n=32, seed=2)
    # One batch per epoch: each history entry is the training loss before that step.
    losses = model.fit(x, y, batch_size=32, epochs=20, verbose=0).history["loss"]
    assert losses[-1] < 0.8 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert 1.5 < losses[0] < 3.5, "a fresh 10-class model starts near ln(10) = 2.3"


def test_small_resnet_has_one_residual_add_per_block_and_projections_between_stages():
    model = models.small_resnet(blocks_per_stage=(2, 3, 1), width=8)
    layers = model.layers
    adds = [layer for layer in layers if isinstance(layer, keras().layers.Add)]
    assert len(adds) == 2 + 3 + 1
    assert all(len(layer.input) == 2 for layer in adds)
    projections = [layer.name for layer in layers if layer.name.endswith("_proj")]
    assert projections == ["stage2_block1_proj", "stage3_block1_proj"]
    assert any(isinstance(layer, keras().layers.BatchNormalization) for layer in layers)
    assert model.get_layer("stage3_block1_out").output.shape[1:] == (8, 8, 32)
    # zero-init residual: every block starts as the identity on its shortcut
    assert not np.any(model.get_layer("stage2_block2_bn2").gamma.numpy())


def weights_equal(a, b) -> bool:
    return all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights(), strict=True))


@pytest.mark.parametrize("build, shape, params", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_a_seed_fixes_the_initial_weights(build, shape, params):
    assert weights_equal(build(seed=5), build(seed=5))
    assert not weights_equal(build(seed=5), build(seed=6))
    assert not weights_equal(build(), build()), "seed=None draws fresh weights"
    kernels = [w for w in build(seed=5).get_weights() if w.ndim > 1]
    shapes = [k.shape for k in kernels]
    pairs = [(a, b) for a in range(len(shapes)) for b in range(a) if shapes[a] == shapes[b]]
    for a, b in pairs:
        assert not np.array_equal(kernels[a], kernels[b]), "each layer gets its own seed"


def test_for_dataset_picks_the_tutorial_cnn():
    assert models.for_dataset("mnist").name == "mnist_cnn"
    assert models.for_dataset("fashion_mnist").name == "mnist_cnn"
    assert models.for_dataset("cifar10").name == "cifar_cnn"
    assert weights_equal(models.for_dataset("mnist", seed=3), models.mnist_cnn(seed=3))
    with pytest.raises(ConfigError, match=r"'imagenet'.*Fix: use one of \['cifar10'"):
        models.for_dataset("imagenet")


def test_for_dataset_fits_every_data_set_load_knows():
    from ddlkit.data import catalog

    for name in catalog.NAMES:
        spec = catalog.spec(name)
        model = models.for_dataset(name)
        height, width, *channels = spec.image_shape
        assert model.input_shape == (None, height, width, channels[0] if channels else 1)
        assert model.output_shape == (None, spec.num_classes)


def test_build_gives_the_cnn_or_a_small_resnet_shaped_for_the_data_set():
    assert weights_equal(models.build("cnn", "mnist", seed=3), models.mnist_cnn(seed=3))
    resnet = models.build("small_resnet", "cifar10", seed=3)
    assert resnet.name == "small_resnet" and resnet.input_shape == (None, 32, 32, 3)
    assert weights_equal(resnet, models.small_resnet((32, 32, 3), 10, seed=3))
    assert models.build("small_resnet", "fashion_mnist").input_shape == (None, 28, 28, 1)
    with pytest.raises(ConfigError, match=r"unknown model 'resnet50'.*cnn, small_resnet"):
        models.build("resnet50", "mnist")
    with pytest.raises(ConfigError, match=r"'imagenet'.*Fix: use one of \['cifar10'"):
        models.build("small_resnet", "imagenet")


def test_compile_classifier_uses_logits_loss_and_accuracy():
    model = models.compile_classifier(models.mnist_cnn(), learning_rate=0.01, optimizer="sgd")
    assert model.loss.get_config()["from_logits"] is True
    assert isinstance(model.optimizer, keras().optimizers.SGD)
    assert np.isclose(float(model.optimizer.learning_rate.numpy()), 0.01)
    x, y = batch((28, 28, 1))
    loss, accuracy = model.evaluate(x, y, verbose=0)
    assert loss > 0 and 0 <= accuracy <= 1


def test_steps_per_execution_reaches_keras_and_bad_values_name_the_fix():
    model = models.compile_classifier(models.mnist_cnn(), steps_per_execution=8)
    assert int(model._steps_per_execution.numpy()) == 8
    for bad in (0, 2.0, True):
        with pytest.raises(ConfigError, match=f"steps_per_execution={bad!r} must be an int >= 1"):
            models.compile_classifier(models.mnist_cnn(), steps_per_execution=bad)


def test_legacy_optimizer_is_tf_keras_legacy_class():
    opt = models.make_optimizer("adam", 0.002, legacy=True)
    assert isinstance(opt, keras().optimizers.legacy.Adam)
    model = models.compile_classifier(models.mnist_cnn(), optimizer=opt)
    assert model.optimizer is opt


def test_bad_arguments_name_the_fix():
    with pytest.raises(ConfigError, match="learning_rate=0.1, legacy=False, which would be"):
        models.compile_classifier(
            models.mnist_cnn(), 0.1, optimizer=keras().optimizers.Adam(learning_rate=0.1)
        )
    with pytest.raises(ConfigError, match="Unknown optimizer 'adamw'"):
        models.make_optimizer("adamw")
    with pytest.raises(ConfigError, match="learning_rate=0"):
        models.make_optimizer("adam", 0)
    with pytest.raises(ConfigError, match=r"input_shape=\(28, 28\)"):
        models.mnist_cnn((28, 28))
    with pytest.raises(ConfigError, match="num_classes=1"):
        models.cifar_cnn(num_classes=1)
    with pytest.raises(ConfigError, match=r"blocks_per_stage=\(\)"):
        models.small_resnet(blocks_per_stage=())
    with pytest.raises(ConfigError, match="seed=1.5"):
        models.mnist_cnn(seed=1.5)


KERAS3 = textwrap.dedent(
    """
    import json
    import numpy as np
    import ddlkit
    from ddlkit import backend, models

    out = {"flavour": backend.active_flavour()}
    rng = np.random.default_rng(0)
    for build in (models.mnist_cnn, models.cifar_cnn, models.small_resnet):
        a, b = build(seed=4), build(seed=4)
        same = all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))
        shape = a.input_shape[1:]
        x = rng.random((16, *shape), dtype=np.float32)
        y = rng.integers(0, 10, 16)
        models.compile_classifier(a)
        losses = a.fit(x, y, batch_size=16, epochs=2, verbose=0).history["loss"]
        out[a.name] = {"output": list(a.output_shape), "same": same, "losses": losses}
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_models_build_and_train_under_keras_3():
    proc = subprocess.run(
        [sys.executable, "-c", KERAS3],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, "DDLKIT_KERAS": "3"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["flavour"] == "keras3"
    for name in ("mnist_cnn", "cifar_cnn", "small_resnet"):
        assert out[name]["output"] == [None, 10]
        assert out[name]["same"], f"{name}: a seed fixes the weights under Keras 3 too"
        assert np.isfinite(out[name]["losses"]).all()
