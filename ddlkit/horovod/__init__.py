"""Horovod with ddlkit: per-rank set-up, metric averaging and Keras 3 helpers.

Importing this package is cheap: Horovod and TensorFlow load on first use.

- :func:`init`: ``hvd.init()`` plus naming the rank (``rank-N``) for metrics and
  results, and ending it with ``horovodrun`` (:mod:`ddlkit.horovod.ranks`), and pinning
  the rank to its own cores when the launcher asks (:mod:`ddlkit.horovod.pinning`), and
  to its own GPU, ``gpus[hvd.local_rank()]``, on a host with GPUs.
- :func:`gpu_for_rank`, :func:`pin_gpu`: that GPU choice (pure) and the TensorFlow calls
  (:mod:`ddlkit.horovod.gpus`).
- :func:`MetricAverageCallback`, :func:`LearningRateWarmupCallback`: on tf-keras and
  Keras 3 (Horovod's own fail on Keras 3 and on a stock 0.28.1 build; on the kit's build
  they work on tf-keras, the warm-up with SGD given ``momentum_correction=False``).
- :class:`DistributedGradientTape`, :func:`broadcast_variables`, :func:`tf_variables`:
  Horovod's custom-loop API on Keras 3 variables.
- :func:`allreduce_timing`: allreduce time against tensor size, measured in real ranks.
- :func:`shell_launch`: a collector and the env for a ``!horovodrun`` typed in a cell.
- :func:`load_timeline`: a Horovod timeline file, summed up and drawn.
- :func:`available`, :func:`require`: is Horovod installed (and the fix if not).
"""

from __future__ import annotations

from ddlkit._lazy import lazy_attributes
from ddlkit.horovod.ranks import rank_env, rank_name, rank_of, setup_rank
from ddlkit.horovod.runtime import HorovodMissingError, available, init, require

_LAZY = {
    "MetricAverageCallback": "ddlkit.horovod.callbacks",
    "average_logs": "ddlkit.horovod.callbacks",
    "LearningRateWarmupCallback": "ddlkit.horovod.callbacks",
    "warmup_lr": "ddlkit.horovod.callbacks",
    "DistributedGradientTape": "ddlkit.horovod.tape",
    "broadcast_variables": "ddlkit.horovod.tape",
    "tf_variables": "ddlkit.horovod.tape",
    "allreduce_timing": "ddlkit.horovod.timing",
    "AllreduceTiming": "ddlkit.horovod.timing",
    "load_timeline": "ddlkit.horovod.timeline",
    "Timeline": "ddlkit.horovod.timeline",
    "shell_launch": "ddlkit.horovod.shell",
    "gpu_for_rank": "ddlkit.horovod.gpus",
    "pin_gpu": "ddlkit.horovod.gpus",
}

__all__ = [
    "AllreduceTiming",
    "DistributedGradientTape",
    "HorovodMissingError",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "Timeline",
    "allreduce_timing",
    "available",
    "average_logs",
    "gpu_for_rank",
    "broadcast_variables",
    "init",
    "load_timeline",
    "pin_gpu",
    "rank_env",
    "rank_name",
    "rank_of",
    "require",
    "setup_rank",
    "shell_launch",
    "tf_variables",
    "warmup_lr",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)
