"""Data where Spark holds it: MNIST as a Parquet table, and a partition's rows as arrays.

- :func:`mnist_dataframe` / :func:`write_mnist_parquet`: MNIST's training images as a Spark
  DataFrame (``label INT, image BINARY``: 784 raw bytes) written as Parquet, one file per
  partition;
- :func:`to_arrays`: a partition's rows as Keras arrays, decoded on the executor that holds
  them (notebook 10's barrier stage; ``launch/spark/train_on_spark.py`` does the same for
  ``spark-submit``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

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
