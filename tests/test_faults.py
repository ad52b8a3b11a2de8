"""ddlkit.lessons.faults: chief-only write dirs, waiting for backups, the resume point."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest
from harness.procutil import wait_until

from ddlkit.errors import ConfigError, DdlkitError, JobTimeoutError, WorkerFailedError
from ddlkit.launch import run as run_mod
from ddlkit.lessons import faults
from ddlkit.where import ThisMachine

# -- chief-only files --------------------------------------------------------------------------


WORKERS = {"worker": ["a:1", "b:1"]}
WITH_CHIEF = {"chief": ["c:1"], "worker": ["a:1", "b:1"]}
LAYOUTS = [
    (None, None, {}, True),
    ("worker", 0, WORKERS, True),
    ("worker", 1, WORKERS, False),
    ("chief", 0, WITH_CHIEF, True),
    ("worker", 0, WITH_CHIEF, False),  # a chief task exists: worker 0 is an ordinary worker
    ("worker", 1, WITH_CHIEF, False),
    ("ps", 0, {**WITH_CHIEF, "ps": ["p:1"]}, False),
    ("evaluator", 0, {**WORKERS, "evaluator": ["e:1"]}, True),  # runs alone, as TF says
]


@pytest.mark.parametrize(("task_type", "task_id", "cluster", "chief"), LAYOUTS)
def test_the_chief_is_the_chief_task_else_worker_0_if_there_is_none(
    task_type, task_id, cluster, chief
):
    assert faults.is_chief(task_type, task_id, cluster) is chief


@pytest.mark.slow
def test_the_chief_rule_is_tensorflows():
    from tensorflow.python.distribute import multi_worker_util

    from ddlkit import backend

    tf = backend.tf()
    for task_type, task_id, cluster, _ in LAYOUTS[1:]:
        spec = tf.train.ClusterSpec(cluster)
        theirs = multi_worker_util.is_chief(spec, task_type, task_id)
        assert faults.is_chief(task_type, task_id, spec) is theirs, (task_type, task_id, cluster)


def test_the_chief_rule_needs_the_cluster():
    with pytest.raises(ConfigError, match="cluster_spec"):
        faults.is_chief("worker", 0, ["a:1", "b:1"])


def test_the_chief_writes_the_real_dir_the_others_a_temp_dir_next_to_it(tmp_path):
    real = tmp_path / "ckpt"
    assert faults.write_dir(real, "worker", 0, WORKERS) == real
    assert faults.write_dir(str(real), "worker", 1, WORKERS) == tmp_path / "workertemp_1" / "ckpt"
    assert faults.write_dir(real, "chief", 0, WITH_CHIEF) == real
    assert faults.write_dir(real, "worker", 0, WITH_CHIEF) == tmp_path / "workertemp_0" / "ckpt"
    assert not (tmp_path / "workertemp_1").exists(), "write_dir only names the directory"


def test_a_non_chief_without_an_index_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="task_id"):
        faults.write_dir(tmp_path, "worker", None, WORKERS)


def test_remove_write_dir_deletes_only_the_non_chiefs_temp_dir(tmp_path):
    real = tmp_path / "ckpt"
    real.mkdir()
    (real / "chief-file").write_text("x")
    assert faults.remove_write_dir(real, "worker", 0, WORKERS) is None
    assert (real / "chief-file").exists(), "the chief's files stay"

    temp = faults.write_dir(real, "worker", 1, WORKERS)
    temp.mkdir(parents=True)
    (temp / "ckpt-1.index").write_text("x")
    assert faults.remove_write_dir(real, "worker", 1, WORKERS) == temp
    assert not (tmp_path / "workertemp_1").exists()
    assert (real / "chief-file").exists()


def test_remove_write_dir_keeps_the_tasks_other_temp_dirs(tmp_path):
    ckpt = faults.write_dir(tmp_path / "ckpt", "worker", 1, WORKERS)
    logs = faults.write_dir(tmp_path / "tb", "worker", 1, WORKERS)
    for d in (ckpt, logs):
        d.mkdir(parents=True)
        (d / "f").write_text("x")
    faults.remove_write_dir(tmp_path / "ckpt", "worker", 1, WORKERS)
    assert not ckpt.exists() and (logs / "f").exists()
    faults.remove_write_dir(tmp_path / "tb", "worker", 1, WORKERS)
    assert not (tmp_path / "workertemp_1").exists()


def test_shared_dirs_are_new_and_empty(tmp_path):
    a = faults.shared_dir("nb02", root=tmp_path)
    b = faults.shared_dir("nb02", root=tmp_path)
    assert a != b and a.parent == b.parent == tmp_path
    assert a.is_dir() and not list(a.iterdir()) and "nb02" in a.name


def test_list_files_shows_relative_paths_and_sizes(tmp_path):
    (tmp_path / "chief").mkdir()
    (tmp_path / "chief" / "ckpt-1.index").write_bytes(b"12345")
    (tmp_path / "checkpoint").write_bytes(b"")
    listing = faults.list_files(tmp_path)
    assert listing.files == (("checkpoint", 0), ("chief/ckpt-1.index", 5))
    assert listing.names == ["checkpoint", "chief/ckpt-1.index"]
    assert "chief/ckpt-1.index" in listing._repr_html_() and "2 file(s)" in repr(listing)
    missing = faults.list_files(tmp_path / "nope")
    assert missing.files == () and "does not exist" in repr(missing)


# -- waiting for backups in a real run ---------------------------------------------------------

# A worker that reports like a ResumeReporter, without TensorFlow:
# `--backups N` backup events 0.3 s apart, then `--then sleep|exit0|exit3`.
UNPINNED = ThisMachine(pin_cores=False)  # fake workers: no cores of their own
FAKE_WORKER = textwrap.dedent(
    """
    import argparse, os, sys, time
    from ddlkit.lessons import faults
    from ddlkit.metrics import Reporter

    p = argparse.ArgumentParser()
    p.add_argument("--backups", type=int, default=0)
    p.add_argument("--then", default="sleep")
    p.add_argument("--restored", type=int, default=-1)
    args = p.parse_args()
    chief = os.environ["DDLKIT_WORKER"] == "worker-0"
    r = Reporter()
    r.event(faults.RESUME_EVENT, initial_epoch=args.restored + 1, restored_epoch=args.restored)
    for epoch in range(args.backups):
        time.sleep(0.3)
        if chief:
            r.event(faults.BACKUP_EVENT, epoch=epoch, checkpoint=f"ckpt-{epoch + 1}")
    r.flush(5)
    if args.then == "sleep":
        time.sleep(600)
    sys.exit(3 if args.then == "exit3" else 0)
    """
)


@pytest.fixture
def start_fake(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    runs = []

    def start(*args: str, workers: int = 2):
        run = run_mod.start(
            script, workers=workers, args=args, runs_dir=tmp_path / "runs", where=UNPINNED
        )
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


def test_wait_for_backup_returns_once_the_chief_has_backed_up_the_epoch(start_fake):
    run = start_fake("--backups", "3")
    assert faults.wait_for_backup(run, epoch=1, timeout=60) == 1
    assert run.job.state == "running"
    assert faults.wait_for_backup(run, epoch=0, timeout=1) == 0, "an earlier epoch: at once"
    assert faults.wait_for_backup(run, epoch=2, timeout=60) == 2
    assert faults.backups(run) == [0, 1, 2]


def test_wait_for_backup_times_out_with_the_backups_seen_and_the_fix(start_fake):
    run = start_fake("--backups", "1")
    began = time.monotonic()
    with pytest.raises(JobTimeoutError) as err:
        faults.wait_for_backup(run, epoch=5, timeout=3)
    assert 3 <= time.monotonic() - began < 15
    message = str(err.value)
    assert "epoch 5" in message and "run.stop()" in message and "still running" in message
    assert run.job.state == "running", "a timeout leaves the workers alone"


def test_wait_for_backup_says_when_the_run_ended_without_the_backup(start_fake):
    run = start_fake("--backups", "1", "--then", "exit0")
    with pytest.raises(DdlkitError, match=r"ended \(finished\) without backing up epoch 3"):
        faults.wait_for_backup(run, epoch=3, timeout=60)


def test_wait_for_backup_raises_the_runs_failure(start_fake):
    run = start_fake("--then", "exit3")
    with pytest.raises(WorkerFailedError) as err:
        faults.wait_for_backup(run, epoch=0, timeout=60)
    assert err.value.exit_code == 3


def test_wait_for_backup_refuses_a_bad_epoch():
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="epoch"):
            faults.wait_for_backup(None, epoch=bad)


def test_resume_points_name_every_worker_live_and_from_the_files(start_fake):
    run = start_fake("--restored", "2")
    assert wait_until(lambda: len(run.records()) >= 2, timeout=60), "no resume events"
    live = faults.resume_points(run)  # while running: the collector's records
    assert [(p.worker, p.restored_epoch, p.initial_epoch, p.resumed) for p in live] == [
        ("worker-0", 2, 3, True),
        ("worker-1", 2, 3, True),
    ]
    assert "first epoch run" in live._repr_html_()
    run.stop()
    assert faults.resume_points(run) == live  # once ended: the JSONL files


def test_resume_points_of_a_run_without_the_event_is_a_clear_error(tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("print('no records')\n")
    run = run_mod.start(script, workers=1, runs_dir=tmp_path / "runs", where=UNPINNED)
    run.wait(timeout=60)
    with pytest.raises(DdlkitError, match="ResumeReporter"):
        faults.resume_points(run)


# -- ResumeReporter, in-process with a real model and BackupAndRestore ------------------------


class _Interrupt(Exception):
    pass


def _tiny_fit(backup_dir, epochs, sink, stop_at=None, save_freq="epoch", order=1):
    """Fit 4 steps an epoch with BackupAndRestore and a ResumeReporter; ``stop_at`` (epoch,
    batch) interrupts there, as a crash would. ``order`` -1 puts the reporter first."""
    import numpy as np

    from ddlkit import backend

    keras = backend.keras()
    tf = backend.tf()
    tf.keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    backup = keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=save_freq)
    reporter = faults.ResumeReporter(backup, batch_size=8, run_dir=backup_dir.parent, sink=sink)

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == stop_at:
                raise _Interrupt(stop_at)

    callbacks = [backup, reporter][::order] + [Stop()]
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks)
    return reporter


def _events(records, name):
    return [r.info for r in records if r.kind == "event" and r.name == name]


@pytest.mark.slow
def test_resume_reporter_reports_backups_and_the_epoch_it_resumed_from(tmp_path):
    first: list = []
    with pytest.raises(_Interrupt):
        _tiny_fit(tmp_path / "backup", 5, first.append, stop_at=(3, 0))
    assert _events(first, "resume") == [
        {"initial_epoch": 0, "restored_epoch": -1, "restored_batch": -1}
    ]
    assert [(e["epoch"], e["batch"]) for e in _events(first, "backup")] == [
        (0, -1),
        (1, -1),
        (2, -1),
    ]
    saved = faults.last_backup(tmp_path / "backup")
    assert (saved.epoch, saved.checkpoint) == (2, _events(first, "backup")[-1]["checkpoint"])

    second: list = []
    again = _tiny_fit(tmp_path / "backup", 5, second.append)
    assert _events(second, "resume") == [
        {"initial_epoch": 3, "restored_epoch": 2, "restored_batch": -1}
    ]
    assert again.initial_epoch == 3 and again.restored_epoch == 2
    epochs = [r for r in second if r.kind == "epoch"]
    assert [r.epoch for r in epochs] == [3, 4], "it ran the epochs after the backup, no more"
    assert epochs[0].step == 4 * 4, "steps go on from 3 epochs of 4 steps"
    assert not (tmp_path / "backup" / "chief").exists(), "a finished fit deletes its backup"
    assert faults.last_backup(tmp_path / "backup") is None


@pytest.mark.slow
def test_resume_reporter_sees_backups_every_n_steps_and_the_batch_resumed_after(tmp_path):
    first: list = []
    with pytest.raises(_Interrupt):
        _tiny_fit(tmp_path / "backup", 3, first.append, stop_at=(1, 3), save_freq=3)
    # BackupAndRestore counts batches across epochs: after batches 3 and 6 of 4 an epoch
    assert [(e["epoch"], e["batch"]) for e in _events(first, "backup")] == [(0, 2), (1, 1)]
    saved = faults.last_backup(tmp_path / "backup")
    assert (saved.epoch, saved.batch) == (1, 1)

    second: list = []
    _tiny_fit(tmp_path / "backup", 3, second.append, save_freq=3)
    assert _events(second, "resume") == [
        {"initial_epoch": 1, "restored_epoch": 1, "restored_batch": 1}
    ], "the same epoch, from the batch after the backup"


@pytest.mark.slow
def test_resume_reporter_out_of_order_or_without_its_callback_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="BackupAndRestore callback it reports on"):
        faults.ResumeReporter(batch_size=8, run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"\*after\* its BackupAndRestore"):
        _tiny_fit(tmp_path / "backup", 2, [].append, order=-1)


def test_importing_faults_loads_no_tensorflow():
    import subprocess

    code = "import ddlkit.lessons.faults, sys; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
