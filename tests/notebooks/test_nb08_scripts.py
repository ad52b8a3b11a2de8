"""Notebook 08's scripts, run by hand where ddlkit cannot be imported, and its solutions' tools.

The lesson writes ``workers/hvd_levers.py`` (Horovod's levers as flags), ``workers/alloc_check.py``
(page faults and CPU time per step for one CPU allocator), ``workers/local_logs.py`` (the
``LocalStepLogs`` model) and ``workers/mwms_logs.py`` (MultiWorkerMirroredStrategy with either
per-step logs). They are taken out of the committed notebook and started as their docstrings
tell a learner to: under ``horovodrun --gloo``, and as two processes with hand-written
``TF_CONFIG``. ``alloc_check.py`` imports nothing of ddlkit (the first test checks it), and the
lesson runs it as a learner would: ``python workers/alloc_check.py`` with the variable set.
The solutions notebook copies the lesson's measurement and models; a test holds the copies to
the lesson's cells.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from subprocess import PIPE

import pytest
from harness.nbscripts import (
    NOTEBOOKS,
    extract,
    guarded_imports,
    imported_roots,
    no_ddlkit_env,
    write_scripts,
)
from harness.procutil import marked_pids, wait_until

from ddlkit import settings
from ddlkit.cluster.ports import free_ports
from ddlkit.launch import plan

NOTEBOOK = NOTEBOOKS / "08_performance.ipynb"
SOLUTIONS = NOTEBOOKS / "solutions" / "08_performance.ipynb"
HVD, ALLOC, LOGS, MWMS = (
    "workers/hvd_levers.py",
    "workers/alloc_check.py",
    "workers/local_logs.py",
    "workers/mwms_logs.py",
)
TIMEOUT = 900  # seconds; two TensorFlow processes on a loaded 2-core machine
RATE = re.compile(r"^\[(\d)\]<stdout>:rank (\d): ([\d.]+) examples/s$", re.MULTILINE)
STDLIB = {"argparse", "json", "os", "resource", "time"}


def _lines_marked(text: str, mark: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if f"# {mark}" in line]


def test_scripts_are_tensorflow_horovod_and_the_standard_library_only():
    scripts = extract(NOTEBOOK)
    assert set(scripts) == {HVD, ALLOC, LOGS, MWMS}
    allowed = {
        HVD: STDLIB | {"horovod", "numpy", "tensorflow"},
        ALLOC: STDLIB | {"numpy", "tensorflow"},
        LOGS: {"tensorflow"},
        MWMS: STDLIB | {"numpy", "tensorflow", "local_logs", "ddlkit"},
    }
    for name, text in scripts.items():
        tree = ast.parse(text)
        assert ast.get_docstring(tree), name
        assert imported_roots(tree) <= allowed[name], (name, imported_roots(tree) - allowed[name])
        if name != LOGS:
            assert 'if __name__ == "__main__"' in text and "def main()" in text, name
            assert "python workers/" + name.split("/")[1] in text, f"{name}: no by-hand command"
    # the one ddlkit import (live metrics) is optional: inside try/except ImportError
    tree = ast.parse(scripts[MWMS])
    found, guarded = guarded_imports(tree, "ddlkit")
    assert found and guarded == found, "ddlkit imported outside the guard"


def test_the_levers_are_written_out_and_marked():
    scripts = extract(NOTEBOOK)
    hvd = scripts[HVD]
    for call in (
        "hvd.DistributedOptimizer(",
        "groups=args.groups or None,",
        "compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,",
        "backward_passes_per_step=args.backward_passes,",
        "average_aggregated_gradients=True)",
        "os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))",
        "os.sched_setaffinity(int(tid), mine)",
        "tf.config.threading.set_intra_op_parallelism_threads(share)",
        "except ProcessLookupError:",
        'horovodrun -np 2 -H localhost:2 --mpi --mpi-args="--mca mpi_yield_when_idle 1"',
        "horovodrun -np 2 -H localhost:2 --gloo",
        "hvd.callbacks.BroadcastGlobalVariablesCallback(0)",
    ):
        assert call in hvd, call
    speed = _lines_marked(hvd, "[speed]")
    assert "groups=args.groups or None," in speed and "pass" in speed, speed
    assert "opt = hvd.DistributedOptimizer(" in _lines_marked(hvd, "[dist]")
    mwms = scripts[MWMS]
    assert "model = LocalStepLogs(model.inputs, model.outputs)" in _lines_marked(mwms, "[speed]")
    assert 'os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")' in _lines_marked(
        mwms, "[speed]"
    )
    assert "type(m).result(m)" in scripts[LOGS]
    for name, text in scripts.items():
        top = [ast.unparse(n) for n in ast.parse(text).body]
        if "TF_USE_LEGACY_KERAS" in text:
            keras = next(i for i, line in enumerate(top) if "TF_USE_LEGACY_KERAS" in line)
            assert keras < top.index("import tensorflow as tf"), f"{name}: tf-keras after TF"


def _definitions(notebook) -> dict[str, str]:
    cells = json.loads(notebook.read_text())["cells"]
    found = {}
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or source.startswith("%%"):
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found[node.name] = ast.dump(node)
    return found


def test_the_solutions_copy_the_lessons_tools_as_the_lesson_writes_them():
    lesson, solutions = _definitions(NOTEBOOK), _definitions(SOLUTIONS)
    copied = ("pipeline", "fast_pipeline", "StepClock", "examples_per_sec", "compiled")
    for name in (*copied, "Accumulating"):
        assert name in solutions, f"the solutions no longer define {name}"
        assert solutions[name] == lesson[name], f"{name} differs from the lesson's: copy it again"


@pytest.mark.slow
def test_hvd_levers_by_hand_without_ddlkit_prints_each_ranks_rate(tmp_path):
    script = write_scripts(NOTEBOOK, tmp_path)[HVD]
    data = settings.data_dir() / "mnist.npz"
    assert data.exists(), f"{data} is missing. Fix: make install (it prepares the offline data)"
    horovodrun = plan.find_horovodrun(sys.executable)
    assert horovodrun, "Horovod is not installed. Fix: make install horovod"
    levers = ["--groups", "1", "--fp16", "--backward-passes", "2"]
    argv = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script)]
    argv += ["--steps", "12", "--warmup", "2", "--data", str(data), *levers]
    env = no_ddlkit_env(tmp_path)
    proc = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    rates = {int(tag): (int(rank), float(rate)) for tag, rank, rate in RATE.findall(output)}
    assert sorted(rates) == [0, 1] and all(rates[r][0] == r for r in rates), output[-2000:]
    assert all(rate > 0 for _, rate in rates.values()), rates
    assert wait_until(lambda: not marked_pids(str(script)), timeout=10), marked_pids(str(script))


@pytest.mark.slow
def test_mwms_logs_by_hand_with_local_step_logs_keeps_epoch_logs_synchronised(tmp_path):
    scripts = write_scripts(NOTEBOOK, tmp_path)
    data = settings.data_dir() / "mnist.npz"
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(2)]}
    argv = [sys.executable, str(scripts[MWMS]), "--steps", "8", "--step-logs", "local"]
    argv += ["--data", str(data)]
    procs = []
    for i in range(2):
        config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        env = no_ddlkit_env(tmp_path, TF_CONFIG=config)
        procs.append(
            subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=PIPE, stderr=PIPE, text=True)
        )
    try:
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-4000:]
    losses = [re.fullmatch(r"worker (\d): loss (\S+)", out.strip()) for out, _ in outs]
    assert all(losses), outs
    assert [int(m.group(1)) for m in losses] == [0, 1]
    # per-step logs are each worker's own; the epoch's are read across both: equal
    assert losses[0].group(2) == losses[1].group(2), [m.group(0) for m in losses]
