"""The parameter-server code of notebooks 03 and 03a, run as real processes on loopback.

One cluster (two ps tasks, two workers), its servers started from ``workers/ps_worker.py``
(the script notebook 03 writes) where ddlkit cannot be imported, serves three chiefs in turn
(a server runs whatever a chief sends it, and each chief brings its own variables):

- workers/ps_worker.py (notebook 03) by hand without ddlkit: ``fit`` and the ``schedule`` loop
  train and the chief prints its accuracy; variables of 256 KiB or more are split across the
  two ps tasks;
- workers/ps_rules.py (notebook 03a, which imports 03's ps_worker.py) by hand without ddlkit:
  the synchronous round's update is the mean of the pushes, one update per round; Downpour
  pushes once per n_push steps, and its ``forward`` is the model;
- launch/train_ps_modes.py's own SyncPS and Downpour classes, driven by a small chief: the
  synchronous parameter server applies exactly one update per round, the mean of one push
  from every worker; Downpour pushes every n_push steps and pulls every n_fetch steps
  (counted on the ps tasks).

The servers (which never exit) are then killed and none is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.nbscripts import NOTEBOOKS, no_ddlkit_env, write_scripts
from harness.procutil import alive, wait_until

from ddlkit.cluster.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
NOTEBOOK = NOTEBOOKS / "03_parameter_server.ipynb"  # workers/ps_worker.py
RULES_NOTEBOOK = NOTEBOOKS / "03a_update_rules.ipynb"  # workers/ps_rules.py
WORKERS, PS = 2, 2

# A chief of its own: the kit's synchronous rounds first, then Downpour on a new optimizer.
DRIVER = """
import json, sys
sys.path.insert(0, {launch!r})
import ddlkit  # noqa: F401  tf-keras
import numpy as np
import tensorflow as tf
import train_ps_modes as modes
from ddlkit import data, models
from ddlkit.data import pipeline

W, LR, ROUNDS, N_PUSH, N_FETCH, PERIODS = {workers}, 0.1, 3, 2, 3, 3
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
(x, y), _ = data.load("mnist")
fn = pipeline.dataset_fn(x[:2000], y[:2000], global_batch=32)
per_worker = tf.function(lambda: strategy.distribute_datasets_from_function(fn))
iterator = iter(coordinator.create_per_worker_dataset(per_worker))
with strategy.scope():
    model = models.for_dataset("mnist", seed=0)
    sgd = tf.keras.optimizers.SGD(LR)
out = {{"rounds": []}}
sync = modes.SyncPS(strategy, coordinator, model, sgd, W)
read = lambda vs: [v.numpy() for v in vs]
for _ in range(ROUNDS):
    before = read(model.trainable_variables)
    pushed = sync.push_all(iterator)
    flags, acc = sync.pushed.numpy().tolist(), read(sync.accumulators)
    sync.apply()
    after = read(model.trainable_variables)
    expected = [b - LR * a / W for b, a in zip(before, acc)]
    out["rounds"].append({{
        "pushes": len(pushed), "flags_before_apply": flags,
        "stale": [s for s, _ in pushed],
        "applies": int(sync.applies.numpy()),
        "flags_after_apply": sync.pushed.numpy().tolist(),
        "max_error": max(float(np.abs(e - a).max()) for e, a in zip(expected, after)),
        "max_update": max(float(np.abs(b - a).max()) for b, a in zip(before, after)),
        "acc_after_apply": max(float(np.abs(a).max()) for a in read(sync.accumulators)),
    }})
out["sync"] = {{"pushes_by_worker": sync.pushes.numpy().tolist(), "refused": sync.refused,
               "updates": int(sgd.iterations.numpy())}}
images = tf.cast(x[:8, :, :, None], tf.float32) / 255
local = [tf.identity(v) for v in model.trainable_variables]
out["forward_error"] = float(tf.reduce_max(tf.abs(
    modes.forward(model, local, images) - model(images, training=False))))
with strategy.scope():
    adam = tf.keras.optimizers.Adam(1e-3)
down = modes.Downpour(strategy, coordinator, model, adam, W, N_PUSH, N_FETCH, 0.05)
steps, stale, _ = down.run(iterator, PERIODS * down.period)
out["downpour"] = {{
    "period": down.period, "steps": steps, "stale": stale,
    "steps_by_worker": down.steps.numpy().tolist(),
    "pushes_by_worker": down.pushes.numpy().tolist(),
    "fetches_by_worker": down.fetches.numpy().tolist(),
    "updates": int(adam.iterations.numpy()),
}}
print("CHECKS " + json.dumps(out), flush=True)
"""


def tf_config(ports: list[int], kind: str, index: int) -> str:
    """Task ``kind``/``index`` of a cluster: the chief, ``PS`` ps tasks, then the workers."""
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "ps": [f"127.0.0.1:{p}" for p in ports[1 : 1 + PS]],
        "worker": [f"127.0.0.1:{p}" for p in ports[1 + PS :]],
    }
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def start_servers(script: Path, ports: list[int], env: dict, cwd: Path, logs: Path):
    """Every ps and worker task, each a server started from ``script`` (they never exit)."""
    tasks = [("ps", i) for i in range(PS)] + [("worker", i) for i in range(len(ports) - 1 - PS)]
    procs = []
    for kind, index in tasks:
        log = open(logs / f"{kind}-{index}.log", "w")  # noqa: SIM115 (closed with the test)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env | {"TF_CONFIG": tf_config(ports, kind, index)},
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def kill_all(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


def run_chief(argv: list[str], env: dict, ports: list[int], cwd: Path):
    return subprocess.run(
        [sys.executable, *argv],
        env=env | {"TF_CONFIG": tf_config(ports, "chief", 0)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def chiefs(tmp_path_factory) -> dict:
    """Start the servers once, run the three chiefs one after the other, kill the servers."""
    tmp = tmp_path_factory.mktemp("nb03")
    scripts = write_scripts(NOTEBOOK, tmp) | write_scripts(RULES_NOTEBOOK, tmp)
    ports = free_ports(1 + PS + WORKERS)
    bare = no_ddlkit_env(tmp)  # the notebook's scripts: no ddlkit
    kit = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    kit |= {"TF_CPP_MIN_LOG_LEVEL": "2", "DDLKIT_RUNS": str(tmp / "runs")}
    procs = start_servers(scripts["workers/ps_worker.py"], ports, bare, tmp, tmp)
    out = {"servers": procs}
    try:
        worker_args = ["--epochs", "1", "--steps-per-epoch", "20", "--loop-steps", "20"]
        out["ps_worker"] = run_chief(
            [str(scripts["workers/ps_worker.py"]), *worker_args], bare, ports, tmp
        )
        rules_args = ["--rounds", "3", "--periods", "2", "--n-push", "4", "--n-fetch", "8"]
        out["ps_rules"] = run_chief(
            [str(scripts["workers/ps_rules.py"]), *rules_args], bare, ports, tmp
        )
        driver = tmp / "driver.py"
        driver.write_text(DRIVER.format(launch=str(LAUNCH), workers=WORKERS))
        out["driver"] = run_chief([str(driver)], kit, ports, tmp)
        out["servers_alive"] = all(p.poll() is None for p in procs)
    finally:
        kill_all(procs)
    return out


def output(chief: subprocess.CompletedProcess) -> str:
    text = chief.stdout + chief.stderr
    assert chief.returncode == 0, text[-3000:]
    return chief.stdout


@pytest.fixture(scope="module")
def checks(chiefs) -> dict:
    stdout = output(chiefs["driver"])
    line = next((s for s in stdout.splitlines() if s.startswith("CHECKS ")), None)
    assert line, stdout[-3000:]
    return json.loads(line[len("CHECKS ") :])


@pytest.mark.slow
def test_sync_ps_applies_one_update_per_round_from_one_push_of_every_worker(checks):
    rounds = checks["rounds"]
    assert len(rounds) == 3
    for n, r in enumerate(rounds, start=1):
        assert r["pushes"] == WORKERS
        assert r["flags_before_apply"] == [1] * WORKERS  # one push from each worker
        assert r["applies"] == n  # exactly one update per round
        assert r["flags_after_apply"] == [0] * WORKERS
        assert r["stale"] == [0] * WORKERS  # every push read the weights of this round
        # the update is SGD on the mean of the pushed gradients, and it did move the weights
        assert r["max_error"] < 1e-5 and r["max_update"] > 1e-4
        assert r["acc_after_apply"] == 0.0
    assert checks["sync"]["pushes_by_worker"] == [3] * WORKERS
    assert checks["sync"]["updates"] == 3  # the optimizer ran once per round, never more


@pytest.mark.slow
def test_downpour_pushes_every_n_push_and_pulls_every_n_fetch(checks):
    down = checks["downpour"]
    n_push, n_fetch = 2, 3
    assert down["period"] == 6 and down["steps"] == 18
    steps = down["steps_by_worker"]
    assert sum(steps) == 18 and all(s % down["period"] == 0 for s in steps)
    assert down["pushes_by_worker"] == [s // n_push for s in steps]
    assert down["fetches_by_worker"] == [s // n_fetch for s in steps]
    assert down["updates"] == 18 // n_push  # each push is one update on the ps, no other
    assert len(down["stale"]) == 18 // n_push and min(down["stale"]) >= 0


@pytest.mark.slow
def test_downpour_forward_is_the_model(checks):
    assert checks["forward_error"] < 1e-5


def test_ps_modes_refuses_a_period_too_long_to_unroll():
    import argparse

    sys.path.insert(0, str(LAUNCH))
    try:
        import train_ps_modes
    finally:
        sys.path.remove(str(LAUNCH))
    args = argparse.Namespace(
        mode="downpour", n_push=5, n_fetch=7, report_every=20, eval_examples=100
    )
    with pytest.raises(Exception, match=r"repeat every 35 steps.*--n-push 4 --n-fetch 8"):
        train_ps_modes.check_args(args)


@pytest.mark.slow
def test_ps_worker_runs_by_hand_without_ddlkit(chiefs):
    stdout = output(chiefs["ps_worker"])
    assert chiefs["servers_alive"], "a server exited by itself"
    assert "schedule loop: 20 steps" in stdout
    found = re.search(r"chief test accuracy (\d\.\d{4})", stdout)
    assert found and float(found.group(1)) > 0.5, stdout[-2000:]
    # variables of 256 KiB or more are split, one shard per ps; the others are whole
    placed = re.findall(r"variable (\S+):0 \(([\d, ]+)\) on /job:ps/replica:0/task:(\d)", stdout)
    shards: dict[str, list] = {}
    for name, shape, task in placed:
        shards.setdefault(re.sub(r"/part_\d+$", "", name), []).append((shape, int(task)))
    assert sorted(shards["dense/kernel"]) == [("800, 128", 0), ("800, 128", 1)], shards
    assert all(len(v) == 1 for k, v in shards.items() if k != "dense/kernel"), shards
    assert len(shards) == 8 and {t for v in shards.values() for _, t in v} == {0, 1}


@pytest.mark.slow
def test_ps_rules_runs_by_hand_without_ddlkit(chiefs):
    stdout = output(chiefs["ps_rules"])
    first = re.search(
        r"round 1: new weights = old - 0.1 x mean of 2 pushes, largest difference (\S+)", stdout
    )
    assert first and float(first.group(1)) < 1e-5, stdout[-2000:]
    assert re.search(r"synchronous: 3 rounds, 3 updates, last loss \d", stdout), stdout[-2000:]
    forward = re.search(r"forward\(\) is the model: largest difference (\S+)", stdout)
    assert forward and float(forward.group(1)) < 1e-5, stdout[-2000:]
    # lcm(4, 8) = 8 steps per period, one push per 4 steps: 2 periods, 4 pushes
    assert "Downpour: 2 periods of 8 steps, 4 pushes (one per 4 steps)" in stdout, stdout[-2000:]


@pytest.mark.slow
def test_no_server_is_left(chiefs):
    procs = chiefs["servers"]
    assert wait_until(lambda: not any(alive(p.pid) for p in procs), 10)
