"""Notebook 05's Horovod scripts, run by hand under horovodrun where ddlkit cannot be imported.

Notebook 05a (and its solutions) run notebook 05's training script, taken out of notebook 05
with ``dk.lesson.scripts``; a test checks that the script they name is one 05 writes.

``workers/hvd_hello.py``, ``workers/hvd_worker.py`` and ``workers/hvd_ctl.py`` are taken out
of the committed notebook and started as the notebook tells a learner to:
``horovodrun -np 2 -H localhost:2 --gloo python workers/<script>.py``, with an environment
in which ``import ddlkit`` fails (horovodrun passes its environment on to every rank, which a
probe checks). Both ranks must print what the notebook shows, and no process may be left.
The training scripts mark every line that exists only for distribution ``# [dist]``: without
those lines they must still be Python, and name Horovod nowhere.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.nbscripts import (
    NOTEBOOKS,
    extract,
    imported_roots,
    no_ddlkit_env,
    write_scripts,
)
from harness.procutil import marked_pids, wait_until

from ddlkit import settings
from ddlkit.launch import plan

NOTEBOOK = NOTEBOOKS / "05_horovod.ipynb"
TRANSPORTS = NOTEBOOKS / "05a_horovod_transports.ipynb"  # runs 05's WORKER, takes no script
HELLO, WORKER, CTL = "workers/hvd_hello.py", "workers/hvd_worker.py", "workers/hvd_ctl.py"
TIMEOUT = 900  # seconds; two TensorFlow ranks on a loaded 2-core machine
RANK_LINE = re.compile(r"^\[(\d)\]<stdout>:(.*)$", re.MULTILINE)

PROBE = """
import os
try:
    import ddlkit
    print("rank", os.environ["HOROVOD_RANK"], "ddlkit importable", flush=True)
except ImportError as error:
    print("rank", os.environ["HOROVOD_RANK"], "ImportError:", error, flush=True)
"""


def _stdout_by_rank(output: str) -> dict[int, list[str]]:
    """horovodrun's ``[rank]<stdout>:line`` lines, grouped by rank."""
    lines: dict[int, list[str]] = {}
    for rank, line in RANK_LINE.findall(output):
        lines.setdefault(int(rank), []).append(line)
    return lines


def _horovodrun(script: Path, *args: str, tmp_path: Path) -> str:
    horovodrun = plan.find_horovodrun(sys.executable)
    assert horovodrun, "Horovod is not installed. Fix: scripts/build-horovod.sh .venv/bin/python"
    argv = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script)]
    for attempt in range(2):
        proc = subprocess.run(
            [*argv, *args],
            env=no_ddlkit_env(tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        output = proc.stdout + proc.stderr
        # Once, under the parallel suite, Gloo's rendezvous between the ranks failed before
        # any training ("gloo::IoException ... connect [127.0.0.1]:43394: Connection
        # refused"; both ranks aborted): that one failure, and only once, is run again.
        if proc.returncode == 0 or attempt or "gloo::IoException" not in output:
            break
    assert proc.returncode == 0, output[-4000:]
    # horovodrun has returned; its ranks must be gone too.
    assert wait_until(lambda: not marked_pids(str(script)), timeout=10), marked_pids(str(script))
    return output


def test_scripts_import_tensorflow_and_horovod_and_ddlkit_only_guarded():
    scripts = extract(NOTEBOOK)
    assert set(scripts) == {HELLO, WORKER, CTL}
    for name, text in scripts.items():
        tree = ast.parse(text)
        assert ast.get_docstring(tree) and "horovodrun -np 2 -H localhost:2" in text, name
        assert 'if __name__ == "__main__"' in text and "def main()" in text, name
        roots = imported_roots(tree)
        allowed = {"argparse", "os", "horovod", "numpy", "tensorflow", "ddlkit", "hvd_worker"}
        assert roots <= allowed, roots
    worker = scripts[WORKER]
    assert 30 <= len(worker.splitlines()) <= 100
    for call in (
        'tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")',
        "tf.config.experimental.set_memory_growth(gpu, True)",
        "hvd.size()",
        "backward_passes_per_step=",
        "compression=",
        "SparseCategoricalCrossentropy(from_logits=True)",  # logits, as notebook 00 teaches
        "hvd.callbacks.BroadcastGlobalVariablesCallback(0)",
        "hvd.callbacks.MetricAverageCallback()",  # on tf-keras, with the kit's Horovod build
        "hvd.callbacks.LearningRateWarmupCallback(",
        "if rank == 0:",
    ):
        assert call in worker, call
    assert 'activation="softmax"' not in worker
    ctl = scripts[CTL]
    for call in (
        'tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")',
        "train.shard(hvd.size(), hvd.rank())",
        "hvd.DistributedGradientTape(tape)",
        "optimizer.apply_gradients(",
        "hvd.broadcast_variables(model.variables, root_rank=0)",
        "hvd.broadcast_variables(optimizer.variables, root_rank=0)",
        "tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=next_epoch)",
        'hvd.broadcast(next_epoch, root_rank=0, name="resume_epoch")',
        "last = int(hvd.join())",
        "hvd.broadcast_variables(model.variables, root_rank=last)",
        "if rank == 0:",
    ):
        assert call in ctl, call
    for text in (worker, ctl):
        top = [ast.unparse(n) for n in ast.parse(text).body]
        keras = next(i for i, line in enumerate(top) if "TF_USE_LEGACY_KERAS" in line)
        assert keras < top.index("import tensorflow as tf"), "choose tf-keras before TF loads"


@pytest.mark.parametrize(
    "notebook", [TRANSPORTS, NOTEBOOKS / "solutions" / "05a_horovod_transports.ipynb"]
)
def test_05a_runs_the_training_script_that_notebook_05_writes(notebook):
    code = "\n".join(
        "".join(c["source"])
        for c in json.loads(notebook.read_text())["cells"]
        if c["cell_type"] == "code"
    )
    assert not extract(notebook), "05a writes no script of its own: it runs notebook 05's"
    taken = re.findall(r'dk\.lesson\.scripts\("((?:\.\./)?05_horovod\.ipynb)"', code)
    assert taken, "05a takes its scripts out of notebook 05 with dk.lesson.scripts"
    assert (notebook.parent / taken[0]).resolve() == NOTEBOOK.resolve()
    names = set(re.findall(r'\["(workers/[\w.]+)"\]', code))
    assert names and names <= set(extract(NOTEBOOK)), names  # e.g. ["workers/hvd_worker.py"]


@pytest.mark.parametrize("name", [WORKER, CTL])
def test_without_its_dist_lines_a_script_is_python_that_names_no_horovod(name):
    text = extract(NOTEBOOK)[name]
    kept = "\n".join(line for line in text.splitlines() if "# [dist]" not in line)
    tree = ast.parse(kept)  # a SyntaxError names the line the deletion broke
    left = sorted(
        {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "hvd"}
        | {
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            and any("horovod" in (getattr(n, "module", None) or a.name) for a in n.names)
        }
    )
    lines = kept.splitlines()
    assert not left, "unmarked lines that need Horovod:\n" + "\n".join(lines[i - 1] for i in left)


@pytest.mark.slow
def test_horovodrun_passes_the_no_ddlkit_environment_to_every_rank(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    ranks = _stdout_by_rank(_horovodrun(probe, tmp_path=tmp_path))
    assert sorted(ranks) == [0, 1]
    for rank, lines in ranks.items():
        assert lines == [
            f"rank {rank} ImportError: ddlkit is not importable here on purpose: "
            "this script must run without ddlkit"
        ], lines


@pytest.mark.slow
def test_hello_prints_every_rank_and_the_allreduced_values(tmp_path):
    script = write_scripts(NOTEBOOK, tmp_path)[HELLO]
    ranks = _stdout_by_rank(_horovodrun(script, "--value", "2", tmp_path=tmp_path))
    assert ranks == {
        0: ["rank 0 of size 2, local rank 0", "rank 0 sent 2: allreduce sum 6, average 3"],
        1: ["rank 1 of size 2, local rank 1", "rank 1 sent 4: allreduce sum 6, average 3"],
    }


@pytest.mark.slow
def test_worker_trains_on_both_ranks_to_the_same_accuracy_and_rank_0_checkpoints(tmp_path):
    script = write_scripts(NOTEBOOK, tmp_path)[WORKER]
    data = settings.data_dir() / "mnist.npz"
    assert data.exists(), f"{data} is missing. Fix: make install (it prepares the offline data)"
    checkpoints = tmp_path / "ckpt"
    args = ["--steps-per-epoch", "20", "--epochs", "2", "--backward-passes", "2", "--fp16"]
    args += ["--warmup-epochs", "1"]  # Horovod's own warm-up, on the kit's build
    output = _horovodrun(
        script, *args, "--checkpoint-dir", str(checkpoints), "--data", str(data), tmp_path=tmp_path
    )
    ranks = _stdout_by_rank(output)
    accuracy = {
        rank: re.fullmatch(rf"rank {rank} test accuracy (\d\.\d{{4}})", lines[-1])
        for rank, lines in ranks.items()
    }
    assert sorted(accuracy) == [0, 1] and all(accuracy.values()), ranks
    values = {float(m.group(1)) for m in accuracy.values()}
    assert len(values) == 1, f"the ranks' replicas differ: {ranks}"  # same weights everywhere
    assert values.pop() > 0.5, ranks  # 40 steps of 128 examples: far above chance (0.1)
    progress = [line for line in ranks[0] if line.startswith("20/20")]
    assert len(progress) == 2 and not any("20/20" in line for line in ranks[1]), ranks
    assert all(" - lr: 0.0020 - " in line for line in progress), progress  # warmed up to 2e-3
    assert sorted(p.name for p in checkpoints.glob("*.index")) == [
        "ckpt-01.index",
        "ckpt-02.index",
    ]


def _numbers(ranks: dict[int, list[str]], pattern: str) -> dict[int, list[float]]:
    """What ``pattern`` captures in each rank's lines, as numbers: {rank: [values]}."""
    found = {r: [re.search(pattern, line) for line in lines] for r, lines in ranks.items()}
    return {r: [float(m.group(1)) for m in ms if m] for r, ms in found.items()}


@pytest.mark.slow
def test_loop_joins_uneven_ranks_and_a_relaunch_resumes_at_rank_0s_epoch(tmp_path):
    script = write_scripts(NOTEBOOK, tmp_path)[CTL]
    data = settings.data_dir() / "mnist.npz"
    assert data.exists(), f"{data} is missing. Fix: make install (it prepares the offline data)"
    args = ["--steps", "4", "--extra", "3", "--checkpoint-dir", str(tmp_path / "ckpt")]
    args += ["--data", str(data)]
    # The first launch trains epoch 0: rank 1 has 3 batches more than rank 0, and the job
    # ends (a rank left in an allreduce would hold horovodrun until the timeout).
    first = _stdout_by_rank(_horovodrun(script, "--epochs", "1", *args, tmp_path=tmp_path))
    assert sorted(first) == [0, 1], first
    assert _numbers(first, r"starts at epoch (\d+)") == {0: [0], 1: [0]}, first
    assert _numbers(first, r"epoch 0: (\d+) steps") == {0: [4], 1: [7]}, first
    # While rank 0 had joined, rank 1's allreduce averaged its 1.0 with rank 0's zero.
    assert _numbers(first, r"with the others joined: ([\d.]+)") == {0: [], 1: [0.5]}, first
    assert _numbers(first, r"the last to join was rank (\d)") == {0: [1], 1: [1]}, first
    weights = _numbers(first, r"weights (-?[\d.]+)")
    assert weights[0] == weights[1] and len(weights[0]) == 1, first  # equal after the broadcast
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.index")) == ["ckpt-1.index"]
    # The relaunch asks for 2 epochs: rank 0 restores epoch 0's checkpoint and every rank
    # starts at epoch 1, the one rank 0 broadcast; epoch 0 is not trained again.
    again = _stdout_by_rank(_horovodrun(script, "--epochs", "2", *args, tmp_path=tmp_path))
    assert _numbers(again, r"starts at epoch (\d+)") == {0: [1], 1: [1]}, again
    assert _numbers(again, r"epoch (\d+): \d+ steps") == {0: [1], 1: [1]}, again
    assert _numbers(again, r"epoch 1: (\d+) steps") == {0: [4], 1: [7]}, again
    resumed = _numbers(again, r"weights (-?[\d.]+)")
    assert resumed[0] == resumed[1] and resumed[0] != weights[0], again
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.index")) == [
        "ckpt-1.index",
        "ckpt-2.index",
    ]
