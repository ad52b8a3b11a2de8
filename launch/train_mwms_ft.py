"""MultiWorkerMirroredStrategy with fault tolerance and chief-only files.

launch/train_multi_worker.py plus three optional directories (absolute paths:
each worker runs in its own working directory):

- ``--backup-dir``: ``tf.keras.callbacks.BackupAndRestore`` backs training up
  after every epoch; a relaunch with the same directory resumes from the
  epoch after the last backup. The directory must outlive the run and be the
  same storage for every worker: the chief writes ``<dir>/chief`` and every
  worker restores from it (on several hosts: a shared file system or a bucket).
- ``--checkpoint-dir``: the trained model's checkpoint, saved once at the end.
- ``--tensorboard-dir``: TensorBoard logs.

Every worker saves (a save may need all of them), but only the chief writes
into these directories. tf-keras' callbacks (BackupAndRestore, TensorBoard)
apply that rule themselves; for the checkpoint the script does: the others
write into a temporary directory next to it and delete it (TensorFlow's rule;
``ddlkit.lessons.faults.write_dir``). The chief is TensorFlow's: the ``chief`` task,
else worker 0 (``ddlkit.lessons.faults.is_chief``). The result reports the epoch
training started from (``initial_epoch``).

Lines that exist only for distribution end with ``# [dist]``.

Launch:
    ddlkit launch --strategy multi_worker -n 2 launch/train_mwms_ft.py -- \\
        --epochs 5 --steps-per-epoch 30 --backup-dir /tmp/backup
    ddlkit launch --strategy multi_worker -n 2 launch/train_mwms_ft.py -- \\
        --checkpoint-dir /tmp/ckpt --tensorboard-dir /tmp/tb

By hand, one shell per worker (TF_CONFIG differs only in the task index):
    export TF_USE_LEGACY_KERAS=1
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                "task": {"type": "worker", "index": 0}}' \\
        python launch/train_mwms_ft.py --backup-dir /tmp/backup
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                "task": {"type": "worker", "index": 1}}' \\
        python launch/train_mwms_ft.py --backup-dir /tmp/backup
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

# isort: split
import tensorflow as tf
from _common import parse_args, report, test_accuracy

from ddlkit import data, metrics, models
from ddlkit.data import pipeline
from ddlkit.lessons import faults


def absolute_dir(value: str) -> str:
    if not os.path.isabs(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is a relative path, and each worker runs in its own working "
            f"directory, so every worker would use a different directory. Fix: pass an "
            f"absolute path, e.g. {os.path.abspath(value)}"
        )
    return value


def tensorboard_dir(value: str) -> str:
    if importlib.util.find_spec("tensorboard") is None:
        raise argparse.ArgumentTypeError(
            "TensorBoard is not installed, and tf.keras.callbacks.TensorBoard needs it "
            "(TensorFlow 2.21 does not install it). Fix: pip install tensorboard==2.21.0, "
            "or leave out --tensorboard-dir."
        )
    return absolute_dir(value)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--backup-dir", type=absolute_dir, help="BackupAndRestore's directory")
    add("--checkpoint-dir", type=absolute_dir, help="the final model checkpoint")
    add("--tensorboard-dir", type=tensorboard_dir, help="TensorBoard logs")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, extra=add_flags)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # [dist] reads TF_CONFIG
    task_type = strategy.cluster_resolver.task_type  # [dist] "chief"/"worker" (None: no cluster)
    task_id = strategy.cluster_resolver.task_id  # [dist] 0, 1, ...
    replicas = strategy.num_replicas_in_sync  # [dist]
    cluster = strategy.cluster_resolver.cluster_spec().as_dict()  # [dist] every task's address
    task = (task_type, task_id, cluster)  # [dist] who this is, for the chief-only files
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", [])) or 1  # [dist]
    global_batch = args.batch_size * replicas  # [dist] per-replica batch x replicas
    (x_train, y_train), (x_test, y_test) = data.load(args.dataset)
    train = pipeline.for_strategy(  # [dist] each worker reads its own shard
        strategy, x_train, y_train, per_replica_batch=args.batch_size, repeat=True
    )
    steps = args.steps_per_epoch or pipeline.steps_per_epoch(len(x_train), global_batch)
    with strategy.scope():  # [dist] variables are mirrored on every replica
        model = models.for_dataset(args.dataset, seed=args.seed)
        # [dist] lr linear in the batch: the rule for SGD, a heuristic for this Adam
        models.compile_classifier(model, args.lr * replicas)  # [dist]
    reporter = metrics.KerasReporter(batch_size=global_batch // workers)
    callbacks = []
    if args.backup_dir:
        # Restores the last backup at the start (every worker, from backup_dir/chief), backs
        # up after every epoch (the chief into backup_dir/chief, the others into a temp dir
        # they delete), deletes it when done.
        backup = tf.keras.callbacks.BackupAndRestore(args.backup_dir)
        callbacks.append(backup)
        reporter = faults.ResumeReporter(backup, batch_size=global_batch // workers)  # after it
    callbacks.append(reporter)
    if args.tensorboard_dir:  # the real directory: TensorBoard writes on the chief only itself
        callbacks.append(tf.keras.callbacks.TensorBoard(args.tensorboard_dir, profile_batch=0))
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    if args.checkpoint_dir:
        ckpt_dir = faults.write_dir(args.checkpoint_dir, *task)  # [dist] others: a temp dir
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        tf.train.CheckpointManager(checkpoint, str(ckpt_dir), max_to_keep=1).save()
        faults.remove_write_dir(args.checkpoint_dir, *task)  # [dist]
    accuracy, tested = test_accuracy(model, args, x_test, y_test)  # --test-examples
    initial_epoch = getattr(reporter, "initial_epoch", 0)  # after a restore: last backup + 1
    examples = (args.epochs - initial_epoch) * steps * global_batch
    report(
        {
            "test_accuracy": accuracy,
            "test_examples": tested,
            "train_seconds": seconds,
            "examples_per_sec": examples / seconds,  # all workers together
            "replicas": replicas,
            "dataset": args.dataset,
            "epochs": args.epochs,
            "steps": (args.epochs - initial_epoch) * steps,  # in this launch
            "global_batch": global_batch,
            "initial_epoch": initial_epoch,
            "restored_epoch": getattr(reporter, "restored_epoch", None),
            "chief": faults.is_chief(*task),
            "should_checkpoint": strategy.extended.should_checkpoint,  # TensorFlow's answer
            "write_dirs": {  # where this worker wrote the files meant for the checkpoint
                "checkpoint_dir": str(faults.write_dir(args.checkpoint_dir, *task))
            }
            if args.checkpoint_dir
            else {},
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
