"""Horovod's custom-loop API on Keras 3 (and, unchanged, on tf-keras).

Horovod 0.28.1 knows ``tf.Variable`` only. Keras 3 models hold
``keras.Variable`` objects that wrap one (``v.value``), so
``hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)``
fails with "'Variable' object has no attribute 'ref'", and so does
``hvd.broadcast_variables(model.variables, 0)``. The same calls work when given
the underlying ``tf.Variable`` objects; these wrappers do that::

    with tf.GradientTape() as t:
        loss = loss_fn(y, model(x, training=True))
    tape = ddlkit.horovod.DistributedGradientTape(t)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    ddlkit.horovod.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

On tf-keras the variables already are ``tf.Variable`` objects and pass through.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ddlkit.errors import ConfigError


def tf_variables(variables: Iterable[Any]) -> list:
    """``variables`` as ``tf.Variable`` objects: Keras 3 variables give their ``.value``."""
    import tensorflow as tf

    out = []
    for v in variables:
        if isinstance(v, tf.Variable):
            out.append(v)
            continue
        inner = getattr(v, "value", None)
        if not isinstance(inner, tf.Variable):
            raise ConfigError(
                f"{getattr(v, 'path', None) or getattr(v, 'name', type(v).__name__)!r} is a "
                f"{type(v).__name__}, neither a tf.Variable nor a Keras variable wrapping one. "
                f"Fix: pass model.trainable_variables (or model.variables)."
            )
        out.append(inner)
    return out


class DistributedGradientTape:
    """``hvd.DistributedGradientTape`` that accepts Keras 3 variables as sources.

    ``kwargs`` go to Horovod's tape (``compression``, ``op``, ``sparse_as_dense``, ...).
    """

    def __init__(self, tape: Any, **kwargs: Any) -> None:
        import horovod.tensorflow as hvd

        self.tape = hvd.DistributedGradientTape(tape, **kwargs)

    def gradient(self, target: Any, sources: Iterable[Any], output_gradients: Any = None) -> list:
        """Gradients of ``target``, averaged (allreduced) over all ranks."""
        return self.tape.gradient(target, tf_variables(sources), output_gradients)


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s values of ``variables`` (Keras 3 or tf-keras)."""
    import horovod.tensorflow as hvd

    hvd.broadcast_variables(tf_variables(variables), root_rank=root_rank)
