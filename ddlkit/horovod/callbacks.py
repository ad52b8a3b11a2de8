"""Horovod's Keras callbacks that break on current Keras, redone for tf-keras and Keras 3.

A stock Horovod 0.28.1 calls ``keras.backend`` functions through the standalone ``keras``
package, which is Keras 3 on TensorFlow 2.21 and has none of them:
``hvd.callbacks.MetricAverageCallback`` fails with "module 'keras.backend' has no
attribute 'constant'" and ``LearningRateWarmupCallback`` with "... no attribute
'get_value'". The kit's Horovod build takes the backend from ``tf.keras`` instead
(scripts/patch_horovod.py): on tf-keras both of Horovod's callbacks then work (notebook 05's
script uses them). Horovod's warm-up with tf-keras' SGD needs ``momentum_correction=False``:
its default correction sets ``optimizer.momentum`` with ``backend.set_value``, and tf-keras
2.21's SGD keeps its momentum as a Python float ("'float' object has no attribute
'dtype'"). On Keras 3 both fail. (``BroadcastGlobalVariablesCallback`` and
``DistributedOptimizer`` work.) These work on tf-keras and Keras 3 alike:

- :func:`MetricAverageCallback` averages the epoch's metrics over ranks with one
  ``horovod.tensorflow.allreduce``, in place, so every rank (and every callback after
  this one, such as ``ddlkit.metrics.KerasReporter`` and Keras' History) sees the
  mean. Put it before them. Every rank must log the same metric names (they do when
  every rank runs the same ``fit``).
- :func:`LearningRateWarmupCallback` ramps the learning rate from ``lr / size`` up to
  ``lr`` over the first epochs (Goyal et al. 2017), as Horovod's does, with Horovod's
  momentum correction (Goyal et al., section 2.1): for each warm-up batch the momentum is
  scaled by the new rate over the old, then restored. That needs a momentum the optimizer
  reads at every step: a variable (tf-keras' ``SGD(lr, momentum=tf.Variable(0.9))``) or a
  legacy optimizer's hyperparameter. A momentum kept as a Python float (tf-keras' and
  Keras 3's SGD by default) is read once, when the training step is traced, so the
  callback refuses it unless ``momentum_correction=False``::

    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
               ddlkit.horovod.LearningRateWarmupCallback(lr * size, warmup_epochs=1,
                                                         steps_per_epoch=steps, size=size),
               ddlkit.horovod.MetricAverageCallback(),
               ddlkit.metrics.KerasReporter(batch_size=...)]
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddlkit import backend
from ddlkit.errors import ConfigError

AllreduceFn = Callable[[Sequence[float]], Sequence[float]]
ALLREDUCE_NAME = "ddlkit.metric_average"


def metric_names_code(names: Sequence[str]) -> float:
    """A number that differs between different lists of metric names (CRC-32, exact in fp64)."""
    return float(zlib.crc32("\n".join(names).encode()))


def average_logs(logs: Mapping[str, Any], allreduce: AllreduceFn) -> dict[str, float]:
    """The numeric entries of ``logs`` averaged by ``allreduce`` (one call, keys sorted).

    ``allreduce`` takes the values in sorted-key order, followed by a code of the key
    names (:func:`metric_names_code`), and returns their means over ranks. The code
    comes back unchanged only if every rank averaged the same names; otherwise the
    numbers mean nothing and this raises. Entries that are not scalars are left out.
    """
    keys, values = [], []
    for key in sorted(logs):
        try:
            number = float(logs[key])
        except (TypeError, ValueError):
            continue
        keys.append(key)
        values.append(number)
    if not keys:
        return {}
    code = metric_names_code(keys)
    averaged = list(allreduce([*values, code]))
    if len(averaged) != len(keys) + 1 or averaged[-1] != code:
        raise ConfigError(
            f"the ranks logged different metrics at this epoch end (this rank: "
            f"{', '.join(keys)}), so their averages would mix different numbers. Fix: run "
            f"the same fit (same metrics, same validation) on every rank."
        )
    return {k: float(v) for k, v in zip(keys, averaged, strict=False)}


def horovod_average(values: Sequence[float]) -> list[float]:
    """The mean of ``values`` over all Horovod ranks (one allreduce, float64)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tensor = tf.constant([float(v) for v in values], dtype=tf.float64)
    out = hvd.allreduce(tensor, op=hvd.Average, name=ALLREDUCE_NAME)
    return [float(v) for v in out.numpy()]


class _MetricAverageMixin:
    """Averages the epoch's logs over ranks, in place, at every epoch end."""

    def __init__(self, allreduce: AllreduceFn | None = None) -> None:
        super().__init__()
        self.allreduce = allreduce or horovod_average
        self.last: dict[str, float] = {}

    def on_epoch_end(self, epoch, logs=None) -> None:
        if logs is None:
            return
        self.last = average_logs(logs, self.allreduce)
        logs.update(self.last)


def warmup_lr(epoch: float, target_lr: float, size: int, warmup_epochs: float) -> float:
    """The learning rate at (fractional) ``epoch`` of a linear warm-up (pure).

    From ``target_lr / size`` at epoch 0 to ``target_lr`` at ``warmup_epochs``, then
    ``target_lr``: the one-rank rate grows to the rate scaled for ``size`` ranks.
    """
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return target_lr
    return target_lr / size * (epoch * (size - 1) / warmup_epochs + 1)


class _WarmupMixin:
    """Sets the optimizer's learning rate before every batch of the warm-up epochs."""

    def __init__(
        self,
        target_lr: float,
        *,
        warmup_epochs: float,
        steps_per_epoch: int,
        size: int,
        momentum_correction: bool = True,
    ) -> None:
        super().__init__()
        if not (isinstance(steps_per_epoch, int) and steps_per_epoch >= 1):
            raise ConfigError(
                f"steps_per_epoch must be an int >= 1, got {steps_per_epoch!r}. Fix: pass the "
                f"steps_per_epoch you give model.fit."
            )
        if not (isinstance(size, int) and size >= 1) or warmup_epochs < 0 or target_lr <= 0:
            raise ConfigError(
                f"warm-up needs size >= 1, warmup_epochs >= 0 and target_lr > 0, got size="
                f"{size!r}, warmup_epochs={warmup_epochs!r}, target_lr={target_lr!r}. "
                f"Fix: e.g. target_lr=lr * hvd.size(), warmup_epochs=1, size=hvd.size()."
            )
        self.target_lr = float(target_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.steps_per_epoch = steps_per_epoch
        self.size = size
        self.momentum_correction = bool(momentum_correction)
        self.epoch = 0
        self.history: list[float] = []  # the rate of every warm-up batch, for plots and tests
        self._restore_momentum: float | None = None

    def on_train_begin(self, logs=None) -> None:
        optimizer = self.model.optimizer
        if not self.momentum_correction or self.warmup_epochs <= 0:
            return
        if _momentum_kind(optimizer) == "fixed":
            raise ConfigError(
                f"{type(optimizer).__name__}'s momentum {optimizer.momentum!r} is a Python "
                f"number, which the optimizer reads once, when its training step is traced: "
                f"the warm-up's momentum correction cannot change it. Fix: pass "
                f"momentum_correction=False, or give the optimizer a momentum variable "
                f"(tf-keras: SGD(lr, momentum=tf.Variable(0.9)))."
            )

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = int(epoch)

    def on_train_batch_begin(self, batch, logs=None) -> None:
        epoch = self.epoch + batch / self.steps_per_epoch
        if epoch >= self.warmup_epochs:
            return
        optimizer = self.model.optimizer
        old = float(_value(optimizer.learning_rate))
        lr = warmup_lr(epoch, self.target_lr, self.size, self.warmup_epochs)
        optimizer.learning_rate = lr
        self.history.append(lr)
        if self.momentum_correction and old > 0 and _momentum_kind(optimizer) == "settable":
            # Goyal et al. 2017, section 2.1, as Horovod does: this batch's momentum scaled
            # by the new rate over the old, restored after the batch
            self._restore_momentum = float(_value(optimizer.momentum))
            _set_momentum(optimizer, self._restore_momentum * lr / old)

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._restore_momentum is not None:
            _set_momentum(self.model.optimizer, self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch, logs=None) -> None:
        if self.epoch + 1 >= self.warmup_epochs:
            self.model.optimizer.learning_rate = self.target_lr
        if logs is not None:
            logs["lr"] = float(_value(self.model.optimizer.learning_rate))


def _momentum_kind(optimizer: Any) -> str:
    """``"none"`` (no momentum, or 0), ``"settable"`` (a variable, or a legacy optimizer's
    hyperparameter, read at every step) or ``"fixed"`` (a Python number, read when traced)."""
    momentum = getattr(optimizer, "momentum", None)
    if momentum is None:
        return "none"
    if hasattr(momentum, "assign") or hasattr(optimizer, "_set_hyper"):
        return "settable"
    return "fixed" if float(momentum) != 0.0 else "none"


def _set_momentum(optimizer: Any, value: float) -> None:
    momentum = optimizer.momentum
    if hasattr(momentum, "assign"):
        momentum.assign(value)
    else:  # a legacy optimizer: its setter assigns the hyperparameter's variable
        optimizer.momentum = value


def _value(variable: Any) -> Any:
    return variable.numpy() if hasattr(variable, "numpy") else variable


_CLASSES: dict[tuple[type, type], type] = {}


def _callback_class(mixin: type, name: str) -> type:
    base = backend.keras().callbacks.Callback
    if (mixin, base) not in _CLASSES:
        _CLASSES[mixin, base] = type(
            name,
            (mixin, base),
            {"__module__": __name__, "__doc__": mixin.__doc__},
        )
    return _CLASSES[mixin, base]


def MetricAverageCallback(allreduce: AllreduceFn | None = None):  # noqa: N802 (a class to users)
    """A Keras callback averaging epoch metrics over Horovod ranks (tf-keras or Keras 3).

    ``allreduce``: how to average a list of floats over ranks (default: Horovod's
    allreduce with ``op=Average``); tests pass their own.
    """
    return _callback_class(_MetricAverageMixin, "MetricAverageCallback")(allreduce)


def LearningRateWarmupCallback(  # noqa: N802 (a class to users)
    target_lr: float,
    *,
    warmup_epochs: float = 1.0,
    steps_per_epoch: int,
    size: int,
    momentum_correction: bool = True,
):
    """A Keras callback warming the learning rate up to ``target_lr`` (see :func:`warmup_lr`).

    ``target_lr``: the rate scaled for all ranks (``lr * hvd.size()``); ``size``: ranks.
    ``momentum_correction``: scale the momentum with each warm-up batch's change of rate,
    as Horovod's callback does by default (see the module docstring for which optimizers
    allow it). At the end of each epoch it logs ``lr``.
    """
    return _callback_class(_WarmupMixin, "LearningRateWarmupCallback")(
        target_lr,
        warmup_epochs=warmup_epochs,
        steps_per_epoch=steps_per_epoch,
        size=size,
        momentum_correction=momentum_correction,
    )
