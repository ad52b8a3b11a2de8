"""KerasReporter with ``compile(steps_per_execution=k)``: Keras calls back once per
execution, and the records still count every step (a real tf-keras fit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddlkit.metrics import load_run
from ddlkit.metrics.keras_callback import steps_done

SCRIPT = r"""
import json, sys
import numpy as np
import ddlkit as dk
from ddlkit import backend

keras = backend.keras()
rng = np.random.default_rng(0)
x = rng.random((160, 6), dtype=np.float32)
y = (x.sum(axis=1) > 3).astype("int64")
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
model.compile(
    "adam",
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
    steps_per_execution=4,
)
batches = []
seen = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
reporters = [
    dk.metrics.KerasReporter(batch_size=16, run_dir=sys.argv[1], worker="every-1"),
    dk.metrics.KerasReporter(batch_size=16, every=8, run_dir=sys.argv[1], worker="every-8"),
]
# 10 steps per epoch: executions of 4, 4 and a last one of 2 steps
model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[seen, *reporters])
for r in reporters:
    r.close()
print(json.dumps({"batches": [int(b) for b in batches]}))
"""


def test_steps_done_counts_the_steps_since_the_previous_call():
    assert steps_done(0, 0) == 1  # steps_per_execution=1: one step per call
    assert steps_done(3, 0) == 4  # an execution of 4 steps
    assert steps_done(9, 8) == 2  # the epoch's last, shorter execution
    assert steps_done(None, 5) == 1 and steps_done(2, 7) == 1  # never less than one


@pytest.mark.slow
def test_records_carry_every_step_with_steps_per_execution(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDLKIT_")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env={**env, "DDLKIT_KERAS": "2"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # what tf-keras passes: the epoch's index of the last step of each execution
    assert json.loads(proc.stdout.strip().splitlines()[-1])["batches"] == [3, 7, 9] * 2
    records = load_run(tmp_path)
    every1 = [r for r in records if r.worker == "every-1"]
    steps = [r for r in every1 if r.kind == "step"]
    assert [r.step for r in steps] == [4, 8, 10, 14, 18, 20]
    assert [r.epoch for r in steps] == [0, 0, 0, 1, 1, 1]
    for r in steps:  # throughput is per step, not per execution
        assert r.step_time > 0 and r.examples_per_sec == pytest.approx(16 / r.step_time)
    assert [r.step for r in every1 if r.kind == "epoch"] == [10, 20]
    end = next(r for r in every1 if r.name == "train_end")
    assert end.info["steps"] == 20
    every8 = [r.step for r in records if r.worker == "every-8" and r.kind == "step"]
    assert every8 == [8, 18]  # the first execution that reaches 8 steps in each epoch
