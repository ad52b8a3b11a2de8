"""Notebook 09b's hand-written all-reduce, taken out of the notebook and run on real processes.

``workers/ring_09b.py`` (the ring) and ``workers/ps_09b.py`` (the parameter server) are
written from the committed notebook into a temporary folder and run there without ddlkit,
as a learner runs them by hand. What the notebook states is asserted: every rank ends with
numpy's sum for 2, 3 and 4 processes, also for sizes the process count does not divide (and
smaller than it), and chunk 0 bit for bit (it is added in numpy's order); the trace has
2(N-1) steps, after the reduce-scatter each rank holds one complete chunk, and each rank
sends 2(N-1)/N of the array; the server's link carries N times the array each way; a
failing rank ends the run with an error and no process left; and on 2 ranks the ring
equals ``hvd.allreduce(op=hvd.Sum)`` bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness.nbscripts import NOTEBOOKS, no_ddlkit_env, write_scripts

NOTEBOOK = NOTEBOOKS / "09b_allreduce_by_hand.ipynb"
TIMEOUT = 300  # seconds; processes on a loaded 2-core machine

# Runs in the workers folder: the ring and the server on every size, results as JSON.
DRIVER = """
import json, sys
import numpy as np
import ps_09b
import ring_09b

out = {}
for size in (2, 3, 4):
    for n in (1, 7, 10_007, 12_000):
        expected = np.sum([ring_09b.make_array(n, r) for r in range(size)], axis=0)
        bounds = ring_09b.chunk_bounds(n, size)
        runs = ring_09b.run_ring(size, n)
        *workers, (_, server) = ps_09b.run_ps(size, n)
        out[f"{size}-{n}"] = {
            "ring_close": [bool(np.allclose(t, expected, rtol=1e-5, atol=1e-5)) for t, _ in runs],
            "ring_identical": [bool(np.array_equal(t, expected)) for t, _ in runs],
            "chunk0_identical": [
                bool(np.array_equal(t[: bounds[0][1]], expected[: bounds[0][1]])) for t, _ in runs],
            "steps": [len(rec["trace"]) for _, rec in runs],
            "complete_after_reduce_scatter": [
                sum(m == 2**size - 1 for m in rec["trace"][size - 2][4]) for _, rec in runs],
            "complete_at_end": [
                sum(m == 2**size - 1 for m in rec["trace"][-1][4]) for _, rec in runs],
            "sent": [sum(row[5] for row in rec["trace"]) for _, rec in runs],
            "chunk_bytes": [4 * (b - a) for a, b in bounds],
            "ps_close": [bool(np.allclose(t, expected, rtol=1e-5, atol=1e-5)) for t, _ in workers],
            "pushed": sum(b for kind, _, b in server["trace"] if kind == "push"),
            "pulled": sum(b for kind, _, b in server["trace"] if kind == "pull"),
        }
print(json.dumps(out))
"""

# A rank that dies: start() must raise, and leave no process behind.
FAILING = """
import os, time
import ring_09b

def fail(report):
    raise SystemExit(3)

def hang(report):
    time.sleep(600)

try:
    ring_09b.start([(fail, ()), (hang, ())], timeout=60)
except RuntimeError as error:
    print("raised", error)

def parent(pid):  # None for a process that ended while we looked
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[1]
    except OSError:
        return None

children = [p for p in os.listdir("/proc") if p.isdigit() and parent(p) == str(os.getpid())]
print("children", len(children))
"""


def _run(code: str, cwd: Path, tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=no_ddlkit_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("nb09b")
    scripts = write_scripts(NOTEBOOK, tmp)
    assert {"workers/ring_09b.py", "workers/ps_09b.py", "workers/hvd_sum_09b.py"} <= set(scripts)
    return tmp / "workers"


def test_ring_and_server_sum_like_numpy_for_2_to_4_processes(workers, tmp_path):
    results = json.loads(_run(DRIVER, workers, tmp_path).splitlines()[-1])
    for key, r in results.items():
        size, n = map(int, key.split("-"))
        assert all(r["ring_close"]), (key, r)
        if size == 2:  # one addition per element, and addition is commutative
            assert all(r["ring_identical"]), (key, r)
        # chunk 0 travels from rank 0 up: added in numpy's order, so bit for bit numpy's
        assert all(r["chunk0_identical"]), (key, r)
        assert r["steps"] == [2 * (size - 1)] * size, (key, r)
        chunks = r["chunk_bytes"]
        # one complete chunk per rank after the reduce-scatter, all of them at the end
        # (an empty chunk, when n < size, counts as complete too)
        assert r["complete_after_reduce_scatter"] == [1] * size, (key, r)
        assert r["complete_at_end"] == [size] * size, (key, r)
        # rank k sends every chunk but k + 1 in the reduce-scatter, every chunk but k + 2 after
        want = [
            2 * sum(chunks) - chunks[(k + 1) % size] - chunks[(k + 2) % size] for k in range(size)
        ]
        assert r["sent"] == want, (key, r)
        if n % size == 0:
            assert r["sent"] == [2 * (size - 1) * 4 * n // size] * size, (key, r)
        assert all(r["ps_close"]), (key, r)
        assert (r["pushed"], r["pulled"]) == (size * 4 * n, size * 4 * n), (key, r)


def test_a_failing_rank_ends_the_run_and_leaves_no_process(workers, tmp_path):
    printed = _run(FAILING, workers, tmp_path)
    assert "raised a process failed" in printed, printed
    assert "children 0" in printed, printed


@pytest.mark.slow
def test_the_ring_equals_horovod_on_two_ranks(workers, tmp_path):
    pytest.importorskip("horovod.tensorflow")
    sizes = [10_007, 12_000]
    save = tmp_path / "hvd"
    bin_dir = os.path.dirname(sys.executable)
    env = no_ddlkit_env(tmp_path, PATH=bin_dir + os.pathsep + os.environ["PATH"])
    cmd = [
        "horovodrun",
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        "hvd_sum_09b.py",
        "--elements",
        *map(str, sizes),
        "--save-to",
        str(save),
    ]
    log = (tmp_path / "horovodrun.log").open("w")
    proc = subprocess.Popen(
        cmd, cwd=workers, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        code = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 0, (tmp_path / "horovodrun.log").read_text()[-3000:]
    sys.path.insert(0, str(workers))
    try:
        import ring_09b
    finally:
        sys.path.remove(str(workers))
    for n in sizes:
        theirs = [np.load(save / f"np2-n{n}-rank{r}.npy") for r in range(2)]
        mine = ring_09b.run_ring(2, n, timeout=TIMEOUT)
        for r, (total, _) in enumerate(mine):
            assert np.array_equal(total, theirs[r]), (n, r, np.abs(total - theirs[r]).max())
