"""Data where Spark holds it: MNIST as a Parquet table, and training on each task's own rows.

- :func:`mnist_dataframe` / :func:`write_mnist_parquet`: MNIST's training images as a Spark
  DataFrame (``label INT, image BINARY``: 784 raw bytes) written as Parquet, one file per
  partition;
- :func:`train_task`: the function of ``df.rdd.barrier().mapPartitions(...)``. Each task
  decodes only the rows of its own partition (on its executor: nothing is collected to
  the driver), builds TF_CONFIG from its barrier context and trains with
  MultiWorkerMirroredStrategy on its rows, returning one report per task.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

import numpy as np

SCHEMA = "label INT, image BINARY"
IMAGE_SHAPE = (28, 28, 1)


def mnist_dataframe(spark, examples: int | None = None):
    """MNIST's first ``examples`` training images (all: None) as a DataFrame."""
    from ddlkit import data

    (x, y), _ = data.load("mnist")
    n = len(x) if examples is None else min(examples, len(x))
    rows = [(int(y[i]), x[i].tobytes()) for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA)


def write_mnist_parquet(spark, path: str | os.PathLike, examples=None, partitions: int = 2):
    """Write MNIST as Parquet with ``partitions`` files; returns the path as a string."""
    path = str(path)
    mnist_dataframe(spark, examples).repartition(partitions).write.mode("overwrite").parquet(path)
    return path


def to_arrays(rows: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """Rows of :data:`SCHEMA` as Keras arrays: images ``(n, 28, 28, 1)`` in [0, 1], labels."""
    labels, images = [], []
    for row in rows:
        labels.append(row["label"])
        images.append(np.frombuffer(row["image"], dtype=np.uint8))
    if not images:
        return np.zeros((0, *IMAGE_SHAPE), np.float32), np.zeros((0,), np.int64)
    x = np.stack(images).reshape(-1, *IMAGE_SHAPE).astype(np.float32) / 255.0
    return x, np.asarray(labels, dtype=np.int64)


def train_task(steps: int = 5, batch: int = 32, lr: float = 1e-3, seed: int = 0):
    """The barrier stage's function: MWMS on this task's own partition (see module doc)."""

    def task(rows: Iterable) -> Iterator[str]:
        from ddlkit import contract
        from ddlkit.environments.spark import from_barrier_context

        os.environ.update(contract.thread_env(1))
        x, y = to_arrays(rows)  # this task's partition, read on its executor
        spark = from_barrier_context()  # every task's address, through allGather
        os.environ[contract.TF_CONFIG_VAR] = json.dumps(spark.tf_config())

        import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

        # isort: split
        import tensorflow as tf

        from ddlkit import models

        strategy = tf.distribute.MultiWorkerMirroredStrategy()

        def dataset(ctx):  # no sharding: this worker's rows are already its own
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed)
            return ds.repeat().batch(batch)

        with strategy.scope():
            model = models.mnist_cnn(seed=seed)
            models.compile_classifier(model, lr * strategy.num_replicas_in_sync)
        data = strategy.distribute_datasets_from_function(dataset)
        history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        total = tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in model.weights])
        yield json.dumps(
            {
                "task": spark.rank,
                "host": spark.host,
                "examples": len(x),
                "labels": np.bincount(y, minlength=10).tolist(),
                "loss": float(history.history["loss"][-1]),
                "weights_checksum": float(total.numpy()),
            }
        )

    return task


def train_on_partitions(df, workers: int, **kwargs) -> list[dict]:
    """Run :func:`train_task` as a barrier stage over ``df``'s rows in ``workers`` partitions."""
    rdd = df.repartition(workers).rdd  # a shuffle between executors, not via the driver
    return [json.loads(r) for r in rdd.barrier().mapPartitions(train_task(**kwargs)).collect()]
