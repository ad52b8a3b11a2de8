"""Each Horovod rank on its own GPU: ``gpus[local_rank]``, with memory growth.

``horovodrun`` starts one process per GPU, but every process sees every GPU of its
host, and TensorFlow places its work on the first one: without pinning, all ranks of
a host would share GPU 0. Horovod's recipe, which :func:`pin_gpu` runs::

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

:func:`gpu_for_rank` is the choice as a pure function (tested on pretend GPU lists);
:func:`pin_gpu` makes the TensorFlow calls. On a machine without GPUs nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from ddlkit.errors import ConfigError

Device = TypeVar("Device")


def _name(device: Any) -> str:
    return str(getattr(device, "name", device))


def gpu_for_rank(
    gpus: Sequence[Device], local_rank: int, local_size: int | None = None
) -> Device | None:
    """The GPU local rank ``local_rank`` should see: ``gpus[local_rank]`` (pure).

    None when there are no GPUs (train on the CPU, change nothing). Raises ConfigError
    when this host has fewer GPUs than local ranks (``local_size``, if given, is checked
    first, so every rank of the host stops with the same message).
    """
    if type(local_rank) is not int or local_rank < 0:
        raise ConfigError(f"local_rank={local_rank!r}: must be an int >= 0 (hvd.local_rank()).")
    if local_size is not None and local_rank >= local_size:
        raise ConfigError(
            f"local_rank={local_rank} is not below local_size={local_size}. "
            f"Fix: pass hvd.local_rank() and hvd.local_size()."
        )
    if not gpus:
        return None
    ranks = max(local_size or 0, local_rank + 1)
    if ranks > len(gpus):
        names = [_name(g) for g in gpus]
        raise ConfigError(
            f"{ranks} Horovod ranks on this host but only {len(gpus)} GPU(s) {names}: "
            f"local rank {local_rank} would have no GPU of its own. Fix: start at most "
            f"{len(gpus)} rank(s) per host (horovodrun -np N -H host:{len(gpus)}); or, if "
            f"each rank was already given its own GPU (CUDA_VISIBLE_DEVICES per rank), "
            f"do not pin again (ddlkit.horovod.init(pin_gpu=False))."
        )
    return gpus[local_rank]


def pin_gpu(local_rank: int, local_size: int | None = None, config: Any = None) -> Any | None:
    """Make ``gpus[local_rank]`` this process's only GPU, with memory growth on.

    Returns the GPU made visible, or None on a machine without GPUs (nothing is
    changed). Must run before TensorFlow's first op; otherwise ConfigError with the fix.
    ``config`` is ``tf.config`` (or a stand-in with the same three functions, for tests).
    """
    if config is None:
        import tensorflow as tf

        config = tf.config
    gpus = config.list_physical_devices("GPU")
    chosen = gpu_for_rank(gpus, local_rank, local_size)
    if chosen is None:
        return None
    try:
        for gpu in gpus:
            config.experimental.set_memory_growth(gpu, True)
        config.set_visible_devices(chosen, "GPU")
    except RuntimeError as exc:
        raise ConfigError(
            f"TensorFlow's runtime started before local rank {local_rank} was pinned to "
            f"{_name(chosen)} ({exc}). Fix: call ddlkit.horovod.init() (or the GPU pinning) "
            f"before any TensorFlow op."
        ) from None
    return chosen
