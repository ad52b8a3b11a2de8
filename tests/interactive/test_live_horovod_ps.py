"""Horovod over the kit's MPI build in live workers, a parameter-server coordinator in this
test process, and no process left when the process that made the workers is killed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from harness.live import run_pids
from harness.procutil import wait_until

import ddlkit as dk
from ddlkit.interactive import WorkerDiedError
from ddlkit.strategies.horovod import mpi_unavailable

pytestmark = pytest.mark.slow


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_horovod_collectives_over_mpi_show_each_ranks_result(runs, capsys):
    why = mpi_unavailable(sys.executable)
    assert why is None, why  # make test builds Horovod with MPI (scripts/build-horovod.sh --mpi)
    with dk.workers(2, strategy="horovod") as workers:
        assert workers.names == ("rank-0", "rank-1")
        workers.run_cell(
            "import horovod.tensorflow as hvd\nimport tensorflow as tf\nhvd.init()\n"
            "print('mpi', hvd.mpi_enabled(), hvd.rank(), hvd.size())\n"
            "print('sum', hvd.allreduce(tf.constant(1.0 + hvd.rank()), op=hvd.Sum).numpy())\n"
            "print('gather', hvd.allgather(tf.constant([hvd.rank()])).numpy().tolist())"
        )
        out, err = capsys.readouterr()
        assert not re.search(r"^\[rank-\d\] I\d{4} ", out + err, re.M), err  # C++ start-up lines
        assert "absl::InitializeLog" not in out + err
        for rank in (0, 1):
            assert f"[rank-{rank}] mpi True {rank} 2" in out
            assert f"[rank-{rank}] sum 3.0" in out and f"[rank-{rank}] gather [0, 1]" in out
        assert workers.tail("rank-1").startswith("(last lines of horovodrun's log)")
        workers.kill("rank-1")
        with pytest.raises(WorkerDiedError) as err:
            workers.run_cell("print(1)")
        said = str(err.value)
        assert "rank-1 (SIGKILL sent by workers.kill) died" in said
        assert "horovodrun" in said and "exited" in said
        run_dir = workers.run_dir
    assert wait_until(lambda: not run_pids(run_dir), 10), run_pids(run_dir)


def test_a_parameter_server_coordinator_here_schedules_on_worker_servers(runs):
    import tensorflow as tf

    before = os.environ.get("TF_CONFIG")
    with dk.workers(2, strategy="parameter_server") as workers:
        assert workers.names == ("ps-0", "worker-0", "worker-1")
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.task_type == "chief"
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            v = tf.Variable(0.0)
        assert v.device == "/job:ps/replica:0/task:0/device:CPU:0"

        @tf.function
        def step():
            v.assign_add(1.0)
            return tf.constant(1)

        for _ in range(6):
            coordinator.schedule(step)
        coordinator.join()
        assert float(v.numpy()) == 6.0
        run_dir = workers.run_dir
    assert os.environ.get("TF_CONFIG") == before
    assert wait_until(lambda: not run_pids(run_dir), 10), run_pids(run_dir)


KERNEL = textwrap.dedent(
    """
    import os, sys, ddlkit as dk
    w = dk.workers(2, strategy="multi_worker")
    print(w.run_dir, flush=True)
    sys.stdin.read()
    """
)


def test_killing_the_process_that_made_the_workers_leaves_no_process(runs):
    """A kernel killed outright (SIGKILL: no atexit) takes its workers and controller along."""
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DDLKIT_RUNS": str(runs)},
    )
    run_dir = kernel.stdout.readline().strip()
    assert run_dir, "the workers did not start"
    assert len(run_pids(run_dir)) >= 3
    kernel.send_signal(signal.SIGKILL)
    kernel.wait(timeout=10)
    assert wait_until(lambda: not run_pids(run_dir), 15), run_pids(run_dir)
