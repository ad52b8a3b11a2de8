"""An uncompiled model with an embedding: the experiment is given its loss and optimizer."""

import numpy as np
import tensorflow as tf


def make_net():
    return tf.keras.Sequential(
        [
            tf.keras.Input((12,), dtype="int32"),
            tf.keras.layers.Embedding(50, 4),
            tf.keras.layers.GlobalAveragePooling1D(),
            tf.keras.layers.Dense(3),
        ]
    )


def make_data(batch_size, input_context=None):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 50, (128, 12)).astype("int32")
    y = rng.integers(0, 3, 128).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)
