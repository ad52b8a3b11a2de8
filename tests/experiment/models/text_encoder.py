"""A small Transformer encoder on the kit's synthetic reviews: a model the kit does not ship.

Two inputs (word ids and a padding mask), an embedding, one self-attention block, compiled
with its own loss and metrics. Used by the experiment's tests as a user's file.
"""

import numpy as np
import tensorflow as tf

from ddlkit.data import text

LENGTH, WIDTH = 32, 32


def _corpus(n, seed):
    texts, labels = text.reviews(n, length=LENGTH, seed=seed)
    ids, _ = text.encode(texts, text.vocabulary())
    return ids.astype("int32"), np.asarray(labels, "int32")


def build_model():
    ids = tf.keras.Input((LENGTH,), dtype="int32", name="ids")
    mask = tf.keras.Input((LENGTH,), dtype="float32", name="mask")
    x = tf.keras.layers.Embedding(len(text.vocabulary()) + 2, WIDTH)(ids)
    attended = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=WIDTH // 2)(x, x)
    x = tf.keras.layers.LayerNormalization()(x + attended)
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(x) * mask[..., None]
    pooled = tf.reduce_sum(x, axis=1) / tf.reduce_sum(mask, axis=1, keepdims=True)
    out = tf.keras.layers.Dense(2)(pooled)
    model = tf.keras.Model({"ids": ids, "mask": mask}, out)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _pipeline(ids, labels, batch_size):
    features = {"ids": ids, "mask": (ids > 0).astype("float32")}
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        batch_size, drop_remainder=True
    )


def dataset(batch_size, input_context=None):
    ids, labels = _corpus(2048, seed=0)
    ds = _pipeline(ids, labels, batch_size)
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds


def eval_dataset(batch_size):
    ids, labels = _corpus(256, seed=1)
    return _pipeline(ids, labels, batch_size)
