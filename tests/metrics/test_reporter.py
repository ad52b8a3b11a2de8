"""The worker side: Reporter and the Keras callback, with real sockets and processes."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.metrics import Collector, Reporter, load_run


def _free_port() -> int:
    """A port nothing listens on (bound and released; nobody else takes it in time)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDLKIT_")}
    env.update(extra)
    return env


TOKEN = "t" * 32


def test_collector_down_never_blocks_and_the_file_keeps_everything(tmp_path):
    port = _free_port()
    reporter = Reporter("worker-0", tmp_path, collector=f"127.0.0.1:{port}", token=TOKEN)
    n = 5000
    start = time.perf_counter()
    for i in range(n):
        reporter.step(step=i + 1, loss=1.0 / (i + 1), batch_size=8)
    emit_seconds = time.perf_counter() - start
    start = time.perf_counter()
    stats = reporter.close(timeout=0.5)
    close_seconds = time.perf_counter() - start
    assert emit_seconds < 5.0, f"{n} records took {emit_seconds:.2f} s with the collector down"
    assert close_seconds < 2.0
    assert stats.written == n and stats.sent == 0 and stats.dropped == n
    assert "cannot connect" in stats.last_error
    records = load_run(tmp_path)
    assert [r.seq for r in records] == list(range(n))
    assert records[-1].loss == 1.0 / n


def test_a_collector_that_comes_up_late_gets_the_records(tmp_path):
    port = _free_port()
    reporter = Reporter("worker-0", tmp_path, collector=f"127.0.0.1:{port}", token=TOKEN)
    for i in range(20):
        reporter.step(step=i + 1, loss=0.5)
    assert _wait(lambda: reporter.stats().last_error is not None)
    assert not reporter.flush(5.0)  # returns at once: nobody listens
    with Collector(tmp_path, port=port, token=TOKEN) as collector:
        for i in range(20, 40):
            reporter.step(step=i + 1, loss=0.25)
        assert _wait(lambda: collector.version == 40)
        assert reporter.flush(5.0)
        assert [r.seq for r in collector.records("worker-0")] == list(range(40))
        assert collector.stats().gaps == 0
    reporter.close()


def test_a_full_queue_drops_oldest_and_the_collector_sees_the_gap(tmp_path):
    port = _free_port()
    reporter = Reporter(
        "worker-0", tmp_path, collector=f"127.0.0.1:{port}", token=TOKEN, queue_size=10
    )
    for i in range(30):
        reporter.step(step=i + 1)
    assert reporter.stats().dropped == 20 and reporter.stats().queued == 10
    with Collector(port=port, token=TOKEN) as collector:
        reporter.step(step=31)  # pushes out one more: seq 21..30 are queued
        assert _wait(lambda: collector.version == 10)
        assert [r.seq for r in collector.records()] == list(range(21, 31))
        assert collector.stats().gaps == 21  # seq 0..20 never arrived: visible, not silent
        assert reporter.stats().dropped == 21
    reporter.close()
    assert len(load_run(tmp_path)) == 31


def test_a_collector_that_never_answers_does_not_stall_close(tmp_path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # connections complete, but nobody ever answers the hello
    try:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        reporter = Reporter("worker-0", tmp_path, collector=address, token=TOKEN)
        start = time.perf_counter()
        for i in range(1000):
            reporter.step(step=i + 1)
        assert time.perf_counter() - start < 3.0
        start = time.perf_counter()
        stats = reporter.close(timeout=0.5)
        assert time.perf_counter() - start < 4.0
        assert stats.sent == 0
        assert len(load_run(tmp_path)) == 1000
    finally:
        silent.close()


def test_reporter_reads_the_launcher_environment(tmp_path):
    with Collector(tmp_path) as collector:
        env = {**collector.env(), "DDLKIT_WORKER": "rank-1"}
        with Reporter(environ=env) as reporter:
            assert reporter.worker == "rank-1"
            assert reporter.path == tmp_path / "metrics" / "rank-1.jsonl"
            reporter.event("train_begin", epochs=1, steps=2)
        assert _wait(lambda: collector.version == 1)
        assert collector.records()[0].info == {"epochs": 1, "steps": 2}


def test_bad_environment_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no token.*Fix"):
        Reporter(environ={"DDLKIT_COLLECTOR": "127.0.0.1:1", "DDLKIT_RUN_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="not host:port"):
        Reporter(run_dir=tmp_path, collector="localhost", token=TOKEN)
    with pytest.raises(DdlkitError, match="cannot name a metrics file"):
        Reporter("../x", tmp_path)
    assert not (tmp_path / "metrics").exists() or not any((tmp_path / "metrics").iterdir())


def test_plain_python_without_ddlkit_writes_a_local_run(tmp_path):
    script = (
        "from ddlkit.metrics import Reporter\n"
        "r = Reporter()\n"
        "r.step(step=1, loss=0.5, batch_size=4)\n"
        "r.close()\n"
    )
    runs = tmp_path / "runs"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=_clean_env(DDLKIT_RUNS=str(runs)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (run_dir,) = runs.iterdir()
    assert re.fullmatch(r"local-\d{8}-\d{6}-\d+", run_dir.name)
    assert f"writing 'local' metrics to {run_dir / 'metrics' / 'local.jsonl'}" in out
    (record,) = load_run(run_dir)
    assert record.worker == "local" and record.loss == 0.5


def test_timing_throughput_and_epoch_summary(tmp_path):
    with Reporter("worker-0", tmp_path) as reporter:
        reporter.event("train_begin", epochs=1)
        time.sleep(0.05)
        first = reporter.step(step=1, batch_size=10)
        time.sleep(0.05)
        second = reporter.step(step=3, batch_size=10, steps=2)
        given = reporter.step(step=4, batch_size=10, step_time=0.5)
        epoch = reporter.epoch(epoch=0, step=4, loss=0.1)
    assert 0.04 < first.step_time < 0.5
    assert math.isclose(first.examples_per_sec, 10 / first.step_time)
    assert 0.02 < second.step_time < 0.25  # 50 ms over 2 steps
    assert given.step_time == 0.5 and given.examples_per_sec == 20.0
    assert epoch.step_time == pytest.approx(epoch.metrics["epoch_time"] / 4)
    assert epoch.examples_per_sec == pytest.approx(40 / epoch.metrics["epoch_time"])
    with pytest.raises(ConfigError, match="batch_size"):
        Reporter("worker-1", tmp_path).step(step=1, batch_size=0)
    with pytest.raises(DdlkitError, match="is closed"):
        reporter.step(step=5)


def test_sink_gets_records_and_a_failing_sink_does_not_stop_training(tmp_path):
    got = []
    with Reporter("worker-0", tmp_path, sink=got.append) as reporter:
        reporter.step(step=1, loss=1.0)

        class Broken:
            def add(self, record):
                raise RuntimeError("display gone")

        reporter.sink = Broken()
        with pytest.warns(RuntimeWarning, match="display gone"):
            reporter.step(step=2)
        reporter.step(step=3)  # warned once, still reporting
    assert [r.step for r in got] == [1]
    assert [r.step for r in load_run(tmp_path)] == [1, 2, 3]


def test_a_restarted_worker_continues_its_seq(tmp_path):
    with Reporter("worker-0", tmp_path) as first:
        first.step(step=1)
        first.step(step=2)
    with Reporter("worker-0", tmp_path) as second:
        assert second.step(step=3).seq == 2
    assert [r.seq for r in load_run(tmp_path)] == [0, 1, 2]


KERAS_SCRIPT = """
import json, sys
import numpy as np
import ddlkit as dk
from ddlkit import backend

keras = backend.keras()
rng = np.random.default_rng(0)
x = rng.random((96, 6), dtype=np.float32)
y = (x.sum(axis=1) > 3).astype("int64")
model = keras.Sequential([
    keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
    keras.layers.Dense(2, activation="softmax"),
])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
callbacks = [
    dk.metrics.KerasReporter(batch_size=16, worker="every-1"),
    dk.metrics.KerasReporter(batch_size=16, every=2, worker="every-2"),
    dk.metrics.KerasReporter(batch_size=16, every=0, worker="every-0"),
]
model.fit(x, y, epochs=2, batch_size=16, validation_split=0.25, verbose=0, callbacks=callbacks)
# a second fit with the first callback: its steps keep counting
model.fit(x, y, epochs=1, batch_size=16, validation_split=0.25, verbose=0, callbacks=callbacks[:1])
# an evaluate of its own (not fit's validation) is reported as one `evaluate` event
evaluated = model.evaluate(x, y, batch_size=32, verbose=0, callbacks=callbacks[:1])
for cb in callbacks:
    cb.close()
print(json.dumps({
    "flavour": backend.active_flavour(),
    "batch_hooks": [cb._implements_train_batch_hooks() for cb in callbacks],
    "is_callback": all(isinstance(cb, keras.callbacks.Callback) for cb in callbacks),
    "evaluated": [float(v) for v in evaluated],
}))
"""


def _run_keras(tmp_path: Path, keras_choice: str) -> dict:
    with Collector(tmp_path) as collector:
        proc = subprocess.run(
            [sys.executable, "-c", KERAS_SCRIPT],
            env=_clean_env(DDLKIT_KERAS=keras_choice, **collector.env()),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        on_disk = load_run(tmp_path)
        assert _wait(lambda: collector.version == len(on_disk))
        assert sorted(collector.records(), key=lambda r: (r.worker, r.seq)) == on_disk
    return {"result": result, "records": on_disk}


def _check_keras_records(
    records, evaluated: list[float], steps_per_epoch: int = 5, epochs: int = 2
) -> None:
    evaluations = [r for r in records if r.name == "evaluate"]
    assert [r.worker for r in evaluations] == ["every-1"]  # fit's validation is not one
    info = evaluations[0].info
    assert [info["loss"], info["accuracy"]] == pytest.approx(evaluated)
    assert info["steps"] == 3  # 96 examples in batches of 32
    begins = [r for r in records if r.name == "train_begin"]
    assert {r.info["replicas"] for r in begins} == {1}
    records = [r for r in records if r.name != "evaluate"]
    by_worker = {
        w: [r for r in records if r.worker == w] for w in ("every-1", "every-2", "every-0")
    }
    every1 = by_worker["every-1"]
    first_end = next(i for i, r in enumerate(every1) if r.name == "train_end")
    by_worker["every-1"], second_fit = every1[: first_end + 1], every1[first_end + 1 :]
    assert second_fit[0].name == "train_begin" and second_fit[0].info["initial_step"] == 10
    assert [r.step for r in second_fit if r.kind == "step"] == [11, 12, 13, 14, 15]
    assert [r.seq for r in second_fit] == list(range(first_end + 1, len(every1)))
    for mine in by_worker.values():
        assert [r.seq for r in mine] == list(range(len(mine)))
        assert [r.wall_time for r in mine] == sorted(r.wall_time for r in mine)
        begin, end = mine[0], mine[-1]
        assert begin.name == "train_begin"
        assert begin.info["epochs"] == epochs and begin.info["steps"] == steps_per_epoch
        assert begin.info["initial_step"] == 0
        assert end.name == "train_end" and end.info["steps"] == epochs * steps_per_epoch
        ends = [r for r in mine if r.kind == "epoch"]
        assert [r.epoch for r in ends] == list(range(epochs))
        assert [r.step for r in ends] == [steps_per_epoch * (e + 1) for e in range(epochs)]
        for r in ends:
            assert 0 < r.loss < 10 and 0 <= r.accuracy <= 1
            assert r.examples_per_sec > 0 and r.step_time > 0
            assert {"val_loss", "val_accuracy", "epoch_time"} <= set(r.metrics)
    steps = [r for r in by_worker["every-1"] if r.kind == "step"]
    assert [r.step for r in steps] == list(range(1, epochs * steps_per_epoch + 1))
    assert [r.epoch for r in steps] == [s // steps_per_epoch for s in range(len(steps))]
    for r in steps:
        assert 0 < r.loss < 10 and 0 <= r.accuracy <= 1
        assert r.step_time > 0 and r.examples_per_sec == pytest.approx(16 / r.step_time)
    every2 = [r.step for r in by_worker["every-2"] if r.kind == "step"]
    assert every2 == [2, 4, 7, 9]  # every second step of each epoch (5 steps per epoch)
    assert not [r for r in by_worker["every-0"] if r.kind == "step"]


@pytest.mark.slow
def test_keras_reporter_under_tf_keras(tmp_path):
    run = _run_keras(tmp_path, "2")
    evaluated = run["result"].pop("evaluated")
    assert run["result"] == {
        "flavour": "tf-keras",
        "batch_hooks": [True, True, False],
        "is_callback": True,
    }
    _check_keras_records(run["records"], evaluated)


@pytest.mark.slow
def test_keras_reporter_under_keras_3(tmp_path):
    run = _run_keras(tmp_path, "3")
    assert run["result"]["flavour"] == "keras3" and run["result"]["is_callback"]
    _check_keras_records(run["records"], run["result"]["evaluated"])


def test_importing_metrics_does_not_import_tensorflow():
    code = (
        "import sys, ddlkit.metrics as m\n"
        "m.Reporter, m.Collector, m.Record, m.load_run\n"
        "heavy = [k for k in ('tensorflow', 'matplotlib', 'ipywidgets') if k in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[]"


def test_train_begin_replicas_count_horovod_ranks(monkeypatch):
    import types

    from ddlkit.metrics.keras_callback import _replicas

    model = types.SimpleNamespace(distribute_strategy=types.SimpleNamespace(num_replicas_in_sync=1))
    assert _replicas(model) == 1
    hvd = types.SimpleNamespace(is_initialized=lambda: True, size=lambda: 4)
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", hvd)
    assert _replicas(model) == 4  # each rank trains one replica of a 4-rank job
    hvd.is_initialized = lambda: False
    assert _replicas(model) == 1
    assert _replicas(object()) is None
