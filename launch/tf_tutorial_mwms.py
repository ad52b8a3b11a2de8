"""A plain MultiWorkerMirroredStrategy script in the style of TensorFlow's
multi-worker Keras tutorial: it knows nothing of ddlkit and reads only TF_CONFIG.

It is here to show that ``ddlkit launch`` runs such scripts unchanged:
    ddlkit launch --strategy multi_worker -n 2 launch/tf_tutorial_mwms.py

and by hand, one shell per worker (index 0 and 1), without ddlkit:
    TF_USE_LEGACY_KERAS=1 TF_CONFIG='{"cluster": {"worker": ["localhost:12345",
        "localhost:12346"]}, "task": {"type": "worker", "index": 0}}' \
        .venv/bin/python launch/tf_tutorial_mwms.py

(It trains on random data, like a smoke test, so it needs no data set.)
``tf.keras`` must be tf-keras (TF_USE_LEGACY_KERAS=1 before TensorFlow loads; the
launcher sets it): on TensorFlow 2.21 ``tf.keras`` is otherwise Keras 3, whose ``fit``
fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
"""

import json
import os

import numpy as np
import tensorflow as tf


def dataset(global_batch_size):
    rng = np.random.default_rng(0)
    x = rng.random((2048, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, size=2048)
    return (
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).repeat().batch(global_batch_size)
    )


def build_and_compile_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=["accuracy"],
    )
    return model


def main():
    tf_config = json.loads(os.environ["TF_CONFIG"])
    # The tutorial's count: right for a cluster of workers only. With a "chief" task too
    # (some launchers write one) it misses the chief: strategy.num_replicas_in_sync does not.
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch_size = 64 * num_workers
    multi_worker_dataset = dataset(global_batch_size)
    with strategy.scope():
        multi_worker_model = build_and_compile_model()
    history = multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=5)
    print("final loss", history.history["loss"][-1])


if __name__ == "__main__":
    main()
