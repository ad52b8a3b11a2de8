"""A small CNN under Keras' mixed_float16 policy, on random images (a user's file for tests)."""

import numpy as np
import tensorflow as tf


def build_model():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    inputs = tf.keras.Input((16, 16, 3))
    x = tf.keras.layers.Conv2D(8, 3, name="conv")(inputs)  # 14x14x8 outputs
    x = tf.keras.layers.Flatten()(x)
    x = tf.keras.layers.Dense(10, name="dense")(x)
    outputs = tf.keras.layers.Activation("linear", dtype="float32")(x)
    model = tf.keras.Model(inputs, outputs)
    model.compile(
        optimizer="sgd",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def dataset(batch_size, input_context=None):
    rng = np.random.default_rng(0)
    x = rng.random((256, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, 256).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)
