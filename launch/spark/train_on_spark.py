"""MNIST from Parquet, trained with MultiWorkerMirroredStrategy as one Spark barrier stage.

A driver program for spark-submit: notebook 10's sections 3, 5 and 6 in one file. Each task
reads only its own partition, builds TF_CONFIG from its barrier context, trains, and returns
its numbers and the last lines of what it printed; the driver prints them. So nothing needs a
disk that the driver and the executors share, except the Parquet data itself (HDFS, S3, an
NFS mount: any path every executor can read).

    spark-submit --master spark://HOST:7077 \\
        --conf spark.dynamicAllocation.enabled=false \\
        --conf spark.task.maxFailures=1 --conf spark.python.worker.reuse=false \\
        --conf spark.cores.max=2 --conf spark.pyspark.python=/opt/venv/bin/python \\
        launch/spark/train_on_spark.py --data hdfs:///data/mnist.parquet --workers 2

- Barrier stages refuse dynamic allocation: this program stops at once if it is on.
- ``spark.task.maxFailures=1``: a task started again alone could not rejoin its peers.
- ``spark.python.worker.reuse=false``: TensorFlow sets up its collectives once per process.
- ``spark.pyspark.python``: a Python with TensorFlow, tf-keras and pyarrow on every executor
  machine (the kit's image has one at /opt/venv/bin/python), or one shipped with the job:
  ``--archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python`` with a packed
  environment (``venv-pack`` or ``conda-pack``, built on the executors' OS and Python).

Exit 0 with one ``RESULT`` line per task, 2 for bad input, 1 when the stage fails.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys


def tf_config(ctx) -> dict:
    """This task's TF_CONFIG: every task's host:port through allGather, index = partition."""
    host = ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
    with socket.socket() as s:
        s.bind((host, 0))  # a port that is free on this host now
        port = s.getsockname()[1]
    workers = ctx.allGather(f"{host}:{port}")
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": ctx.partitionId()}}


def train(steps: int, batch_size: int):
    """The barrier stage's function: MNIST's CNN on this task's rows, with MWMS."""

    def task(rows):
        import io
        from contextlib import redirect_stdout

        import numpy as np
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        labels, images = [], []
        for row in rows:  # this task's partition, read on its executor
            labels.append(row["label"])
            images.append(np.frombuffer(row["image"], dtype=np.uint8))
        x = np.stack(images).reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
        y = np.asarray(labels, dtype=np.int64)
        os.environ["TF_CONFIG"] = json.dumps(tf_config(ctx))
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf-keras, before TensorFlow loads
        printed = io.StringIO()
        with redirect_stdout(printed):  # what the task prints comes back with its result
            import tensorflow as tf

            strategy = tf.distribute.MultiWorkerMirroredStrategy()

            def dataset(input_context):  # no sharding: these rows are this worker's own
                ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
                return ds.repeat().batch(batch_size)

            tf.keras.utils.set_random_seed(0)
            with strategy.scope():
                model = tf.keras.Sequential([
                    tf.keras.Input(shape=(28, 28, 1)),
                    tf.keras.layers.Conv2D(32, 3, activation="relu"),
                    tf.keras.layers.MaxPooling2D(2),
                    tf.keras.layers.Conv2D(64, 3, activation="relu"),
                    tf.keras.layers.MaxPooling2D(2),
                    tf.keras.layers.Flatten(),
                    tf.keras.layers.Dense(128, activation="relu"),
                    tf.keras.layers.Dense(10),
                ])  # fmt: skip
                model.compile(
                    tf.keras.optimizers.Adam(1e-3 * strategy.num_replicas_in_sync),
                    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"],
                )
            data = strategy.distribute_datasets_from_function(dataset)
            history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=2)
        yield json.dumps({
            "task": ctx.partitionId(),
            "host": socket.gethostname(),
            "examples": len(x),
            "loss": history.history["loss"][-1],
            "weights_checksum": sum(float(w.sum()) for w in model.get_weights()),
            "printed": printed.getvalue().splitlines()[-5:],
        })  # fmt: skip

    return task


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="MNIST as Parquet (label INT, image BINARY)")
    parser.add_argument("--workers", type=int, default=2, help="tasks = TensorFlow workers")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("mnist-mwms").getOrCreate()
    try:
        if spark.conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
            print(
                "error: spark.dynamicAllocation.enabled is true, and Spark refuses barrier "
                "stages with it. Fix: spark-submit --conf spark.dynamicAllocation.enabled=false.",
                file=sys.stderr,
            )
            return 2
        rdd = spark.read.parquet(args.data).repartition(args.workers).rdd
        try:
            results = rdd.barrier().mapPartitions(train(args.steps, args.batch_size)).collect()
        except Exception as exc:  # Py4J's error: Spark's reason is in its first lines
            print(f"error: the training stage failed: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 1
        for line in sorted(results):
            print("RESULT", line, flush=True)
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
