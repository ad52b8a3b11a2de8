"""Horovod for real: horovodrun with 2 ranks on loopback, over MPI and over Gloo.

These need Horovod built into the venv (``make test`` does it through
scripts/build-horovod.sh). Without it they fail, naming the fix: CI must not
pass without them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness.procutil import alive, wait_until

import ddlkit.horovod as dkh
from ddlkit.errors import WorkerFailedError
from ddlkit.launch import plan
from ddlkit.launch import run as run_mod

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def horovodrun() -> str:
    found = plan.find_horovodrun(sys.executable)
    assert found, (
        "Horovod is not installed in this venv. Fix: scripts/build-horovod.sh .venv/bin/python"
    )
    return found


def _write(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def _horovodrun(
    horovodrun: str,
    script: Path,
    *args: str,
    env: dict | None = None,
    flags: tuple[str, ...] = (),
    transport: str = "--gloo",
    timeout=240,
):
    return subprocess.run(
        [horovodrun, "-np", "2", "-H", "localhost:2", transport, *flags, sys.executable]
        + [str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


_ALLREDUCE = """
    import json, os, sys
    import ddlkit.horovod as dkh
    import tensorflow as tf
    hvd = dkh.init()
    out = {"rank": hvd.rank(), "size": hvd.size(), "worker": os.environ["DDLKIT_WORKER"]}
    for dtype in (tf.float32, tf.float64, tf.int32):
        for n in (1, 1000, 100000):
            x = tf.fill([n], tf.cast(hvd.rank() + 1, dtype))
            total = hvd.allreduce(x, op=hvd.Sum).numpy()
            out[f"sum-{dtype.name}-{n}"] = sorted(set(total.tolist()))
    out["avg"] = float(hvd.allreduce(tf.constant(float(hvd.rank() * 10)), op=hvd.Average))
    out["gather"] = hvd.allgather(tf.constant([hvd.rank()])).numpy().tolist()
    out["bcast"] = float(hvd.broadcast(tf.constant(float(hvd.rank() + 7)), root_rank=1))
    out["mpi"] = bool(hvd.mpi_enabled())
    tasks = os.listdir("/proc/self/task")
    out["idle"] = [t for t in tasks if os.sched_getscheduler(int(t)) == os.SCHED_IDLE]
    if len(sys.argv) > 2:  # CPU this rank uses while it waits for nothing (Horovod's threads)
        import time
        hvd.allreduce(tf.constant(1.0))
        start, cpu = time.monotonic(), time.process_time()
        time.sleep(float(sys.argv[2]))
        out["waiting"] = (time.process_time() - cpu) / (time.monotonic() - start)
    with open(sys.argv[1] + f"/rank-{hvd.rank()}.json", "w") as f:
        json.dump(out, f)
    hvd.shutdown()  # ends Horovod's background thread, which writes out the timeline
"""


def test_two_ranks_allreduce_gives_the_right_sums_and_a_timeline(horovodrun, tmp_path):
    script = _write(tmp_path, "allreduce.py", _ALLREDUCE)
    timeline = tmp_path / "timeline.json"
    proc = _horovodrun(
        horovodrun, script, str(tmp_path), flags=("--timeline-filename", str(timeline))
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert out["rank"] == rank and out["size"] == 2
        sums = {k: v for k, v in out.items() if k.startswith("sum-")}
        assert len(sums) == 9 and all(v == [3] for v in sums.values()), sums  # 1 + 2
        assert out["avg"] == 5.0  # (0 + 10) / 2
        assert out["gather"] == [0, 1]
        assert out["bcast"] == 8.0  # rank 1's value
        assert out["mpi"] is False  # Gloo did the work
        assert out["worker"] == f"rank-{rank}"  # dkh.init named the rank
        assert out["idle"] == []  # not pinned: Horovod's threads keep their priority
    spans = dkh.load_timeline(timeline)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= set(spans.activities), spans.activities
    assert spans.totals()["ALLREDUCE"][0] >= 9  # the nine sums, at least


_PIN_PROBE = """
    import json, os, sys
    import ddlkit  # noqa: F401
    import horovod.tensorflow.keras  # noqa: F401  (train_horovod.py's import order)
    import tensorflow as tf
    import ddlkit.horovod as dkh
    hvd = dkh.init()
    tf.constant(1.0) * 2  # TensorFlow's runtime starts after the pinning
    tasks = os.listdir("/proc/self/task")
    out = {
        "affinity": sorted(os.sched_getaffinity(0)),
        "thread_affinities": sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in tasks}),
        "intra": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter": tf.config.threading.get_inter_op_parallelism_threads(),
        "env": os.environ["TF_NUM_INTRAOP_THREADS"],
        "idle": [int(t) for t in tasks if os.sched_getscheduler(int(t)) == os.SCHED_IDLE],
        "main": os.getpid(),
    }
    with open(sys.argv[1] + f"/rank-{hvd.rank()}.json", "w") as f:
        json.dump(out, f)
"""


def test_each_rank_pins_itself_to_its_own_core_with_matching_threads(horovodrun, tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f"pinning 2 ranks to their own cores needs 2 cores; this machine has {cores}")
    script = _write(tmp_path, "pin.py", _PIN_PROBE)
    env = dkh.pinning.rank_cpus_env(cores[:2], ranks=2)
    proc = _horovodrun(horovodrun, script, str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [s["affinity"] for s in seen] == [[cores[0]], [cores[1]]]
    for s in seen:  # every thread of the rank, including Horovod's and TensorFlow's
        assert s["thread_affinities"] == [s["affinity"]], s
        assert (s["intra"], s["inter"], s["env"]) == (1, 2, "1"), s
        # hvd.init()'s threads (Horovod's background thread at least) at idle priority,
        # the rank's own (its Python, TensorFlow's pools) not
        assert s["idle"] and s["main"] not in s["idle"], s


@pytest.mark.parametrize(("transport", "pin"), [("auto", True), ("gloo", False)])
def test_allreduce_timing_measures_two_real_ranks(horovodrun, transport, pin):
    timing = dkh.allreduce_timing([4096, 1 << 20], np=2, repeats=3, transport=transport, pin=pin)
    assert timing.ranks == 2 and [p.nbytes for p in timing.points] == [4096, 1 << 20]
    # pinned: each rank ran on its own core, as the horovod strategy's ranks do
    cores = sorted(os.sched_getaffinity(0))
    pinned = ((cores[0],), (cores[1],)) if pin and len(cores) >= 2 else None
    assert timing.rank_cpus == pinned
    assert all(0 < p.min_seconds <= p.seconds <= p.max_seconds < 30 for p in timing.points)
    # auto: the horovod strategy's choice here (MPI where this Horovod has it)
    mpi = transport == "auto" and _mpi_built()
    assert timing.transport == ("mpi" if mpi else "gloo")
    assert dkh.AllreduceTiming.from_dict(timing.to_dict()) == timing


def _results(run) -> dict[str, dict]:
    results = run.results()
    assert sorted(results) == ["rank-0", "rank-1"], results
    return results


def _gradients(tl) -> list[str]:
    """The timeline's gradient all-reduces: not the broadcasts, not the metrics' one."""
    return [t for t in tl.tensors if "Allreduce" in t and t != "HorovodAllreduce"]


def _steps_apart(starts: list[float], per_step: int) -> tuple[float, float]:
    """(widest step, narrowest gap between steps) of `starts`, `per_step` at a time."""
    ordered = sorted(starts)
    steps = [ordered[i : i + per_step] for i in range(0, len(ordered), per_step)]
    widest = max(s[-1] - s[0] for s in steps)
    return widest, min(b[0] - a[-1] for a, b in zip(steps, steps[1:], strict=False))


def test_tf_keras_path_trains_with_identical_replicas_and_live_metrics(
    horovodrun, data_env, tmp_path
):
    run = run_mod.start(
        LAUNCH / "train_horovod.py",
        strategy="horovod",
        workers=2,
        args=["--steps-per-epoch", "12", "--epochs", "2", "--warmup-epochs", "1"],
        runs_dir=tmp_path,
        env={"HOROVOD_TIMELINE": str(tmp_path / "timeline.json")},
    )
    assert run.wait(timeout=400).ok, run.tail("horovodrun", 60)
    # The script's default --groups 1: the CNN's 8 gradients go in one grouped all-reduce,
    # once a step (24 steps), not one by one as the backward pass makes them.
    tl = dkh.load_timeline(tmp_path / "timeline.json")
    # horovod_transport="auto": this machine's Horovod has MPI, so the ranks ran over it.
    assert "MPI_ALLREDUCE" in tl.activities and "GLOO_ALLREDUCE" not in tl.activities
    grads = _gradients(tl)
    assert len(grads) == 8 and all("GroupedAllreduce" in t for t in grads), tl.tensors
    starts = [s.start for s in tl.spans if s.name == "ALLREDUCE" and s.tensor in grads]
    assert len(starts) == 8 * 24, len(starts)
    widest, gap = _steps_apart(starts, per_step=8)  # each step's 8 together, steps apart
    assert widest < gap, sorted(starts)
    r0, r1 = _results(run).values()
    assert r0["weights_checksum"] == r1["weights_checksum"], "replicas diverged"
    assert r0["loss"] == r1["loss"], "MetricAverageCallback: ranks disagree on the epoch loss"
    assert math.isfinite(r0["loss"]) and r0["loss"] < math.log(10), r0
    assert r0["replicas"] == 2 and r0["test_accuracy"] > 0.2, r0
    for rank in ("rank-0", "rank-1"):  # both ranks streamed to the notebook's collector
        kinds = [r.kind for r in run.records(rank)]
        assert kinds.count("step") == 24 and kinds.count("epoch") == 2, kinds
        assert (run.run_dir / "metrics" / f"{rank}.jsonl").is_file()
    # The epoch record carries the averaged loss, the same on both ranks.
    epoch_losses = {rank: run.records(rank)[-2].loss for rank in ("rank-0", "rank-1")}
    assert epoch_losses["rank-0"] == epoch_losses["rank-1"], epoch_losses


def test_keras3_tape_path_trains_and_broadcast_makes_replicas_identical(
    horovodrun, data_env, tmp_path, monkeypatch
):
    monkeypatch.setenv("DDLKIT_KERAS", "3")  # the launcher gives the ranks Keras 3
    run = run_mod.start(
        LAUNCH / "train_horovod_tape.py",
        strategy="horovod",
        workers=2,
        args=["--steps-per-epoch", "10", "--epochs", "1", "--seed-per-rank"],
        runs_dir=tmp_path,
    )
    assert run.wait(timeout=400).ok, run.tail("horovodrun", 60)
    r0, r1 = _results(run).values()
    assert r0["keras"] == r1["keras"] == "keras3"
    assert r0["initial_checksum"] != r1["initial_checksum"], "ranks started equal: no test"
    assert r0["weights_checksum"] == r1["weights_checksum"], "replicas diverged"
    assert r0["loss"] == r1["loss"] and r0["loss"] < math.log(10), (r0, r1)
    assert [r.kind for r in run.records("rank-1")].count("step") == 10


_AVERAGE = """
    import json, sys
    import ddlkit
    import ddlkit.horovod as dkh
    from ddlkit import backend, models
    import numpy as np
    hvd = dkh.init()
    keras = backend.keras()

    class Keep(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append({k: float(v) for k, v in logs.items()})

    before, after = Keep(), Keep()
    rng = np.random.default_rng(hvd.rank())  # each rank its own data: different metrics
    x = rng.random((64, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    model = models.compile_classifier(models.mnist_cnn(seed=hvd.rank()))
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[before, dkh.MetricAverageCallback(), after])
    with open(sys.argv[1] + f"/rank-{hvd.rank()}.json", "w") as f:
        json.dump({"before": before.seen, "after": after.seen,
                   "keras": backend.active_flavour()}, f)
"""


@pytest.mark.parametrize("keras", ["2", "3"], ids=["tf-keras", "keras3"])
def test_metric_average_callback_gives_the_mean_over_ranks(horovodrun, tmp_path, keras):
    script = _write(tmp_path, "average.py", _AVERAGE)
    proc = _horovodrun(horovodrun, script, str(tmp_path), env={"DDLKIT_KERAS": keras})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert r0["keras"] == ("tf-keras" if keras == "2" else "keras3")
    for epoch in range(2):
        raw0, raw1 = r0["before"][epoch], r1["before"][epoch]
        assert raw0["loss"] != raw1["loss"], "ranks logged the same loss: nothing to average"
        for key in ("loss", "accuracy"):
            mean = (raw0[key] + raw1[key]) / 2
            assert r0["after"][epoch][key] == pytest.approx(mean, rel=1e-6)
            assert r1["after"][epoch][key] == pytest.approx(mean, rel=1e-6)


_DIES = """
    import os, sys, time
    import ddlkit.horovod as dkh
    import tensorflow as tf
    hvd = dkh.init()
    with open(os.path.join(sys.argv[1], f"pid-{hvd.rank()}"), "w") as f:
        f.write(str(os.getpid()))
    mode = sys.argv[2]
    for step in range(100000):
        hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="tick")
        if mode == "die" and hvd.rank() == 1 and step == 20:
            print("rank 1: dying on purpose", flush=True)
            os._exit(3)
        time.sleep(0.05)
"""


def _rank_pids(tmp_path: Path, timeout: float = 120) -> list[int]:
    files = [tmp_path / "pid-0", tmp_path / "pid-1"]
    assert wait_until(lambda: all(f.exists() and f.read_text() for f in files), timeout)
    return [int(f.read_text()) for f in files]


def test_a_rank_that_dies_brings_the_job_down_with_no_orphans(horovodrun, tmp_path):
    script = _write(tmp_path, "dies.py", _DIES)
    run = run_mod.start(
        script, strategy="horovod", workers=2, args=[str(tmp_path), "die"], runs_dir=tmp_path
    )
    pids = _rank_pids(tmp_path)
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        run.wait(timeout=120)
    assert info.value.worker == "horovodrun" and info.value.exit_code != 0
    assert "dying on purpose" in run.tail("horovodrun", 200)
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=30), "orphan ranks"
    assert time.monotonic() - start < 90


_PRINTS = """
    import horovod.tensorflow as hvd

    hvd.init()
    for i in range(20):
        print("rank", hvd.rank(), "line", i, "x" * 20)
"""


def test_each_rank_line_arrives_whole_over_mpi(horovodrun, tmp_path):
    if not _mpi_built():
        pytest.skip("this Horovod was built without MPI (make ... HOROVOD_MPI=)")
    script = _write(tmp_path, "prints.py", _PRINTS)
    run = run_mod.start(script, strategy="horovod", workers=2, runs_dir=tmp_path)
    assert run.wait(timeout=120).ok, run.tail("horovodrun", 60)
    # mpirun tags each piece of output it reads. The launcher's PYTHONUNBUFFERED=1 would
    # make print() write its words and its newline apart ("[1,0]<stdout>:rank[1,0]<stdout>:
    # 0 ..."); the ranks run buffered, so each line is one piece with one tag.
    printed = [ln for ln in run.tail("horovodrun", 400).splitlines() if "<stdout>:" in ln]
    for rank in (0, 1):
        want = [f"[1,{rank}]<stdout>:rank {rank} line {i} {'x' * 20}" for i in range(20)]
        assert [ln for ln in printed if ln.startswith(f"[1,{rank}]")] == want, printed


def _argv_holding(secret: str) -> list[str]:
    """The /proc/PID/cmdline files of this machine's processes whose argv holds `secret`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if secret.encode() in cmdline.read_bytes():
                found.append(str(cmdline))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # the process ended while we looked
    return found


def test_killing_horovodrun_ends_every_rank(horovodrun, tmp_path):
    script = _write(tmp_path, "dies.py", _DIES)
    run = run_mod.start(
        script, strategy="horovod", workers=2, args=[str(tmp_path), "live"], runs_dir=tmp_path
    )
    pids = _rank_pids(tmp_path)
    # Over MPI (this machine's default) horovodrun hands mpirun the variables' names only
    # (-x NAME): the collector's token is in no process's argv. (Over Gloo, Horovod's own
    # launcher writes every variable into the ranks' shell command.)
    if _mpi_built():
        assert not _argv_holding(run.collector.token)
    run.kill("horovodrun")
    with pytest.raises(WorkerFailedError, match="horovodrun"):
        run.wait(timeout=60)
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=20), "orphan ranks"


def test_cli_launches_the_horovod_strategy(horovodrun, data_env, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit.cli",
            "launch",
            "--strategy",
            "horovod",
            "-n",
            "2",
            "--runs-dir",
            str(tmp_path),
            "--env",
            f"HOROVOD_TIMELINE={tmp_path / 'timeline.json'}",
            "--horovod-transport",
            "gloo",
            str(LAUNCH / "train_horovod.py"),
            "--",
            "--steps-per-epoch",
            "5",
            "--epochs",
            "1",
            "--fp16",
            "--backward-passes",
            "2",
            "--groups",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p.parent for p in tmp_path.glob("*/job.json")]
    results = {p.stem: json.loads(p.read_text()) for p in (run_dir / "results").glob("*.json")}
    assert sorted(results) == ["rank-0", "rank-1"]
    assert results["rank-0"]["weights_checksum"] == results["rank-1"]["weights_checksum"]
    # --groups 0: Horovod's own default, one all-reduce per gradient (8), none grouped
    tl = dkh.load_timeline(tmp_path / "timeline.json")
    assert "GLOO_ALLREDUCE" in tl.activities and "MPI_ALLREDUCE" not in tl.activities
    grads = _gradients(tl)
    assert len(grads) == 8 and not any("Grouped" in t for t in grads), grads


def test_backward_passes_below_one_are_refused_before_horovod_starts(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(LAUNCH / "train_horovod.py"), "--backward-passes", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "--backward-passes 0: need >= 1. Fix: e.g. 2." in proc.stderr, proc.stderr[-2000:]


def test_a_hand_typed_horovodrun_streams_every_rank_to_the_notebook(horovodrun, data_env, tmp_path):
    sh = dkh.shell_launch("cell", runs_dir=tmp_path)
    script = LAUNCH / "train_horovod.py"
    # What the notebook's `!env {sh.env} horovodrun ...` cell runs, from a bare PATH.
    command = (
        f"env {sh.env} horovodrun -np 2 -H localhost:2 --gloo --timeline-filename "
        f"{sh.timeline} python {script} --steps-per-epoch 6 --epochs 1"
    )
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=400, env=env
    )
    stats = sh.finish()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(stats.workers) == ["rank-0", "rank-1"]
    assert all(w.records >= 6 and w.gaps == 0 for w in stats.workers.values()), stats
    assert sorted(sh.results()) == ["rank-0", "rank-1"]
    assert "ALLREDUCE" in dkh.load_timeline(sh.timeline).activities


def _mpi_built() -> bool:
    probe = "import horovod.tensorflow as hvd; print(hvd.mpi_built())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip().endswith("True")


def test_the_mpi_check_asks_the_pythons_own_horovod(horovodrun, tmp_path):
    assert plan.mpi_unavailable(sys.executable) == (None if _mpi_built() else (
        f"the Horovod of {sys.executable} was built without MPI"
    ))  # fmt: skip
    bare = tmp_path / "python"  # a Python whose import path has no Horovod
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    assert "could not import Horovod" in plan.mpi_unavailable(str(bare))


def test_horovodrun_mpi_when_horovod_is_built_with_mpi(horovodrun, tmp_path):
    if not _mpi_built():
        pytest.skip(
            "this Horovod was built without MPI (make ... HOROVOD_MPI=). To run this test: "
            "install openmpi-bin and libopenmpi-dev, then scripts/build-horovod.sh --mpi"
        )
    script = _write(tmp_path, "allreduce.py", _ALLREDUCE)
    # Idle, neither rank spins in MPI waiting for the other's cycle to start (the kit's Horovod
    # patch, edit 5). Unpatched, the rank whose cycle began first waits in the coordination's
    # MPI_Allreduce every cycle: 0.88 and 0.01 of a core at a 5 ms cycle on a quiet machine.
    # Patched, both wait only for the scheduler to wake the other, the same for both: 0.02-0.03
    # each when quiet, 0.18 each with one core kept busy (0.33 at Horovod's 1 ms cycle, whence
    # the 5 ms here).
    env = {"HOROVOD_CYCLE_TIME": "5"}
    proc = _horovodrun(horovodrun, script, str(tmp_path), "3", env=env, transport="--mpi")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    waiting = []
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert out["rank"] == rank and out["mpi"] is True, out
        assert out["worker"] == f"rank-{rank}"  # named from OpenMPI's rank variable
        assert all(v == [3] for k, v in out.items() if k.startswith("sum-"))
        waiting.append(out["waiting"])
    assert max(waiting) < 0.5 and abs(waiting[0] - waiting[1]) < 0.3, waiting
