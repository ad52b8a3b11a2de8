"""The check before anything starts: a user's file imported, built, one batch trained, and its
costs counted by TensorFlow; every bad file one error naming the function and the fix."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ddlkit.experiments.run import check_file
from ddlkit.experiments.spec import UserModel
from ddlkit.experiments.user_file import UserFileError

MODELS = Path(__file__).parent / "models"


def test_a_mixed_precision_cnn_is_counted_exactly():
    costs, found = check_file(UserModel.of(MODELS / "cnn_mixed.py"), 16)
    conv, dense = 2 * 14 * 14 * 8 * (3 * 3 * 3), 2 * (14 * 14 * 8) * 10  # 2 FLOPs a multiply-add
    biases = 14 * 14 * 8 + 10
    assert costs.forward_flops == conv + dense + biases  # TensorFlow's profiler, per example
    assert 2 < costs.train_to_forward < 4  # backward: about two products per forward one
    assert costs.policy == "mixed_float16"
    # the variables, so the gradients, stay float32 under mixed_float16
    assert costs.gradient_bytes == {"float32": 4 * (3 * 3 * 3 * 8 + 8 + 1568 * 10 + 10)}
    assert [g.shape for g in costs.gradients] == [(3, 3, 3, 8), (8,), (1568, 10), (10,)]
    # activations in float16: the conv's 14x14x8 output at 2 bytes is counted, not at 4
    assert 14 * 14 * 8 * 2 <= costs.activation_bytes < 3 * 14 * 14 * 8 * 4
    assert costs.peak_rss > 100e6 and found["eval"] is False
    # the dense layer's gradients are ready first, after its share of the backward pass
    assert costs.readiness_basis.startswith("by layer")
    (d_share, d_bytes, d_tensors), (c_share, c_bytes, c_tensors) = costs.readiness
    assert (d_bytes, d_tensors, c_bytes, c_tensors) == (4 * (15680 + 10), 2, 4 * (216 + 8), 2)
    assert d_share == pytest.approx((dense + 10) / (conv + dense + biases), abs=1e-3)
    assert c_share == 1.0


def test_two_inputs_an_embedding_and_a_held_out_set():
    costs, found = check_file(UserModel.of(MODELS / "text_encoder.py"), 8)
    names = [g.name for g in costs.gradients]
    assert names[0].startswith("embedding") and any("multi_head_attention" in n for n in names)
    assert costs.params == sum(g.elements for g in costs.gradients)
    assert found["eval"] is True and "accuracy" in found["metrics"]
    # attention's products are Einsum ops, which the profiler does not count: the kit does.
    # By hand (L=32 words, d=32, 2 heads of 16): Q, K, V and the output projection, the
    # scores and the weighted sum, the Dense(32) on every word and the Dense(2) on the pool
    mha = 4 * 32 * 32 * 32 + 2 * (2 * 32 * 32 * 16)
    products = 2 * (mha + 32 * 32 * 32 + 32 * 2)
    assert products <= costs.forward_flops < 1.1 * products  # plus norms, softmax, biases
    # attention's einsums are not Conv2D or Dense: readiness is assumed, and says so
    assert costs.readiness_basis.startswith("even intervals, assumed")
    assert sum(r[1] for r in costs.readiness) == pytest.approx(costs.total_gradient_bytes, abs=16)


def test_an_uncompiled_model_takes_the_loss_and_optimizer_named():
    import ddlkit as dk

    costs = dk.experiments.costs(MODELS / "uncompiled.py", batch=16, model="make_net",
                                 data="make_data", loss="sparse_categorical_crossentropy",
                                 optimizer="adam")  # fmt: skip
    assert costs.params == 50 * 4 + 4 * 3 + 3
    assert costs.optimizer_bytes >= 2 * 4 * costs.params  # Adam: two slots per weight


def test_a_file_that_fails_to_import_is_named_with_the_fix():
    with pytest.raises(UserFileError, match=r"import_error.py: importing it raised Module"):
        check_file(UserModel.of(MODELS / "import_error.py"), 8)


def probe(model: str, data: str = "good_data", **kw):
    """The probe's own function, in this process (the CLI runs the same in a subprocess)."""
    from ddlkit.experiments.probe import probe as run_probe

    args = dict(file=str(MODELS / "bad.py"), model_fn=model, data_fn=data, eval_fn=None,
                loss=None, optimizer=None, batch_size=16) | kw  # fmt: skip
    return run_probe(argparse.Namespace(**args))


@pytest.mark.parametrize(
    ("model", "data", "words"),
    [
        ("missing", "good_data", r"defines no missing\(\)\. Fix: define it, or name yours"),
        ("raises", "good_data", r"raises\(\) raised RuntimeError: no GPU named A100"),
        ("not_a_model", "good_data", r"returned str, not a tf-keras model"),
        ("uncompiled", "good_data", r"uncompiled model\. Fix: model.compile"),
        ("summed_loss", "good_data", r"reduced by 'sum'.*Fix: leave the loss's reduction"),
        ("good_model", "arrays", r"returned ndarray, not a tf.data.Dataset"),
        ("good_model", "unbatched", r"shape \(8,\): not batches of 16.*\.batch\(batch_size\)"),
        ("good_model", "features_only", r"not \(features, labels\) pairs"),
        ("good_model", "wrong_shape", r"does not train the model of good_model\(\).*Fix: make"),
    ],
)
def test_every_bad_file_is_one_error_naming_the_function_and_the_fix(model, data, words):
    with pytest.raises(UserFileError, match=words):
        probe(model, data)


def test_the_good_pair_of_the_bad_file_passes():
    assert probe("good_model")["ok"] is True
