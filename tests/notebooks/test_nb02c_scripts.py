"""Notebook 02c's worker script, run by hand where ddlkit cannot be imported.

``workers/mwms_ctl.py`` is taken out of the committed notebook and started as two processes
with hand-written ``TF_CONFIG`` (workers only: worker 0 is the chief), three times on one
checkpoint directory, as the notebook does with the kit:

1. periodic checkpoints, worker 1 killed with SIGKILL mid-run: worker 0 must fail by itself
   (its all-reduce cannot reach the dead peer), and the chief's newest checkpoint is at most
   ``--save-every`` steps behind the last step it printed;
2. a relaunch with ``--preemption`` resumes at that step (the steps redone are at most
   ``--save-every``); worker 1 then gets SIGTERM, and both workers save at one step and exit
   with the script's code 42, that step being the last one either trained;
3. a relaunch resumes at exactly that step (nothing redone) and trains to the end, both
   workers print the same checksum of their own copy of the weights, and no non-chief's
   temporary directory is left.

Every checkpoint file, the preemption's included (the handler saves through the script's
manager, ``TerminationConfig(save_fn=...)``), is numbered by the global step it holds. The
script restores by hand on every path, before it makes the handler (on a GCP CPU VM the
handler restores nothing).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.nbscripts import (
    NOTEBOOKS,
    extract,
    guarded_imports,
    no_ddlkit_env,
    private_attributes,
    write_scripts,
)

from ddlkit import settings
from ddlkit.cluster.ports import free_ports

NOTEBOOK = NOTEBOOKS / "02c_custom_training_loop.ipynb"
SCRIPT = "workers/mwms_ctl.py"
TIMEOUT = 600  # seconds; two TensorFlow processes on a loaded 2-core machine
EPOCHS, STEPS, SAVE_EVERY = 2, 40, 10
KILL_AT, PREEMPT_AFTER = 15, 10
PREEMPTED_EXIT = 42
STEP = re.compile(r"^worker (\d) step (\d+) loss (\S+)$", re.MULTILINE)
START = re.compile(r"^worker \d starts at step (\d+)", re.MULTILINE)
WEIGHTS = re.compile(r"^worker \d weights (\S+)$", re.MULTILINE)
SAVED = re.compile(r"^worker \d saved a checkpoint at step (\d+) on preemption$", re.MULTILINE)


def test_script_is_plain_tensorflow_with_an_optional_ddlkit_block():
    text = extract(NOTEBOOK)[SCRIPT]
    tree = ast.parse(text)
    private = private_attributes(tree)
    assert not private, f"private attributes in {SCRIPT}: {private}"
    found, guarded = guarded_imports(tree, "ddlkit")
    assert found and guarded == found, "ddlkit outside try/ImportError"
    for api in (
        "distribute_datasets_from_function",
        "strategy.run(",
        "strategy.reduce(",
        "tf.train.CheckpointManager(",
        "tf.train.latest_checkpoint(",
        "PreemptionCheckpointHandler(",
        "reset_state()",
        "save_fn=",
    ):
        assert api in text, f"{SCRIPT} no longer calls {api}"


def test_script_restores_by_hand_before_the_handler():
    """On a GCP CPU VM the handler neither restores nor saves: the script must restore on
    every path, before it makes the handler, not only without --preemption."""
    tree = ast.parse(extract(NOTEBOOK)[SCRIPT])
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")

    def calls(node, name):
        return [
            n
            for n in ast.walk(node)
            if isinstance(n, ast.Call)
            and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == name
        ]

    def on_preemption(node):
        return isinstance(node, ast.If) and "args.preemption" in ast.unparse(node.test)

    branches = [n for n in ast.walk(main) if on_preemption(n)]
    assert branches, "no `if args.preemption:` branch"
    assert not [c for b in branches for c in calls(b, "restore")], "restore only on one path"
    restores = [
        c.lineno for stmt in main.body if not on_preemption(stmt) for c in calls(stmt, "restore")
    ]
    handlers = [c.lineno for c in calls(main, "PreemptionCheckpointHandler")]
    assert restores and handlers and max(restores) < min(handlers), (restores, handlers)


class Job:
    """Two workers of the script, by hand; every process ends in ``close``."""

    def __init__(self, script: Path, tmp_path: Path, name: str, args: list[str]) -> None:
        ports = free_ports(2)
        self.logs = [tmp_path / f"{name}-{i}.log" for i in range(2)]
        self.procs = []
        for i in range(2):
            tf_config = {
                "cluster": {"worker": [f"localhost:{p}" for p in ports]},
                "task": {"type": "worker", "index": i},
            }
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    cwd=tmp_path,
                    env=no_ddlkit_env(tmp_path, TF_CONFIG=json.dumps(tf_config)),
                    stdout=self.logs[i].open("w"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: close() ends all of it
                )
            )

    def text(self, i: int) -> str:
        return self.logs[i].read_text()

    def steps(self, i: int) -> list[int]:
        return [int(s) for w, s, _ in STEP.findall(self.text(i)) if int(w) == i]

    def wait_for_step(self, step: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self.steps(0) or self.steps(0)[-1] < step:
            assert all(p.poll() is None for p in self.procs), self.tails()
            assert time.monotonic() < deadline, f"no step {step} in {TIMEOUT} s\n{self.tails()}"
            time.sleep(0.05)

    def signal(self, i: int, sig: int) -> None:
        os.killpg(self.procs[i].pid, sig)

    def wait(self) -> list[int]:
        return [p.wait(timeout=TIMEOUT) for p in self.procs]

    def tails(self) -> str:
        return "\n\n".join(self.text(i)[-2500:] for i in range(2))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _latest_number(ckpt: Path) -> int:
    """The chief's newest checkpoint, by the number in its name (the global step: the handler
    saves through the script's manager): from the manager's plain-text state file."""
    state = (ckpt / "checkpoint").read_text()
    return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.MULTILINE).group(1))


@pytest.mark.slow
def test_killed_then_preempted_then_resumed(tmp_path):
    if not (settings.data_dir() / "mnist.npz").exists():
        pytest.skip("MNIST is not prepared: python -m ddlkit.data prepare")
    script = write_scripts(NOTEBOOK, tmp_path)[SCRIPT]
    ckpt = tmp_path / "shared" / "ckpt"
    args = ["--ckpt", str(ckpt), "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS)]
    args += ["--batch-size", "32", "--save-every", str(SAVE_EVERY)]
    jobs = []
    try:
        # 1. a crash: SIGKILL to worker 1; worker 0 fails on its own
        jobs.append(run1 := Job(script, tmp_path, "killed", args))
        run1.wait_for_step(KILL_AT)
        run1.signal(1, signal.SIGKILL)
        codes = run1.wait()
        assert codes[1] == -signal.SIGKILL and codes[0] not in (0, None), (codes, run1.tails())
        assert "ddlkit.metrics" not in run1.text(0), "ddlkit was importable"
        trained = run1.steps(0)[-1]
        saved = _latest_number(ckpt)
        assert saved % SAVE_EVERY == 0, saved
        assert trained - SAVE_EVERY <= saved <= trained, (saved, trained)

        # 2. relaunch: resume at the checkpoint, then SIGTERM to worker 1
        jobs.append(run2 := Job(script, tmp_path, "preempted", [*args, "--preemption"]))
        run2.wait_for_step(saved + PREEMPT_AFTER)
        starts = [int(START.search(run2.text(i)).group(1)) for i in range(2)]
        assert starts == [saved, saved], (starts, saved)
        redone = [s for s in run2.steps(0) if s <= trained]
        assert len(redone) == trained - saved <= SAVE_EVERY, (redone, trained, saved)
        run2.signal(1, signal.SIGTERM)
        codes = run2.wait()
        assert codes == [PREEMPTED_EXIT, PREEMPTED_EXIT], (codes, run2.tails())
        said = [SAVED.findall(run2.text(i)) for i in range(2)]
        assert said[0] == said[1] and len(said[0]) == 1, (said, run2.tails())
        preempt_step = int(said[0][0])
        assert run2.steps(0)[-1] == run2.steps(1)[-1] == preempt_step, run2.tails()
        assert _latest_number(ckpt) == preempt_step, "the preemption file is not named by step"

        # 3. relaunch: resume exactly there and finish
        jobs.append(run3 := Job(script, tmp_path, "resumed", [*args, "--preemption"]))
        assert run3.wait() == [0, 0], run3.tails()
        starts = [int(START.search(run3.text(i)).group(1)) for i in range(2)]
        assert starts == [preempt_step, preempt_step], (starts, preempt_step)
        assert run3.steps(0) == list(range(preempt_step + 1, EPOCHS * STEPS + 1))
        losses = [[loss for _, _, loss in STEP.findall(run3.text(i))] for i in range(2)]
        assert losses[0] == losses[1], "the all-reduced loss, equal on both by construction"
        weights = [WEIGHTS.findall(run3.text(i)) for i in range(2)]
        assert len(weights[0]) == 1 and weights[0] == weights[1], weights  # each one's own copy
        assert _latest_number(ckpt) == EPOCHS * STEPS
        assert not list(ckpt.parent.glob("workertemp_*")), "a non-chief's temp dir is left"
    finally:
        for job in jobs:
            job.close()
