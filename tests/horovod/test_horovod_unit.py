"""ddlkit.horovod without horovodrun: rank naming, the launcher watch, metric averaging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from harness.procutil import alive, wait_until

import ddlkit.horovod as dkh
from ddlkit.errors import ConfigError
from ddlkit.horovod import ranks
from ddlkit.horovod.callbacks import average_logs, metric_names_code


def test_rank_env_names_the_rank_from_horovod_rank():
    assert dkh.rank_env({"HOROVOD_RANK": "1", "DDLKIT_WORKER": "horovodrun"}) == {
        "DDLKIT_WORKER": "rank-1"
    }
    assert dkh.rank_env({"DDLKIT_WORKER": "worker-0"}) == {}
    assert dkh.rank_of({}) is None
    assert dkh.rank_of({"OMPI_COMM_WORLD_RANK": "3"}) == 3  # horovodrun --mpi (OpenMPI)


def test_a_bad_horovod_rank_is_one_clear_error():
    with pytest.raises(ConfigError, match="HOROVOD_RANK='x'.*Fix"):
        dkh.rank_of({"HOROVOD_RANK": "x"})


def test_is_launcher_knows_both_ways_horovodrun_runs():
    assert ranks.is_launcher(["/venv/bin/horovodrun", "-np", "2"])
    assert ranks.is_launcher(["/usr/bin/python3", "/venv/bin/horovodrun", "-np", "2"])
    assert not ranks.is_launcher(["python", "train.py", "horovodrun"])
    assert not ranks.is_launcher([])


def _two_ranks(other_logs):
    """A stand-in allreduce: the mean with another rank that logged ``other_logs``."""
    calls = []

    def allreduce(values):
        calls.append(list(values))
        other = [float(other_logs[k]) for k in sorted(other_logs)]
        other.append(metric_names_code(sorted(other_logs)))
        assert len(other) == len(values), "different shapes: Horovod itself refuses these"
        return [(a + b) / 2 for a, b in zip(values, other, strict=True)]

    return allreduce, calls


def test_average_logs_sends_every_number_once_in_key_order():
    allreduce, calls = _two_ranks({"loss": 2.0, "accuracy": 0.0})
    out = average_logs({"loss": 4.0, "accuracy": 1, "name": "x", "lr": None}, allreduce)
    assert calls == [[1.0, 4.0, metric_names_code(["accuracy", "loss"])]]  # sorted keys
    assert out == {"accuracy": 0.5, "loss": 3.0}
    assert average_logs({}, allreduce) == {} and len(calls) == 1


def test_average_logs_refuses_ranks_that_logged_different_metrics():
    allreduce, _ = _two_ranks({"loss": 2.0, "val_loss": 0.0})
    with pytest.raises(ConfigError, match="different metrics.*accuracy, loss.*Fix"):
        average_logs({"loss": 4.0, "accuracy": 1.0}, allreduce)


def test_metric_average_callback_updates_the_logs_later_callbacks_see():
    allreduce, _ = _two_ranks({"loss": 3.0, "accuracy": 0.5})
    callback = dkh.MetricAverageCallback(allreduce=allreduce)
    logs = {"loss": 1.0, "accuracy": 1.5}
    callback.on_epoch_end(0, logs)
    assert logs == {"loss": 2.0, "accuracy": 1.0} and callback.last == logs


def test_tf_variables_pass_tf_keras_variables_through_and_refuse_tensors():
    import tensorflow as tf

    v = tf.Variable(1.0)
    assert dkh.tf_variables([v])[0] is v
    with pytest.raises(ConfigError, match="neither a tf.Variable"):
        dkh.tf_variables([tf.constant(1.0)])


def test_require_names_the_build_script_when_horovod_is_missing(monkeypatch):
    from ddlkit.horovod import runtime

    monkeypatch.setattr(runtime, "available", lambda: False)
    with pytest.raises(dkh.HorovodMissingError, match="scripts/build-horovod.sh"):
        runtime.require()


# A stand-in launcher named horovodrun: it starts one rank that arms ddlkit's launcher
# watch and prints the launcher pid it found and its own pid, then sleeps.
_RANK = textwrap.dedent(
    """
    import os, sys, time
    from ddlkit.horovod import ranks
    os.environ["HOROVOD_RANK"] = "1"
    name = ranks.setup_rank()
    print(ranks.find_launcher(), os.getpid(), name, flush=True)
    time.sleep(120)
    """
)
_LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    # through a shell, as Horovod's middleman starts ranks
    subprocess.Popen(["/bin/sh", "-c", sys.argv[1] + " -c '" + sys.argv[2] + "'; true"])
    time.sleep(120)
    """
)


@pytest.fixture
def fake_launcher(tmp_path):
    launcher = tmp_path / "horovodrun"
    launcher.write_text(_LAUNCHER)
    proc = subprocess.Popen(
        [sys.executable, str(launcher), sys.executable, _RANK],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_a_rank_finds_its_launcher_and_dies_when_it_is_killed(fake_launcher):
    line = fake_launcher.stdout.readline().split()
    assert line, "the rank printed nothing"
    launcher_pid, rank_pid, name = int(line[0]), int(line[1]), line[2]
    assert launcher_pid == fake_launcher.pid
    assert name == "rank-1"
    shell = ranks._parent(rank_pid)
    assert alive(rank_pid) and alive(shell)
    os.kill(fake_launcher.pid, signal.SIGKILL)  # only the launcher: the shell lives on
    assert wait_until(lambda: not alive(rank_pid), timeout=10), "the rank outlived horovodrun"


def test_a_rank_dies_with_its_parent_process(fake_launcher):
    rank_pid = int(fake_launcher.stdout.readline().split()[1])
    shell = ranks._parent(rank_pid)
    os.kill(shell, signal.SIGKILL)  # the parent-death signal, the launcher still alive
    assert wait_until(lambda: not alive(rank_pid), timeout=10), "the rank outlived its parent"
    assert alive(fake_launcher.pid)


def test_allreduce_timing_fit_recovers_latency_and_bandwidth():
    from ddlkit.horovod.timing import AllreducePoint, AllreduceTiming

    latency, bandwidth = 2e-4, 1e9
    points = tuple(
        AllreducePoint(n, latency + n / bandwidth, latency, latency + 2 * n / bandwidth)
        for n in (1024, 65536, 1 << 20, 1 << 24)
    )
    timing = AllreduceTiming(ranks=2, points=points, repeats=5)
    fitted_latency, fitted_bandwidth = timing.fit()
    assert fitted_latency == pytest.approx(latency, rel=1e-6)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert AllreduceTiming.from_dict(timing.to_dict()) == timing
    html = timing._repr_html_()
    assert "16 MiB" in html and "latency 200 us" in html and "1.00 GB/s" in html
    assert "sharing the cores" in html
    # pinned ranks: where each ran is kept through the file and named in the caption
    pinned = AllreduceTiming(ranks=2, points=points, repeats=5, rank_cpus=((0,), (1,)))
    assert pinned.to_dict()["rank_cpus"] == [[0], [1]]
    assert AllreduceTiming.from_dict(pinned.to_dict()) == pinned
    assert "cores 0 | 1" in pinned._repr_html_()


def test_allreduce_timing_refuses_bad_sizes_before_starting_anything():
    from ddlkit.horovod.timing import allreduce_timing

    with pytest.raises(ConfigError, match="byte counts"):
        allreduce_timing([2, 4096])
    with pytest.raises(ConfigError, match="repeats"):
        allreduce_timing([4096], repeats=0)
    with pytest.raises(ConfigError, match="transport='nccl' is not one of auto, gloo, mpi"):
        allreduce_timing([4096], transport="nccl")


_TRACE = """[
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_dense"}},
{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": 100, "pid": 1, "tid": 1},
{"name": "NEGOTIATE_ALLREDUCE", "ph": "E", "ts": 150, "pid": 1, "tid": 1},
{"name": "ALLREDUCE", "ph": "B", "ts": 150, "pid": 1, "tid": 1},
{"name": "GLOO_ALLREDUCE", "ph": "B", "ts": 160, "pid": 1, "tid": 1},
{"name": "GLOO_ALLREDUCE", "ph": "E", "ts": 190, "pid": 1, "tid": 1},
{"name": "ALLREDUCE", "ph": "E", "ts": 200, "pid": 1, "tid": 1},
{"name": "ALLREDUCE", "ph": "B", "ts": 300, "pid": 1, "tid": 1},
"""


def test_timeline_reads_an_unterminated_trace_and_pairs_begin_with_end(tmp_path):
    from ddlkit.horovod.timeline import load_timeline

    path = tmp_path / "timeline.json"
    path.write_text(_TRACE + '{"name": "ALLREDUCE", "ph": "E", "ts": 3')  # cut mid-line
    timeline = load_timeline(path)
    assert [(s.name, s.start, s.end, s.depth) for s in timeline.spans] == [
        ("NEGOTIATE_ALLREDUCE", 100, 150, 0),
        ("ALLREDUCE", 150, 200, 0),
        ("GLOO_ALLREDUCE", 160, 190, 1),
    ]
    assert timeline.tensors == ["grad_dense"]
    assert timeline.totals()["ALLREDUCE"] == (1, 0.05)
    import matplotlib

    matplotlib.use("Agg")
    ax = timeline.plot(last_ms=0.045)  # the spans that end in the last 45 us: 160..200
    assert ax.get_xlim() == pytest.approx((0.055, 0.1))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["grad_dense"]
    with pytest.raises(ConfigError, match="--timeline-filename"):
        load_timeline(tmp_path / "missing.json")


def test_warmup_lr_ramps_from_one_rank_rate_to_the_scaled_rate():
    assert dkh.warmup_lr(0.0, 0.4, size=4, warmup_epochs=2) == pytest.approx(0.1)
    assert dkh.warmup_lr(1.0, 0.4, size=4, warmup_epochs=2) == pytest.approx(0.25)
    assert dkh.warmup_lr(2.0, 0.4, size=4, warmup_epochs=2) == pytest.approx(0.4)
    assert dkh.warmup_lr(5.0, 0.4, size=4, warmup_epochs=2) == 0.4
    assert dkh.warmup_lr(0.0, 0.4, size=4, warmup_epochs=0) == 0.4


def test_warmup_callback_sets_the_rate_of_a_real_fit():
    import numpy as np

    from ddlkit import models

    model = models.compile_classifier(models.mnist_cnn(seed=0), 0.01)
    warmup = dkh.LearningRateWarmupCallback(0.02, warmup_epochs=1, steps_per_epoch=4, size=2)
    x = np.zeros((16, 28, 28, 1), np.float32)
    history = model.fit(x, np.zeros(16), batch_size=4, epochs=2, verbose=0, callbacks=[warmup])
    assert warmup.history == pytest.approx([0.01, 0.0125, 0.015, 0.0175])
    assert history.history["lr"] == pytest.approx([0.02, 0.02])
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        dkh.LearningRateWarmupCallback(0.02, steps_per_epoch=0, size=2)


def _fit_with(optimizer, *callbacks) -> None:
    """Four batches of a tiny model through ``callbacks`` (tf-keras, or Keras 3)."""
    import numpy as np

    from ddlkit import backend

    keras = backend.keras()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    x, y = np.zeros((16, 4), np.float32), np.zeros((16, 2), np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=list(callbacks))


# the rates of a one-epoch warm-up to 0.02 over 2 ranks, 4 batches; the optimizer starts at 0.02
_RATES = [0.01, 0.0125, 0.015, 0.0175]


@pytest.mark.parametrize("legacy", [False, True], ids=["momentum-variable", "legacy-sgd"])
def test_warmup_corrects_the_momentum_of_each_warmup_batch_and_restores_it(legacy):
    import tensorflow as tf

    from ddlkit import backend

    keras = backend.keras()
    if legacy:
        optimizer = keras.optimizers.legacy.SGD(0.02, momentum=0.9)
    else:
        optimizer = keras.optimizers.SGD(0.02, momentum=tf.Variable(0.9))
    seen = []
    probe = keras.callbacks.LambdaCallback(  # runs after the warm-up's batch begin
        on_train_batch_begin=lambda batch, logs: seen.append(float(tf.identity(optimizer.momentum)))
    )
    warmup = dkh.LearningRateWarmupCallback(0.02, warmup_epochs=1, steps_per_epoch=4, size=2)
    _fit_with(optimizer, warmup, probe)
    assert warmup.history == pytest.approx(_RATES)
    old = [0.02, *_RATES[:-1]]
    assert seen == pytest.approx(
        [0.9 * new / was for new, was in zip(_RATES, old, strict=True)], rel=1e-6
    )
    assert float(tf.identity(optimizer.momentum)) == pytest.approx(0.9)  # restored


def test_warmup_refuses_a_momentum_it_cannot_correct_and_says_how_to_go_on():
    from ddlkit import backend

    keras = backend.keras()
    warmup = dkh.LearningRateWarmupCallback(0.02, warmup_epochs=1, steps_per_epoch=4, size=2)
    with pytest.raises(ConfigError, match="momentum_correction=False"):
        _fit_with(keras.optimizers.SGD(0.02, momentum=0.9), warmup)  # a float: read when traced
    plain = dkh.LearningRateWarmupCallback(
        0.02, warmup_epochs=1, steps_per_epoch=4, size=2, momentum_correction=False
    )
    _fit_with(keras.optimizers.SGD(0.02, momentum=0.9), plain)
    assert plain.history == pytest.approx(_RATES)
    adam = dkh.LearningRateWarmupCallback(0.02, warmup_epochs=1, steps_per_epoch=4, size=2)
    _fit_with(keras.optimizers.Adam(0.02), adam)  # no momentum: nothing to correct
    assert adam.history == pytest.approx(_RATES)


def test_rank_cpus_gives_each_local_rank_its_own_cores_and_the_env_to_pass():
    from ddlkit.horovod import pinning

    assert pinning.rank_cpus((0, 1), 2) == [(0,), (1,)]
    assert pinning.rank_cpus((4, 5, 6, 7), 2) == [(4, 5), (6, 7)]
    env = pinning.rank_cpus_env((0, 1, 2, 3), 2)
    assert env["DDLKIT_RANK_CPUS"] == "0,1;2,3"
    assert env["TF_NUM_INTRAOP_THREADS"] == "2" and env["OMP_NUM_THREADS"] == "2"
    assert pinning.parse_rank_cpus(env["DDLKIT_RANK_CPUS"]) == [(0, 1), (2, 3)]
    with pytest.raises(ConfigError, match="only 1 core"):
        pinning.rank_cpus((0,), 2)


def test_cpus_for_rank_reads_the_local_rank_and_refuses_bad_lists():
    from ddlkit.horovod import pinning

    assert pinning.cpus_for_rank({"DDLKIT_RANK_CPUS": "0;1", "HOROVOD_LOCAL_RANK": "1"}) == (1,)
    assert pinning.cpus_for_rank({"HOROVOD_LOCAL_RANK": "1"}) is None  # nothing asked
    assert pinning.cpus_for_rank({"DDLKIT_RANK_CPUS": "0;1"}) is None  # not under horovodrun
    with pytest.raises(ConfigError, match="local rank 2 has no cores"):
        pinning.cpus_for_rank({"DDLKIT_RANK_CPUS": "0;1", "HOROVOD_LOCAL_RANK": "2"})
    with pytest.raises(ConfigError, match="not a core list"):
        pinning.parse_rank_cpus("0;x")
    with pytest.raises(ConfigError, match="not a core list"):
        pinning.parse_rank_cpus("0;;1")


def test_pin_rank_refuses_cores_this_process_may_not_use():
    from ddlkit.horovod import pinning

    env = {"DDLKIT_RANK_CPUS": "0;4096", "HOROVOD_LOCAL_RANK": "1"}
    before = os.sched_getaffinity(0)
    with pytest.raises(ConfigError, match=r"\[4096\] are not available"):
        pinning.pin_rank(env)
    assert os.sched_getaffinity(0) == before and "TF_NUM_INTRAOP_THREADS" not in env


def test_idle_priority_moves_the_threads_it_is_given_and_skips_ended_ones():
    import threading

    from ddlkit.horovod import pinning

    stop = threading.Event()
    waiter = threading.Thread(target=stop.wait)
    waiter.start()
    try:
        ended = threading.Thread(target=lambda: None)
        ended.start()
        ended.join()  # the kernel lets its thread go a moment after
        assert wait_until(lambda: ended.native_id not in pinning.thread_ids(), timeout=10)
        assert waiter.native_id in pinning.thread_ids()
        moved = pinning.idle_priority([waiter.native_id, ended.native_id])
        assert moved == [waiter.native_id]
        assert os.sched_getscheduler(waiter.native_id) == os.SCHED_IDLE
        assert os.sched_getscheduler(threading.get_native_id()) != os.SCHED_IDLE  # caller kept
    finally:
        stop.set()
        waiter.join()


def test_timeline_per_step_counts_overlapping_tensors_once_and_skips_warmup():
    from ddlkit.horovod.timeline import Span, Timeline

    spans = []
    for step in range(4):  # a step every 1000 us; two tensors reduced in overlapping spans
        t0 = step * 1000
        spans.append(Span("grad_a", "ALLREDUCE", t0 + 100, t0 + 300, 0))
        spans.append(Span("grad_b", "ALLREDUCE", t0 + 200, t0 + 400 + 100 * step, 0))
        spans.append(Span("grad_a", "NEGOTIATE_ALLREDUCE", t0, t0 + 100, 0))
    timeline = Timeline("t.json", tuple(sorted(spans, key=lambda s: s.start)))
    # steps 2..4 (skip 1): unions of 400, 500 and 600 us -> 0.5 ms a step
    assert timeline.per_step("ALLREDUCE", skip=1) == (pytest.approx(0.5), 3)
    assert timeline.per_step("ALLREDUCE") == (pytest.approx(0.45), 4)
    assert timeline.per_step("NEGOTIATE_ALLREDUCE", skip=2) == (pytest.approx(0.1), 2)
    assert timeline.per_step("ALLREDUCE", skip=4) == (0.0, 0)
    assert timeline.per_step("BROADCAST") == (0.0, 0)


class _FakeGPU:
    """Stands in for tf.config.PhysicalDevice (only its name is read)."""

    def __init__(self, index: int) -> None:
        self.name = f"/physical_device:GPU:{index}"
        self.device_type = "GPU"


class _FakeConfig:
    """tf.config's three GPU calls, recorded; `started` plays TensorFlow's started runtime."""

    def __init__(self, gpus, started: bool = False) -> None:
        self.gpus, self.started, self.calls = list(gpus), started, []
        self.experimental = self

    def list_physical_devices(self, kind):
        assert kind == "GPU"
        return self.gpus

    def set_memory_growth(self, gpu, enable):
        self.calls.append(("memory_growth", gpu.name, enable))

    def set_visible_devices(self, devices, kind):
        if self.started:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.calls.append(("visible", devices.name, kind))


def test_gpu_for_rank_picks_gpus_local_rank():
    gpus = [_FakeGPU(i) for i in range(4)]
    assert [dkh.gpu_for_rank(gpus, r, 4) for r in range(4)] == gpus
    assert dkh.gpu_for_rank(gpus, 1, 2) is gpus[1]  # 2 ranks on a 4-GPU host: GPUs 0 and 1
    assert dkh.gpu_for_rank(gpus, 1) is gpus[1]  # local_size unknown


def test_gpu_for_rank_without_gpus_changes_nothing():
    assert dkh.gpu_for_rank([], 0, 2) is None
    assert dkh.gpu_for_rank([], 1, 2) is None
    config = _FakeConfig([])
    assert dkh.pin_gpu(1, 2, config=config) is None and config.calls == []


def test_fewer_gpus_than_local_ranks_is_one_clear_error_in_every_rank():
    gpus = [_FakeGPU(0)]
    for rank in (0, 1):  # rank 0 has a GPU, but its neighbour has none: both stop
        with pytest.raises(ConfigError, match=r"2 Horovod ranks on this host but only 1 GPU") as e:
            dkh.gpu_for_rank(gpus, rank, 2)
        assert "GPU:0" in str(e.value) and "-H host:1" in str(e.value)
        assert "pin_gpu=False" in str(e.value)
    with pytest.raises(ConfigError, match="local rank 2 would have no GPU"):
        dkh.gpu_for_rank([_FakeGPU(0), _FakeGPU(1)], 2)  # local_size unknown
    with pytest.raises(ConfigError, match="not below local_size"):
        dkh.gpu_for_rank([_FakeGPU(0), _FakeGPU(1)], 2, 2)
    with pytest.raises(ConfigError, match="local_rank=-1"):
        dkh.gpu_for_rank([_FakeGPU(0)], -1)


def test_pin_gpu_grows_memory_on_every_gpu_and_shows_only_its_own():
    config = _FakeConfig([_FakeGPU(0), _FakeGPU(1)])
    chosen = dkh.pin_gpu(1, 2, config=config)
    assert chosen.name == "/physical_device:GPU:1"
    assert config.calls == [
        ("memory_growth", "/physical_device:GPU:0", True),
        ("memory_growth", "/physical_device:GPU:1", True),
        ("visible", "/physical_device:GPU:1", "GPU"),
    ]


def test_pin_gpu_after_tensorflow_started_names_the_fix():
    config = _FakeConfig([_FakeGPU(0), _FakeGPU(1)], started=True)
    with pytest.raises(ConfigError, match=r"before local rank 0 was pinned to .*GPU:0.*Fix: call"):
        dkh.pin_gpu(0, 2, config=config)


def test_pin_gpu_on_this_machines_tensorflow():
    """The real tf.config, in a fresh process: no GPU, nothing changes; else rank 0 sees GPU 0."""
    code = textwrap.dedent(
        """
        import tensorflow as tf
        import ddlkit.horovod as dkh
        gpus = tf.config.list_physical_devices("GPU")
        chosen = dkh.pin_gpu(0, 1)
        assert chosen == (gpus[0] if gpus else None), (chosen, gpus)
        assert tf.config.get_visible_devices("GPU") == gpus[:1]
        print("gpus", len(gpus))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("gpus "), out.stderr[-2000:]
