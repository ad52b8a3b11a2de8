"""Fault tolerance and chief-only files for multi-worker training.

One concern: who writes a multi-worker job's files and how a relaunch resumes from them,
seen from the worker and from the notebook. Two halves, joined by two metric events
(names below):

- **Worker side.** :func:`is_chief` is TensorFlow's rule for the task that writes the real
  files; :func:`write_dir` / :func:`remove_write_dir` are TensorFlow's documented rule for
  files in multi-worker training: every worker saves (a save may need all of them), the
  chief into the real directory, the others into a temporary directory that they delete
  afterwards. :class:`ResumeReporter` is a :class:`~ddlkit.metrics.KerasReporter` for
  training with ``tf.keras.callbacks.BackupAndRestore``: it reports the backup each worker
  restored (read from the backup directory with ``tf.train``'s public checkpoint readers,
  :func:`last_backup`) and every backup the chief writes.
- **Notebook side.** :func:`wait_for_backup` blocks (bounded) until a run's chief
  has backed up an epoch, :func:`backups` lists them, :func:`resume_points` says
  where each worker of a relaunch started, :func:`shared_dir` makes a directory
  that outlives one run (a relaunch is a new run), :func:`list_files` shows what
  was written where.

BackupAndRestore writes on the chief only, into ``<backup_dir>/chief``, and **every**
worker restores from there: on several machines ``backup_dir`` must be storage they all
read (a shared file system, a bucket).

::

    # worker script
    backup = tf.keras.callbacks.BackupAndRestore(backup_dir)
    callbacks = [backup, dk.faults.ResumeReporter(backup, batch_size=64)]  # after it
    # notebook
    epoch = dk.faults.wait_for_backup(run, epoch=0, timeout=300)
    run.kill("worker-1")
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlkit import settings
from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.metrics.waiting import records_of, wait_for

if TYPE_CHECKING:
    from ddlkit.launch import Run

RESUME_EVENT = "resume"  # info: initial_epoch (first epoch run), restored_epoch (-1: none),
#                          restored_batch (-1: none; a backup every N steps saves its batch)
BACKUP_EVENT = "backup"  # info: epoch (0-based), batch (-1: at the epoch's end), checkpoint
TEMP_PREFIX = "workertemp_"
# BackupAndRestore's checkpoint: the subdirectory every worker reads, and its counters
BACKUP_SUBDIR = "chief"
SAVED_EPOCH = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"
SAVED_BATCH = "ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE"


# -- chief-only files (pure, but for remove_write_dir) -----------------------------------------


def _jobs(cluster: Any) -> Mapping[str, Any]:
    if hasattr(cluster, "as_dict"):  # a tf.train.ClusterSpec
        cluster = cluster.as_dict()
    if not isinstance(cluster, Mapping):
        raise ConfigError(
            f"cluster={cluster!r}: give every task's address by job, e.g. "
            f"{{'worker': ['host0:port', 'host1:port']}}. Fix: pass "
            f"strategy.cluster_resolver.cluster_spec() (or its .as_dict())."
        )
    return cluster


def is_chief(task_type: str | None, task_id: int | None, cluster: Any) -> bool:
    """True for the task that writes the real files (pure).

    TensorFlow's rule (``multi_worker_util.is_chief``, which MultiWorkerMirroredStrategy
    answers as ``strategy.extended.should_checkpoint`` and tf-keras' callbacks use): the
    ``chief`` task (and an ``evaluator``, which runs alone); without a ``chief`` task in
    ``cluster``, worker 0. ``task_type=None`` is a process without a cluster (plain
    ``python``): it is its own chief. ``cluster``: the jobs and their addresses
    (``strategy.cluster_resolver.cluster_spec()`` or a dict of it).
    """
    jobs = _jobs(cluster)
    if task_type in (None, "chief", "evaluator"):
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in jobs


def write_dir(
    real_dir: str | os.PathLike, task_type: str | None, task_id: int | None, cluster: Any
) -> Path:
    """Where this task writes files meant for ``real_dir`` (pure).

    The chief (:func:`is_chief`) writes into ``real_dir``; any other task into
    ``<parent>/workertemp_<task_id>/<name>``, next to it, so the real directory only ever
    holds the chief's files. TensorFlow's tutorial puts the temporary directory in the
    same place.
    """
    real = Path(real_dir)
    if is_chief(task_type, task_id, cluster):
        return real
    if task_id is None or isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ConfigError(
            f"task_id={task_id!r} for a {task_type!r} task: a non-chief task needs its index. "
            f"Fix: pass strategy.cluster_resolver.task_id."
        )
    return real.parent / f"{TEMP_PREFIX}{task_id}" / real.name


def remove_write_dir(
    real_dir: str | os.PathLike, task_type: str | None, task_id: int | None, cluster: Any
) -> Path | None:
    """Delete a non-chief's temporary write directory; the path deleted, or None for the chief.

    The ``workertemp_<id>`` parent goes too once nothing else of this task is in it.
    """
    if is_chief(task_type, task_id, cluster):
        return None
    temp = write_dir(real_dir, task_type, task_id, cluster)
    shutil.rmtree(temp, ignore_errors=True)
    try:
        temp.parent.rmdir()  # only if empty: another of this task's temp dirs may live there
    except OSError:
        pass
    return temp


def shared_dir(label: str = "shared", root: str | os.PathLike | None = None) -> Path:
    """A new, empty directory for files that outlive one run (backups, checkpoints).

    ``runs/shared/<timestamp>-<label>-<hex>``: a relaunch is a new run with a
    new run directory, so a backup it should restore from must live outside it.
    """
    from ddlkit.launch.runs import new_run_id

    path = Path(root) if root is not None else settings.runs_dir() / "shared"
    path = path / new_run_id(label)
    path.mkdir(parents=True)
    return path


@dataclasses.dataclass(frozen=True)
class FileListing:
    """The files under a directory, with sizes; shows as a table in a notebook."""

    root: Path
    files: tuple[tuple[str, int], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.files]

    def _rows(self) -> list[tuple[str, str]]:
        return [(name, f"{size:,}") for name, size in self.files]

    def _caption(self) -> str:
        exists = "" if self.root.exists() else " (does not exist)"
        return f"{len(self.files)} file(s) under {self.root}{exists}"

    def _repr_html_(self) -> str:
        return html_table(("file", "bytes"), self._rows(), self._caption())

    def __repr__(self) -> str:
        return text_table(("file", "bytes"), self._rows(), self._caption())


def list_files(root: str | os.PathLike) -> FileListing:
    """Every file under ``root`` (relative paths, sorted) and its size; empty if it is absent."""
    root = Path(root)
    files = []
    if root.is_dir():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            files.append((path.relative_to(root).as_posix(), path.stat().st_size))
    return FileListing(root, tuple(files))


# -- reading a run's events ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where one worker's training started: ``restored_epoch`` -1 means from scratch.

    ``restored_batch``: the batch of that epoch the backup was made after, for backups every
    N steps (``BackupAndRestore(save_freq=N)``; -1 for backups at the end of an epoch).
    """

    worker: str
    restored_epoch: int
    initial_epoch: int
    restored_batch: int = -1

    @property
    def resumed(self) -> bool:
        return self.restored_epoch >= 0


class ResumePoints(tuple):
    """The :class:`ResumePoint` of every worker of a run; a table in a notebook."""

    _HEADERS = ("worker", "restored backup of epoch", "after batch", "first epoch run")

    def _rows(self) -> list[tuple[object, ...]]:
        return [
            (
                p.worker,
                p.restored_epoch if p.resumed else "none",
                p.restored_batch if p.resumed and p.restored_batch >= 0 else "",
                p.initial_epoch,
            )
            for p in self
        ]

    def _repr_html_(self) -> str:
        return html_table(self._HEADERS, self._rows(), "where each worker started (0-based)")

    def __repr__(self) -> str:
        return text_table(self._HEADERS, self._rows())


@dataclasses.dataclass(frozen=True)
class Backup:
    """BackupAndRestore's last backup: its checkpoint, and the epoch and batch it was made in.

    ``batch`` is meaningful for backups every N steps (``save_freq=N``): the relaunch goes on
    with the next batch of ``epoch`` (the next epoch after its last batch).
    """

    checkpoint: str
    epoch: int
    batch: int


def last_backup(backup_dir: str | os.PathLike) -> Backup | None:
    """The backup a relaunch with ``BackupAndRestore(backup_dir)`` restores; None if none.

    Read the way every worker reads it, with TensorFlow's public checkpoint readers: the
    latest checkpoint in ``<backup_dir>/chief`` (``tf.train.latest_checkpoint``) and its
    epoch and batch counters (``tf.train.load_variable``). Loads TensorFlow.
    """
    from ddlkit import backend

    tf = backend.tf()
    checkpoint = tf.train.latest_checkpoint(os.path.join(os.fspath(backup_dir), BACKUP_SUBDIR))
    if checkpoint is None:
        return None
    epoch = int(tf.train.load_variable(checkpoint, SAVED_EPOCH))
    batch = int(tf.train.load_variable(checkpoint, SAVED_BATCH))
    return Backup(checkpoint, epoch, batch)


def _records(run: Run) -> list:
    """A run's records: from its collector while it runs, else from its JSONL files
    (:func:`ddlkit.metrics.waiting.records_of`)."""
    return records_of(run)


def _events(records: Sequence, name: str) -> list:
    return [r for r in records if r.kind == "event" and r.name == name]


def backups(run: Run) -> list[int]:
    """The epochs (0-based) whose backup the run's chief has written, in order."""
    return _backups(_records(run))


def _backups(records: Sequence) -> list[int]:
    return [int(r.info["epoch"]) for r in _events(records, BACKUP_EVENT)]


def resume_points(run: Run) -> ResumePoints:
    """Where each worker of ``run`` started training, from its :data:`RESUME_EVENT`."""
    points = {}
    for r in _events(_records(run), RESUME_EVENT):
        points.setdefault(
            r.worker,
            ResumePoint(
                r.worker,
                int(r.info["restored_epoch"]),
                int(r.info["initial_epoch"]),
                int(r.info.get("restored_batch", -1)),
            ),
        )
    if not points:
        raise DdlkitError(
            f"run {run.run_id} reported no {RESUME_EVENT!r} event, so where it started is "
            f"unknown. Fix: train with a faults.ResumeReporter(backup) placed after that "
            f"BackupAndRestore in the callbacks, and ask once training has begun."
        )
    return ResumePoints(points[w] for w in sorted(points))


def wait_for_backup(run: Run, epoch: int = 0, timeout: float = 300.0, poll: float = 0.2) -> int:
    """Block until ``run``'s chief has backed up ``epoch`` or a later one; that epoch.

    With backups every N steps (``save_freq=N``) a backup made during ``epoch`` counts.

    Raises the run's WorkerFailedError if a worker fails first, DdlkitError if the
    run ends without that backup, and JobTimeoutError after ``timeout`` seconds
    (the workers keep running then: ``run.stop()`` ends them).
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ConfigError(f"epoch={epoch!r} must be an int >= 0 (0-based). Fix: e.g. epoch=0.")

    def found(records: Sequence) -> int | None:
        saved = [e for e in _backups(records) if e >= epoch]
        return saved[0] if saved else None

    def ended(records: Sequence) -> str:
        return (
            f"run {run.run_id} ended ({run.job.state}) without backing up epoch {epoch} "
            f"(backups: {_backups(records) or 'none'}). Fix: train for more than {epoch + 1} "
            f"epoch(s), with --backup-dir (BackupAndRestore) and a faults.ResumeReporter."
        )

    def late(records: Sequence) -> str:
        return (
            f"run {run.run_id} has not backed up epoch {epoch} after {timeout} s "
            f"(backups so far: {_backups(records) or 'none'}); its workers are still running. "
            f"Fix: look at run.tail('worker-0'), then wait with a longer timeout, or end "
            f"the run with run.stop()."
        )

    return wait_for(run, found, timeout=timeout, ended=ended, late=late, poll=poll)


# -- the worker-side callback (built on first use: importing this module loads no TF) ------------


class _ResumeMixin:
    """Report the resume point and the chief's backups besides what KerasReporter reports."""

    restored_epoch: int | None = None
    restored_batch: int | None = None
    initial_epoch: int | None = None

    def __init__(self, backup: Any = None, *args: Any, **kwargs: Any) -> None:
        if not (hasattr(backup, "backup_dir") and hasattr(backup, "save_freq")):
            raise ConfigError(
                f"ResumeReporter needs the BackupAndRestore callback it reports on, got "
                f"{backup!r}. Fix: backup = tf.keras.callbacks.BackupAndRestore(backup_dir); "
                f"callbacks=[backup, ResumeReporter(backup, batch_size=...)]"
            )
        self.backup = backup
        super().__init__(*args, **kwargs)

    def on_train_begin(self, logs=None) -> None:
        # What every worker restores (BackupAndRestore.on_train_begin): the shared backup.
        saved = last_backup(self.backup.backup_dir)
        every_steps = self.backup.save_freq != "epoch"
        self.restored_epoch = saved.epoch if saved else -1
        self.restored_batch = saved.batch if saved and every_steps else -1
        self._resume_reported = False
        self._batches = 0
        # TensorFlow's answer to "am I the chief?", the one BackupAndRestore writes by.
        self._writes_backup = bool(self.model.distribute_strategy.extended.should_checkpoint)
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if not self._resume_reported:
            self._resume_reported = True
            self.initial_epoch = int(epoch)
            steps = (self.params or {}).get("steps")
            if isinstance(steps, int) and self.restored_epoch >= 0:
                self._step = max(self._step, int(epoch) * steps)  # steps count on across runs
            self.reporter.event(
                RESUME_EVENT,
                initial_epoch=int(epoch),
                restored_epoch=self.restored_epoch,
                restored_batch=self.restored_batch,
            )
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None) -> None:
        super().on_train_batch_end(batch, logs)
        freq = self.backup.save_freq
        if self._writes_backup and freq != "epoch" and freq:
            self._batches += 1  # counted as BackupAndRestore counts them
            if self._batches >= freq:
                self._batches = 0
                self._report_backup(self._epoch, int(batch))

    def on_epoch_end(self, epoch, logs=None) -> None:
        super().on_epoch_end(epoch, logs)
        if self._writes_backup and self.backup.save_freq == "epoch":
            self._report_backup(int(epoch), -1)

    def _report_backup(self, epoch: int, batch: int) -> None:
        saved = last_backup(self.backup.backup_dir)
        if saved is None or saved.epoch != epoch or (batch >= 0 and saved.batch != batch):
            raise ConfigError(
                f"ResumeReporter: no backup of epoch {epoch} in {self.backup.backup_dir} yet "
                f"(found {saved}). Fix: put the ResumeReporter *after* its BackupAndRestore "
                f"in the callbacks (callbacks run in list order)."
            )
        self.reporter.event(BACKUP_EVENT, epoch=epoch, batch=batch, checkpoint=saved.checkpoint)


_CLASSES: dict[type, type] = {}


def _resume_reporter_class() -> type:
    from ddlkit.metrics import keras_callback

    base = keras_callback._classes()[0]
    if base not in _CLASSES:
        _CLASSES[base] = type(
            "ResumeReporter",
            (_ResumeMixin, base),
            {"__module__": __name__, "__doc__": _RESUME_DOC},
        )
    return _CLASSES[base]


_RESUME_DOC = """A KerasReporter for training with BackupAndRestore.

``ResumeReporter(backup, batch_size=...)``: ``backup`` is the
``tf.keras.callbacks.BackupAndRestore`` it reports on; put it *after* that callback in the
list. Besides KerasReporter's records it sends event ``resume`` (``initial_epoch``: the
first epoch this fit runs; ``restored_epoch``/``restored_batch``: the backup this worker
found in ``<backup_dir>/chief`` and restored, -1 for none) and, from the chief, event
``backup`` (``epoch``, ``batch`` (-1 at an epoch's end), ``checkpoint``) after each backup.
After a restore its step count goes on from ``initial_epoch * steps``. It reads the backup
with ``tf.train``'s public checkpoint readers (:func:`last_backup`). Other arguments: those
of KerasReporter.
"""


def __getattr__(name: str):
    if name == "ResumeReporter":
        return _resume_reporter_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
