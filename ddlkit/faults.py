"""Fault tolerance and chief-only files for multi-worker training.

Two halves, joined by two metric events (names below):

- **Worker side.** :func:`write_dir` / :func:`remove_write_dir` are TensorFlow's
  documented rule for files in multi-worker training: every worker saves (a save
  may need all of them), the chief into the real directory, the others into a
  temporary directory that they delete afterwards. :class:`ResumeReporter` is a
  :class:`~ddlkit.metrics.KerasReporter` for training with
  ``tf.keras.callbacks.BackupAndRestore``: it reports the epoch training starts
  from (after a restore: the epoch after the last backed-up one) and every
  backup the chief writes.
- **Notebook side.** :func:`wait_for_backup` blocks (bounded) until a run's chief
  has backed up an epoch, :func:`backups` lists them, :func:`resume_points` says
  where each worker of a relaunch started, :func:`shared_dir` makes a directory
  that outlives one run (a relaunch is a new run), :func:`list_files` shows what
  was written where.

::

    # worker script
    callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir),
                 dk.faults.ResumeReporter(batch_size=64)]     # after BackupAndRestore
    # notebook
    epoch = dk.faults.wait_for_backup(run, epoch=0, timeout=300)
    run.kill("worker-1")
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ddlkit import settings
from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.metrics.waiting import records_of, wait_for

if TYPE_CHECKING:
    from ddlkit.launch import Run

RESUME_EVENT = "resume"  # info: initial_epoch (first epoch run), restored_epoch (-1: none)
BACKUP_EVENT = "backup"  # info: epoch (0-based, just backed up), checkpoint (its path)
TEMP_PREFIX = "workertemp_"


# -- chief-only files (pure, but for remove_write_dir) -----------------------------------------


def is_chief(task_type: str | None, task_id: int | None) -> bool:
    """True for the task that writes the real files: the chief, else worker 0 (pure).

    ``task_type=None`` is a process without a cluster (plain ``python``): it is
    its own chief. Same rule as TensorFlow's multi-worker tutorial.
    """
    if task_type is None or task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0


def write_dir(real_dir: str | os.PathLike, task_type: str | None, task_id: int | None) -> Path:
    """Where this task writes files meant for ``real_dir`` (pure).

    The chief writes into ``real_dir``; any other task into
    ``<parent>/workertemp_<task_id>/<name>``, next to it, so the real
    directory only ever holds the chief's files. TensorFlow's tutorial puts
    the temporary directory in the same place.
    """
    real = Path(real_dir)
    if is_chief(task_type, task_id):
        return real
    if task_id is None or isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ConfigError(
            f"task_id={task_id!r} for a {task_type!r} task: a non-chief task needs its index. "
            f"Fix: pass strategy.cluster_resolver.task_id."
        )
    return real.parent / f"{TEMP_PREFIX}{task_id}" / real.name


def remove_write_dir(
    real_dir: str | os.PathLike, task_type: str | None, task_id: int | None
) -> Path | None:
    """Delete a non-chief's temporary write directory; the path deleted, or None for the chief.

    The ``workertemp_<id>`` parent goes too once nothing else of this task is in it.
    """
    if is_chief(task_type, task_id):
        return None
    temp = write_dir(real_dir, task_type, task_id)
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
    """Where one worker's training started: ``restored_epoch`` -1 means from scratch."""

    worker: str
    restored_epoch: int
    initial_epoch: int

    @property
    def resumed(self) -> bool:
        return self.restored_epoch >= 0


class ResumePoints(tuple):
    """The :class:`ResumePoint` of every worker of a run; a table in a notebook."""

    _HEADERS = ("worker", "restored backup of epoch", "first epoch run")

    def _rows(self) -> list[tuple[object, ...]]:
        return [
            (p.worker, p.restored_epoch if p.resumed else "none", p.initial_epoch) for p in self
        ]

    def _repr_html_(self) -> str:
        return html_table(self._HEADERS, self._rows(), "where each worker started (0-based)")

    def __repr__(self) -> str:
        return text_table(self._HEADERS, self._rows())


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
            ResumePoint(r.worker, int(r.info["restored_epoch"]), int(r.info["initial_epoch"])),
        )
    if not points:
        raise DdlkitError(
            f"run {run.run_id} reported no {RESUME_EVENT!r} event, so where it started is "
            f"unknown. Fix: train with a faults.ResumeReporter placed after BackupAndRestore "
            f"in the callbacks, and ask once training has begun."
        )
    return ResumePoints(points[w] for w in sorted(points))


def wait_for_backup(run: Run, epoch: int = 0, timeout: float = 300.0, poll: float = 0.2) -> int:
    """Block until ``run``'s chief has backed up ``epoch`` or a later one; that epoch.

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
    initial_epoch: int | None = None

    def on_train_begin(self, logs=None) -> None:
        state = getattr(self.model, "_training_state", None)
        if state is None:
            raise ConfigError(
                "ResumeReporter found no BackupAndRestore state on the model. Fix: pass "
                "tf.keras.callbacks.BackupAndRestore(backup_dir) to fit() *before* the "
                "ResumeReporter in the callbacks list (callbacks run in list order)."
            )
        self._state = state
        # BackupAndRestore.on_train_begin has restored the backup (if any) by now:
        # the epoch it holds is the last one finished; fit() goes on with the next.
        self.restored_epoch = int(state._ckpt_saved_epoch.numpy())
        self.initial_epoch = self.restored_epoch + 1  # what fit() will do; checked below
        self._resume_reported = False
        # Only the chief's manager writes the real backup; the others write to a temp dir.
        self._writes_backup = state.write_checkpoint_manager is state.read_checkpoint_manager
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if not self._resume_reported:
            self._resume_reported = True
            self.initial_epoch = int(epoch)
            steps = (self.params or {}).get("steps")
            if isinstance(steps, int) and self.restored_epoch >= 0:
                self._step = max(self._step, int(epoch) * steps)  # steps count on across runs
            self.reporter.event(
                RESUME_EVENT, initial_epoch=int(epoch), restored_epoch=self.restored_epoch
            )
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        super().on_epoch_end(epoch, logs)
        # BackupAndRestore (earlier in the list) has just saved this epoch.
        if self._writes_backup and self._state._save_freq == "epoch":
            path = self._state.write_checkpoint_manager.latest_checkpoint
            self.reporter.event(BACKUP_EVENT, epoch=int(epoch), checkpoint=path)


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

Put it *after* ``tf.keras.callbacks.BackupAndRestore`` in the callbacks. Besides
KerasReporter's records it sends event ``resume`` (``initial_epoch``: the first
epoch this fit runs, ``restored_epoch``: the backed-up epoch it restored, -1 for
none) and, from the chief, event ``backup`` (``epoch``, ``checkpoint``) after
each epoch's backup. After a restore its step count goes on from
``initial_epoch * steps``. Arguments: those of KerasReporter.
"""


def __getattr__(name: str):
    if name == "ResumeReporter":
        return _resume_reporter_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
