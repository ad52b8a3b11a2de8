"""MirroredStrategy on real TensorFlow: the helpers of notebook 01, its core claim (the
gradients are averaged over the global batch) and launch/train_mirrored.py.

Logical CPU devices can only be configured before TensorFlow creates its devices, so
every case that needs two of them runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.launch import run as run_mod
from ddlkit.lessons.mirrored import short_device

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "launch" / "train_mirrored.py"

PRELUDE = """
import json
import numpy as np
import ddlkit as dk
from ddlkit.lessons import mirrored
plan = dk.replicas.devices(2)
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy(list(plan))
"""


def run_fresh(code: str, timeout: float = 600) -> dict:
    """Run PRELUDE + code in a new interpreter with 2 logical CPUs; its last line as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "-1", "DDLKIT_PLOTS": "static"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_short_device_keeps_the_device_part():
    assert short_device("/job:localhost/replica:0/task:0/device:CPU:1") == "CPU:1"
    assert short_device("/device:GPU:0") == "GPU:0"
    assert short_device("cpu") == "cpu"


# The core claim of notebook 01, checked without the helper first: one Keras step of
# two replicas on a global batch equals one step of one device on that whole batch.
STEP = """
(x, y), _ = dk.data.load("mnist")
x, y = x[:64], y[:64]

def one_step(strategy, x, y, lr):
    with strategy.scope():
        model = dk.models.mnist_cnn(seed=3)
        dk.models.compile_classifier(model, optimizer=tf.keras.optimizers.SGD(lr))
    batch = dk.data.pipeline.make_dataset(x, y, batch_size=len(x), shuffle=False)
    start = [w.copy() for w in model.get_weights()]
    model.fit(batch, epochs=1, verbose=0)
    return start, model.get_weights()

def largest(a, b):
    return float(max(np.abs(u - v).max() for u, v in zip(a, b)))

single = tf.distribute.get_strategy()
start, two = one_step(strategy, x, y, 0.1)
start_1, one = one_step(single, x, y, 0.1)
_, half = one_step(single, x[:32], y[:32], 0.1)   # what replica 0 alone would do
check = mirrored.one_step_check(strategy, x, y, global_batch=64, seed=3)
print(json.dumps({
    "same_start": largest(start, start_1),
    "update": largest(one, start_1),
    "two_vs_one": largest(two, one),
    "two_vs_half": largest(two, half),
    "check": {k: getattr(check, k) for k in
              ("replicas", "global_batch", "per_replica_batch", "max_update", "max_diff",
               "max_diff_if_summed")},
}))
"""


@pytest.mark.slow
def test_two_replicas_take_the_same_step_as_one_device_on_the_global_batch(data_env):
    got = run_fresh(STEP)
    assert got["same_start"] == 0.0, "both models must start from the same weights"
    assert got["update"] > 1e-3, "the step must move the weights for the check to mean anything"
    # Same weights to float rounding: the gradients were averaged over all 64 examples.
    assert got["two_vs_one"] < 1e-6, got
    # Not just replica 0's slice: training on its 32 examples alone lands elsewhere.
    assert got["two_vs_half"] > 100 * got["two_vs_one"] and got["two_vs_half"] > 1e-4, got
    check = got["check"]
    assert (check["replicas"], check["global_batch"], check["per_replica_batch"]) == (2, 64, 32)
    assert check["max_update"] == pytest.approx(got["update"], rel=1e-6)
    assert check["max_diff"] < 1e-6
    # Summed gradients would be a step twice as long: off by one whole step.
    assert check["max_diff_if_summed"] == pytest.approx(check["max_update"], rel=0.05)


HELPERS = """
with strategy.scope():
    model = dk.models.mnist_cnn(seed=0)
kernel = mirrored.replica_values(model.get_layer("logits").kernel)
reduced = mirrored.all_reduce(strategy)
(x, y), _ = dk.data.load("mnist")
ds = dk.data.pipeline.for_strategy(strategy, x[:100], y[:100], per_replica_batch=8)
split = mirrored.batch_split(strategy, ds)
errors = {}
for name, call in {
    "plain_variable": lambda: mirrored.replica_values(tf.Variable([1.0, 2.0])),
    "uneven_batch": lambda: mirrored.one_step_check(strategy, x, y, global_batch=63),
    "too_few_examples": lambda: mirrored.one_step_check(strategy, x[:10], y[:10]),
    "bad_learning_rate": lambda: mirrored.train_and_measure(
        "t", strategy, "mnist", per_replica_batch=8, epochs=1, steps_per_epoch=1, base_lr=1e-3,
        learning_rate=0,
    ),
}.items():
    try:
        call()
        errors[name] = None
    except dk.errors.ConfigError as exc:
        errors[name] = str(exc)
with strategy.scope():
    try:
        mirrored.one_step_check(strategy, x, y)
        errors["in_scope"] = None
    except dk.errors.ConfigError as exc:
        errors["in_scope"] = str(exc)
print(json.dumps({
    "kernel": {"headers": kernel.headers, "rows": kernel.rows, "caption": kernel.caption,
               "html": kernel._repr_html_(), "text": str(kernel)},
    "reduced": {"headers": reduced.headers, "rows": reduced.rows},
    "split": {"caption": split.caption, "rows": split.rows},
    "errors": errors,
}))
"""


@pytest.fixture(scope="module")
def helpers(prepared_data_home, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    (home / ".keras").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("DDLKIT_HOME", str(prepared_data_home))
        mp.setenv("DDLKIT_OFFLINE", "1")
        return run_fresh(HELPERS)


def test_a_mirrored_variable_has_one_identical_copy_per_device(helpers):
    table = helpers["kernel"]
    rows = [dict(zip(table["headers"], row, strict=True)) for row in table["rows"]]
    assert [r["device"] for r in rows] == ["CPU:0", "CPU:1"]
    assert [r["shape"] for r in rows] == ["(128, 10)", "(128, 10)"]
    assert rows[0]["first values"] == rows[1]["first values"]
    assert [r["same as replica 0"] for r in rows] == [True, True]
    assert rows[0]["copy"] != rows[1]["copy"], "each device holds its own variable"
    assert "MirroredVariable" in table["caption"]
    assert "<table>" in table["html"] and "CPU:1" in table["text"]


def test_all_reduce_gives_every_replica_the_sum_and_the_mean(helpers):
    table = helpers["reduced"]
    assert [row[1:] for row in table["rows"]] == [
        ["CPU:0", 1.0, 3.0, 1.5],
        ["CPU:1", 2.0, 3.0, 1.5],
    ]


def test_a_global_batch_is_split_into_per_replica_batches(helpers):
    split = helpers["split"]
    assert split["rows"] == [
        [0, "CPU:0", "(8, 28, 28, 1)", "(8,)"],
        [1, "CPU:1", "(8, 28, 28, 1)", "(8,)"],
    ]
    assert "global batch 16" in split["caption"]


def test_bad_input_gives_one_clear_error_with_the_fix(helpers):
    errors = helpers["errors"]
    assert "not a distributed value" in errors["plain_variable"]
    assert "strategy.scope()" in errors["plain_variable"]
    assert "global_batch=63" in errors["uneven_batch"] and "multiple of 2" in errors["uneven_batch"]
    assert "10 examples are fewer than global_batch=64" in errors["too_few_examples"]
    assert "outside `with strategy.scope():`" in errors["in_scope"]
    assert "learning_rate=0 must be a positive number" in errors["bad_learning_rate"]


MEASURE = """
result = mirrored.train_and_measure(
    "t", strategy, "cifar10", per_replica_batch=16, epochs=1, steps_per_epoch=12, base_lr=1e-3,
    learning_rate=5e-4, notes="stand-in",
)
print(json.dumps({"result": result.__dict__, "label": result.label}))
"""


@pytest.mark.slow
def test_train_and_measure_labels_the_cifar_stand_in_and_counts_the_global_batch(
    data_env, tmp_path, monkeypatch
):
    monkeypatch.setenv("DDLKIT_RUNS", str(tmp_path))
    got = run_fresh(MEASURE)
    result = got["result"]
    assert (result["replicas"], result["workers"], result["global_batch"]) == (2, 1, 32)
    assert (result["steps"], result["epochs"], result["strategy"]) == (12, 1, "MirroredStrategy")
    # No real CIFAR-10 offline: the stand-in, and the label says so.
    assert result["synthetic_data"] is True and "synthetic stand-in" in got["label"]
    assert result["examples_per_sec"] > 0 and result["train_seconds"] > 0
    assert 0.0 <= result["test_accuracy"] <= 1.0
    # learning_rate replaces the linear rule's base_lr x 2, and the notes say which was used.
    assert result["notes"] == "stand-in, learning rate 0.0005"
    # Its metrics were written under DDLKIT_RUNS, one step record per step.
    files = list(tmp_path.glob("*/metrics/*.jsonl"))
    assert len(files) == 1
    kinds = [json.loads(line)["kind"] for line in files[0].read_text().splitlines()]
    assert kinds.count("step") == 12


def test_the_script_refuses_a_bad_replica_count_with_the_fix(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--replicas", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "need at least one device" in out.stderr and "Fix:" in out.stderr


@pytest.mark.slow
def test_ddlkit_launch_runs_the_script_with_the_planned_replicas(data_env, tmp_path):
    run = run_mod.start(
        SCRIPT,
        strategy="mirrored",
        workers=2,
        args=["--steps-per-epoch", "10"],
        runs_dir=tmp_path,
    )
    assert run.wait(timeout=600).ok, run.tail("main", 40)
    result = run.results()["main"]
    # workers=2 reached the script only through DDLKIT_REPLICAS (no --replicas given).
    assert result["replicas"] == 2 and result["global_batch"] == 128  # 64 per replica
    assert result["devices"] in ("logical CPU", "GPU")
    assert 0.5 < result["test_accuracy"] <= 1.0, result
    steps = [r for r in run.records("main") if r.kind == "step"]
    assert [r.step for r in steps] == list(range(1, 11))
    assert all(r.examples_per_sec and r.examples_per_sec > 0 for r in steps)
    assert steps[0].loss < 3.0, steps[0]  # an untrained 10-class model starts near ln(10)
    begin = [r for r in run.records("main") if r.kind == "event" and r.name == "train_begin"]
    assert begin and begin[0].info["batch_size"] == 128
