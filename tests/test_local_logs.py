"""ddlkit.local_logs: fit's per-step logs without a metric all-reduce under MWMS."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import ddlkit  # noqa: F401  (chooses Keras before TensorFlow is imported)
from ddlkit import models
from ddlkit.backend import keras
from ddlkit.errors import ConfigError
from ddlkit.launch import run as run_mod
from ddlkit.local_logs import local_step_logs


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    x = (rng.random((n, 28, 28)) * 60 + y[:, None, None] * 19).astype("float32")
    return x, y


class _BatchLogs(keras().callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(dict(logs))


def _fit(model, x, y):
    seen = _BatchLogs()
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[seen])
    return seen.logs, history.history


def test_without_a_strategy_it_trains_and_logs_as_the_model_it_wraps():
    x, y = _data()
    plain = models.compile_classifier(models.mnist_cnn(seed=3))
    local = local_step_logs(models.mnist_cnn(seed=3))
    models.compile_classifier(local)
    plain_steps, plain_history = _fit(plain, x, y)
    local_steps, local_history = _fit(local, x, y)
    assert len(local_steps) == len(plain_steps) == 6
    for a, b in zip(local_steps, plain_steps, strict=True):
        assert a.keys() == b.keys() == {"loss", "accuracy"}
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["accuracy"] == pytest.approx(b["accuracy"], rel=1e-5)
    assert local_history["loss"] == pytest.approx(plain_history["loss"], rel=1e-5)
    assert local_history["loss"][-1] < local_history["loss"][0]


def test_it_shares_the_layers_and_weights_of_the_model_it_wraps():
    model = models.mnist_cnn(seed=0)
    local = local_step_logs(model)
    assert local.name == model.name
    assert [id(v) for v in local.weights] == [id(v) for v in model.weights]


def test_a_model_without_inputs_is_refused_with_the_fix():
    class Subclassed(keras().Model):
        def call(self, x):
            return x

    with pytest.raises(ConfigError, match="known inputs.*Fix: build it with"):
        local_step_logs(Subclassed())


WORKER = textwrap.dedent(
    """
    import collections, json, os, sys
    import numpy as np
    import ddlkit
    import tensorflow as tf
    from ddlkit import models
    from ddlkit.local_logs import local_step_logs

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    rng = np.random.default_rng(task)  # each worker its own data, as a shard would be
    y = rng.integers(0, 10, 256)
    x = (rng.random((256, 28, 28)) * 60 + y[:, None, None] * 19).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

    def collectives(model):  # the collective ops of each traced train_function
        counts = []
        for fn in model.train_function._list_all_concrete_functions():
            graph = fn.graph.as_graph_def()
            nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
            counts.append(dict(collections.Counter(n.op for n in nodes if "Collective" in n.op)))
        return counts

    class Steps(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            out["steps"][-1].append(float(logs["loss"]))

    out = {"collectives": [], "steps": [], "epoch_loss": []}
    for wrap in (False, True):
        with strategy.scope():
            model = models.mnist_cnn(seed=0)
            model = local_step_logs(model) if wrap else model
            models.compile_classifier(model)
        out["steps"].append([])
        history = model.fit(data, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[Steps()])
        out["collectives"].append(collectives(model))
        out["epoch_loss"].append(history.history["loss"][-1])
    with open(os.path.join(sys.argv[1], f"out-{task}.json"), "w") as f:
        json.dump(out, f)
    """
)


@pytest.mark.slow
def test_under_mwms_the_step_runs_one_all_reduce_and_epoch_logs_stay_synchronised(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = run_mod.start(
        script, strategy="multi_worker", workers=2, args=[str(tmp_path)], runs_dir=tmp_path
    )
    assert run.wait(timeout=300).ok
    outs = [json.loads((tmp_path / f"out-{i}.json").read_text()) for i in (0, 1)]
    for out in outs:
        # tf-keras' own step: the gradients' all-reduce, then one per metric variable (the
        # loss's and the accuracy's total and count). With local_step_logs: the gradients'.
        plain_fns, local_fns = out["collectives"]
        assert plain_fns and all(c == {"CollectiveReduceV2": 5} for c in plain_fns), plain_fns
        assert local_fns and all(c == {"CollectiveReduceV2": 1} for c in local_fns), local_fns
    plain, local = (
        [outs[0]["steps"][k], outs[1]["steps"][k]] for k in (0, 1)
    )  # [worker-0's, worker-1's] step losses
    assert plain[0] == plain[1], "tf-keras' step logs are synchronised"
    assert local[0] != local[1], "local step logs are each worker's own"
    assert outs[0]["epoch_loss"] == pytest.approx(outs[1]["epoch_loss"], rel=1e-6)
    # equal batches: the synchronised epoch mean is the mean of the workers' own
    assert outs[0]["epoch_loss"][1] == pytest.approx((local[0][-1] + local[1][-1]) / 2, rel=1e-5)
