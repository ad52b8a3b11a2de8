"""Broken user files, one per function pair: the experiment's checks must name each."""

import numpy as np
import tensorflow as tf


def _data(n=64, shape=(8,)):
    x = np.zeros((n, *shape), "float32")
    y = np.zeros((n,), "int32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def good_model():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def good_data(batch_size, input_context=None):
    return _data().batch(batch_size, drop_remainder=True)


def raises():
    raise RuntimeError("no GPU named A100 here")


def not_a_model():
    return "a model"


def uncompiled():
    return tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])


def summed_loss():
    model = uncompiled()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    model.compile("sgd", loss)
    return model


def arrays(batch_size, input_context=None):
    return np.zeros((batch_size, 8))


def unbatched(batch_size, input_context=None):
    return _data()


def wrong_shape(batch_size, input_context=None):
    return _data(shape=(5,)).batch(batch_size, drop_remainder=True)


def features_only(batch_size, input_context=None):
    return tf.data.Dataset.from_tensor_slices(np.zeros((64, 8), "float32")).batch(batch_size)
